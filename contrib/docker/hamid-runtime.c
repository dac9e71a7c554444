/*
 * hamid-runtime: the OCI runtime Docker calls for --runtime=hami. This file is its front door, the
 * program Docker executes for every runtime verb; it decides on its arguments alone and execs:
 *
 * - runc, for every verb but `create`, `run` and `hook` (start, state, kill, delete, features, ...),
 *   with our options dropped and nothing else changed: no file read, no socket, no other program;
 * - hamid-runtime-admit beside its real path (a link, as `make install` makes in /usr/local/bin, is
 *   followed), with its arguments unchanged, for `create`/`run` (a container that may ask for GPUs)
 *   and `hook` (the poststop hook), and for anything it cannot do itself (no runc found, runc that
 *   cannot be executed): that program reports the error where `docker run` shows it.
 *
 *   hamid-runtime [--state-dir DIR] [--runc PATH] [--] <runc globals> <verb> ...
 *
 * Why a program of its own, with no C library: Docker (containerd's shim) runs the runtime a dozen
 * times or more per container, and a pass-through container pays for each. Starting a dynamically
 * linked program costs ~0.48 ms here (the loader, the C library's start-up), a statically linked
 * glibc one ~0.32 ms, this one ~0.05 ms (measured with posix_spawn, 2,000 runs, 2026-11-26). So it
 * is built with -nostdlib -static: its own entry point and the four system calls it makes
 * (faccessat, readlinkat, execve, write, exit), for x86_64 and aarch64.
 */

#if defined(__x86_64__)
#define NR_WRITE 1
#define NR_EXECVE 59
#define NR_EXIT 60
#define NR_READLINKAT 267
#define NR_FACCESSAT 269
static long sys3(long n, long a, long b, long c)
{
    long r;
    __asm__ volatile("syscall" : "=a"(r) : "a"(n), "D"(a), "S"(b), "d"(c) : "rcx", "r11", "memory");
    return r;
}
static long sys4(long n, long a, long b, long c, long d)
{
    long r;
    register long r10 __asm__("r10") = d;
    __asm__ volatile("syscall" : "=a"(r) : "a"(n), "D"(a), "S"(b), "d"(c), "r"(r10) : "rcx", "r11", "memory");
    return r;
}
/* the kernel starts us with argc at the stack pointer, argv and envp after it */
__asm__(".text\n.global _start\n_start:\n xor %rbp, %rbp\n mov %rsp, %rdi\n and $-16, %rsp\n"
        " call front_main\n hlt\n");
#elif defined(__aarch64__)
#define NR_FACCESSAT 48
#define NR_WRITE 64
#define NR_READLINKAT 78
#define NR_EXIT 93
#define NR_EXECVE 221
static long sys4(long n, long a, long b, long c, long d)
{
    register long x8 __asm__("x8") = n;
    register long x0 __asm__("x0") = a;
    register long x1 __asm__("x1") = b;
    register long x2 __asm__("x2") = c;
    register long x3 __asm__("x3") = d;
    __asm__ volatile("svc 0" : "+r"(x0) : "r"(x8), "r"(x1), "r"(x2), "r"(x3) : "memory");
    return x0;
}
static long sys3(long n, long a, long b, long c) { return sys4(n, a, b, c, 0); }
__asm__(".text\n.global _start\n_start:\n mov x29, #0\n mov x30, #0\n mov x0, sp\n bl front_main\n"
        " 1: b 1b\n");
#else
#error "hamid-runtime's front is written for x86_64 and aarch64"
#endif

#define AT_FDCWD (-100)
#define X_OK 1
#define PATH_CAP 4096
#define DEFAULT_PATH "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
#define ADMIT "hamid-runtime-admit"

static unsigned long len(const char *s)
{
    unsigned long n = 0;
    while (s[n]) n++;
    return n;
}

static int eq(const char *a, const char *b)
{
    while (*a && *a == *b) a++, b++;
    return *a == *b;
}

/* a starts with p: the rest of a, else 0 */
static const char *after(const char *a, const char *p)
{
    while (*p && *a == *p) a++, p++;
    return *p ? 0 : a;
}

static __attribute__((noreturn)) void die(const char *what, const char *path)
{
    static const char head[] = "hamid-runtime: cannot run ";
    sys3(NR_WRITE, 2, (long)head, sizeof head - 1);
    sys3(NR_WRITE, 2, (long)path, (long)len(path));
    sys3(NR_WRITE, 2, (long)what, (long)len(what));
    for (;;) sys3(NR_EXIT, 1, 0, 0);
}

/* exec hamid-runtime-admit beside our real path, with our arguments as they came */
static __attribute__((noreturn)) void admit(char **argv, char **envp)
{
    static char path[PATH_CAP + sizeof ADMIT + 1];
    long n = sys4(NR_READLINKAT, AT_FDCWD, (long)"/proc/self/exe", (long)path, PATH_CAP);
    if (n <= 0 || n >= PATH_CAP) die(" (its own path is unknown: /proc/self/exe)\n", ADMIT);
    while (n > 0 && path[n - 1] != '/') n--;
    for (unsigned long k = 0; k <= sizeof ADMIT - 1; k++) path[n + k] = ADMIT[k]; /* with its NUL */
    argv[0] = path;
    sys3(NR_EXECVE, (long)path, (long)argv, (long)envp);
    die("\n", path);
}

/* runc: --runc as given, else the first executable runc on PATH (as hamid-runtime-admit finds it) */
static const char *find_runc(const char *runc, char **envp, char *buf)
{
    if (runc) return runc;
    const char *path = DEFAULT_PATH;
    for (char **e = envp; *e; e++) {
        const char *v = after(*e, "PATH=");
        if (v) { path = v; break; }
    }
    while (*path) {
        unsigned long n = 0;
        while (path[n] && path[n] != ':') n++;
        if (n > 0 && n < PATH_CAP) {
            for (unsigned long k = 0; k < n; k++) buf[k] = path[k];
            for (unsigned long k = 0; k < sizeof "/runc"; k++) buf[n + k] = "/runc"[k];
            if (sys3(NR_FACCESSAT, AT_FDCWD, (long)buf, X_OK) == 0) return buf;
        }
        path += n;
        if (*path == ':') path++;
    }
    return 0;
}

__attribute__((used, noreturn)) void front_main(long *sp)
{
    int argc = (int)sp[0];
    char **argv = (char **)(sp + 1);
    char **envp = argv + argc + 1;
    const char *runc = 0;
    int i = 1;
    for (; i < argc; i++) { /* our options first */
        const char *a = argv[i], *v;
        if (eq(a, "--")) { i++; break; }
        if (eq(a, "--state-dir") && i + 1 < argc) { i++; continue; }
        if (after(a, "--state-dir=")) continue;
        if (eq(a, "--runc") && i + 1 < argc) { runc = argv[++i]; continue; }
        if ((v = after(a, "--runc="))) { runc = v; continue; }
        break;
    }
    int first = i;
    /* runc's global flags (those with a value as hamid-runtime-admit reads them), then the verb */
    static const char *const valued[] = {"--root", "--log", "--log-format", "--criu", "--rootless"};
    const char *verb = 0;
    for (; i < argc && !verb; i++) {
        const char *a = argv[i];
        int skip = 0;
        for (unsigned k = 0; k < sizeof valued / sizeof *valued && !skip; k++) {
            const char *v = after(a, valued[k]);
            if (v && (*v == 0 || *v == '=')) skip = *v == 0 ? 2 : 1;
        }
        if (skip == 2) i++;
        else if (!skip && a[0] != '-') verb = a;
    }
    if (verb && (eq(verb, "create") || eq(verb, "run") || eq(verb, "hook"))) admit(argv, envp);
    static char found[PATH_CAP + sizeof "/runc"];
    const char *path = find_runc(runc, envp, found);
    if (path) {
        char *ours = argv[first - 1];
        argv[first - 1] = (char *)path;
        sys3(NR_EXECVE, (long)path, (long)(argv + first - 1), (long)envp);
        argv[first - 1] = ours; /* runc did not start: hamid-runtime-admit says why */
    }
    admit(argv, envp);
}
