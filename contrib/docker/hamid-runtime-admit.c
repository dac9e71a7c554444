/*
 * hamid-runtime-admit: the part of the OCI runtime Docker calls for --runtime=hami that may admit a
 * container, in C so that a container start pays for no shell and no Python. hamid-runtime (the
 * front door, hamid-runtime.c, which Docker runs for every verb) execs it, with the arguments Docker
 * gave, for `create`, `run` and `hook`, and for any verb it could not hand to runc itself (this
 * program then says why, where `docker run` shows it). Run directly, it does the same for any verb.
 *
 * Arguments (options of ours first, as daemon.json's runtimeArgs give them):
 *   hamid-runtime [--state-dir DIR] [--runc PATH] [--] <runc globals> <verb> ...
 *
 * - every runc verb but `create`/`run` (start, state, kill, delete, ...) is runc's:
 *   exec runc with our options dropped;
 * - `create`/`run` of a bundle whose config.json names neither
 *   HAMI_VISIBLE_DEVICES nor HAMI_VGPU_SPEC (a container that asks nothing of
 *   hamid): exec runc, untouched;
 * - `create`/`run` of one that may be ours: ask the daemon's Docker face
 *   (DIR/docker.sock, root only) to admit the container and edit its bundle:
 *     200 {"ours": ...}      exec runc
 *     409/400/413/500        print the message on stderr and as a JSON line in
 *                            runc's --log file (how it reaches `docker run`), exit 1
 *     anything else          (no daemon, no answer in 30 s, the answer cut short,
 *                            410: it got to the request after its deadline and
 *                            committed nothing) exec hamid-runtime-py beside it,
 *                            which admits the container through the ledger itself
 *                            and decides for certain;
 * - `hook poststop <id>` (the hook the edits add): drop DIR/released/<id>, the
 *   marker the daemon (or the next create) drains (hamid/node/released.py).
 *
 * It owns no state and reads nothing but its arguments, the bundle's config.json
 * and the socket. Its helpers live beside its real path (a link, as `make
 * install` makes in /usr/local/bin, is followed first).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#define DEFAULT_STATE "/var/lib/hamid"
#define DEFAULT_RUNC_ROOT "/run/runc"
#define TIMEOUT_S 30
#define DEADLINE_S 25

static char **g_argv;
static char g_self_dir[PATH_MAX];

/* Run the Python runtime with our own arguments (the path that needs no daemon). */
static void fallback(void)
{
    char py[PATH_MAX + 32];
    snprintf(py, sizeof py, "%s/hamid-runtime-py", g_self_dir);
    g_argv[0] = py;
    execv(py, g_argv);
    fprintf(stderr, "hamid-runtime: cannot run %s: %s\n", py, strerror(errno));
    exit(1);
}

/* Append a JSON string (quoted, escaped) to buf. */
static int put_json_string(char *buf, size_t cap, size_t *len, const char *s)
{
    if (*len + 2 >= cap) return -1;
    buf[(*len)++] = '"';
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        char esc[8];
        const char *out = NULL;
        if (*p == '"') out = "\\\"";
        else if (*p == '\\') out = "\\\\";
        else if (*p < 0x20) {
            snprintf(esc, sizeof esc, "\\u%04x", *p);
            out = esc;
        }
        if (out) {
            size_t n = strlen(out);
            if (*len + n + 2 >= cap) return -1;
            memcpy(buf + *len, out, n);
            *len += n;
        } else {
            if (*len + 3 >= cap) return -1;
            buf[(*len)++] = (char)*p;
        }
    }
    buf[(*len)++] = '"';
    return 0;
}

/* The value of the JSON string field "key" in body (unescaped into out), or -1. */
static int get_json_string(const char *body, const char *key, char *out, size_t cap)
{
    char pat[64];
    snprintf(pat, sizeof pat, "\"%s\"", key);
    const char *p = strstr(body, pat);
    if (!p) return -1;
    p += strlen(pat);
    while (*p == ' ' || *p == ':') p++;
    if (*p++ != '"') return -1;
    size_t n = 0;
    while (*p && *p != '"' && n + 1 < cap) {
        if (*p == '\\' && p[1]) {
            p++;
            char c = *p == 'n' ? '\n' : *p == 't' ? '\t' : *p == 'u' ? '?' : *p;
            if (*p == 'u') p += 4; /* not expected in our messages: shown as '?' */
            out[n++] = c;
            p++;
        } else {
            out[n++] = *p++;
        }
    }
    out[n] = 0;
    return 0;
}

static void report(const char *log_file, const char *log_format, const char *msg)
{
    fprintf(stderr, "hamid-runtime: %s\n", msg);
    if (!log_file) return;
    FILE *f = fopen(log_file, "a");
    if (!f) return;
    if (log_format && strcmp(log_format, "json") == 0) {
        char line[8192];
        size_t len = 0;
        char ts[32];
        time_t now = time(NULL);
        strftime(ts, sizeof ts, "%Y-%m-%dT%H:%M:%SZ", gmtime(&now));
        char full[4200];
        snprintf(full, sizeof full, "hamid: %s", msg);
        len += (size_t)snprintf(line, sizeof line, "{\"level\":\"error\",\"msg\":");
        if (put_json_string(line, sizeof line, &len, full) == 0 && len + 64 < sizeof line) {
            len += (size_t)snprintf(line + len, sizeof line - len, ",\"time\":\"%s\"}\n", ts);
            fwrite(line, 1, len, f);
        }
    } else {
        fprintf(f, "hamid: %s\n", msg);
    }
    fclose(f);
}

/* runc: --runc, else the first on PATH. */
static const char *find_runc(const char *runc, char *found, size_t cap)
{
    if (runc) return runc;
    const char *env = getenv("PATH");
    char paths[4096];
    snprintf(paths, sizeof paths, "%s", env ? env : "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin");
    for (char *save = NULL, *d = strtok_r(paths, ":", &save); d; d = strtok_r(NULL, ":", &save)) {
        snprintf(found, cap, "%s/runc", d);
        if (access(found, X_OK) == 0) return found;
    }
    return NULL;
}

/* exec runc with argv[first..] (our options dropped). */
static int exec_runc(const char *runc, char **argv, int first, const char *log_file, const char *log_format)
{
    char found[4096 + 16];
    const char *path = find_runc(runc, found, sizeof found);
    if (!path) {
        report(log_file, log_format, "runc not found; pass --runc PATH");
        return 1;
    }
    argv[first - 1] = (char *)path;
    execv(path, argv + first - 1);
    char msg[PATH_MAX + 64];
    snprintf(msg, sizeof msg, "cannot exec runc (%s): %s", path, strerror(errno));
    report(log_file, log_format, msg);
    return 1;
}

/* `hook poststop <id>`: the release marker. Quick, and never follows a link. */
static int poststop(const char *state, int argc, char **argv, int verb)
{
    if (verb + 1 >= argc || strcmp(argv[verb + 1], "poststop") != 0) {
        fprintf(stderr, "hamid-runtime: unknown hook; accepted: poststop\n");
        return 1;
    }
    const char *id = argv[argc - 1];
    size_t n = strlen(id);
    int ok = n > 0 && n <= 255 && id[0] != '.';
    for (size_t k = 0; ok && k < n; k++)
        ok = (id[k] >= 'A' && id[k] <= 'Z') || (id[k] >= 'a' && id[k] <= 'z') || (id[k] >= '0' && id[k] <= '9') ||
             id[k] == '_' || id[k] == '.' || id[k] == '-';
    if (!ok) {
        fprintf(stderr, "hamid-runtime: bad container id '%s'\n", id);
        return 1;
    }
    char dir[PATH_MAX];
    if ((size_t)snprintf(dir, sizeof dir, "%s/released", state) >= sizeof dir) return 1;
    mkdir(state, 0700);
    if (mkdir(dir, 0700) != 0 && errno != EEXIST) {
        fprintf(stderr, "hamid-runtime: cannot make %s: %s\n", dir, strerror(errno));
        return 1;
    }
    int dfd = open(dir, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (dfd < 0) {
        fprintf(stderr, "hamid-runtime: cannot open %s: %s\n", dir, strerror(errno));
        return 1;
    }
    int fd = openat(dfd, id, O_WRONLY | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0600);
    close(dfd);
    if (fd < 0) {
        fprintf(stderr, "hamid-runtime: cannot write %s/%s: %s\n", dir, id, strerror(errno));
        return 1;
    }
    close(fd);
    return 0;
}

/* 1: the bundle's config.json names a variable of ours (or cannot be read: then
 * the daemon or the Python runtime decides); 0: it names neither. */
static int maybe_ours(const char *bundle)
{
    char path[PATH_MAX];
    if ((size_t)snprintf(path, sizeof path, "%s/config.json", bundle) >= sizeof path) return 1;
    FILE *f = fopen(path, "re");
    if (!f) return 1;
    static const char *pats[] = {"\"HAMI_VISIBLE_DEVICES=", "\"HAMI_VGPU_SPEC="};
    /* read in chunks with an overlap as long as the longest pattern, so none is cut in two */
    char buf[65536 + 32];
    size_t keep = 0, got;
    int found = 0;
    while (!found && (got = fread(buf + keep, 1, sizeof buf - 1 - keep, f)) > 0) {
        size_t len = keep + got;
        buf[len] = 0;
        for (int k = 0; k < 2 && !found; k++)
            if (memmem(buf, len, pats[k], strlen(pats[k]))) found = 1;
        keep = len < 31 ? len : 31;
        memmove(buf, buf + len - keep, keep);
    }
    int err = ferror(f);
    fclose(f);
    return found || err;
}

int main(int argc, char **argv)
{
    g_argv = argv;
    {
        char self[PATH_MAX];
        ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
        if (n <= 0) { fprintf(stderr, "hamid-runtime: cannot find its own path\n"); return 1; }
        self[n] = 0;
        char *slash = strrchr(self, '/');
        *slash = 0;
        snprintf(g_self_dir, sizeof g_self_dir, "%s", self);
    }
    /* our options first */
    const char *state = DEFAULT_STATE, *runc = NULL;
    int i = 1;
    for (; i < argc; i++) {
        if (!strcmp(argv[i], "--")) { i++; break; }
        if (!strcmp(argv[i], "--state-dir") && i + 1 < argc) { state = argv[++i]; continue; }
        if (!strncmp(argv[i], "--state-dir=", 12)) { state = argv[i] + 12; continue; }
        if (!strcmp(argv[i], "--runc") && i + 1 < argc) { runc = argv[++i]; continue; }
        if (!strncmp(argv[i], "--runc=", 7)) { runc = argv[i] + 7; continue; }
        break;
    }
    int first_runc = i;
    /* runc's global flags, the verb, then --bundle and the container id */
    const char *root = DEFAULT_RUNC_ROOT, *log_file = NULL, *log_format = "text";
    int verb = -1;
    for (; i < argc; i++) {
        const char *a = argv[i];
        const char *val = NULL;
        const char *names[] = {"--root", "--log", "--log-format", "--criu", "--rootless"};
        int matched = 0;
        for (int k = 0; k < 5; k++) {
            size_t n = strlen(names[k]);
            if (!strncmp(a, names[k], n) && (a[n] == 0 || a[n] == '=')) {
                val = a[n] == '=' ? a + n + 1 : (i + 1 < argc ? argv[++i] : "");
                if (k == 0) root = val;
                if (k == 1) log_file = val;
                if (k == 2) log_format = val;
                matched = 1;
                break;
            }
        }
        if (matched || a[0] == '-') continue;
        verb = i;
        break;
    }
    if (verb >= 0 && !strcmp(argv[verb], "hook")) return poststop(state, argc, argv, verb);
    if (verb < 0 || (strcmp(argv[verb], "create") && strcmp(argv[verb], "run")))
        return exec_runc(runc, argv, first_runc, log_file, log_format);
    const char *bundle = ".", *id = NULL;
    for (int k = verb + 1; k < argc; k++) {
        const char *a = argv[k];
        if ((!strcmp(a, "--bundle") || !strcmp(a, "-b")) && k + 1 < argc) { bundle = argv[++k]; continue; }
        if (!strncmp(a, "--bundle=", 9)) { bundle = a + 9; continue; }
        if ((!strcmp(a, "--console-socket") || !strcmp(a, "--pid-file") || !strcmp(a, "--preserve-fds"))
            && k + 1 < argc) { k++; continue; }
        if (a[0] != '-') id = a;
    }
    if (!maybe_ours(bundle)) return exec_runc(runc, argv, first_runc, log_file, log_format);
    if (!id) fallback();
    char bundle_abs[PATH_MAX];
    if (!realpath(bundle, bundle_abs)) fallback();

    /* the request */
    char body[16384];
    size_t len = 0;
    char hook[PATH_MAX + 32];
    snprintf(hook, sizeof hook, "%s/hamid-runtime", g_self_dir);
    len += (size_t)snprintf(body, sizeof body, "{\"bundle\":");
    if (put_json_string(body, sizeof body, &len, bundle_abs) != 0) fallback();
    len += (size_t)snprintf(body + len, sizeof body - len, ",\"id\":");
    if (put_json_string(body, sizeof body, &len, id) != 0) fallback();
    len += (size_t)snprintf(body + len, sizeof body - len, ",\"runc_root\":");
    if (put_json_string(body, sizeof body, &len, root) != 0) fallback();
    len += (size_t)snprintf(body + len, sizeof body - len, ",\"hook\":");
    if (put_json_string(body, sizeof body, &len, hook) != 0) fallback();
    struct timeval now;
    gettimeofday(&now, NULL);
    len += (size_t)snprintf(body + len, sizeof body - len, ",\"deadline\":%ld.%06ld}",
                            (long)now.tv_sec + DEADLINE_S, (long)now.tv_usec);
    if (len >= sizeof body - 1) fallback();

    struct sockaddr_un addr = {.sun_family = AF_UNIX};
    if ((size_t)snprintf(addr.sun_path, sizeof addr.sun_path, "%s/docker.sock", state) >= sizeof addr.sun_path)
        fallback();
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) fallback();
    struct timeval tv = {.tv_sec = TIMEOUT_S};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
    if (connect(fd, (struct sockaddr *)&addr, sizeof addr) != 0) fallback();
    char head[512];
    int hl = snprintf(head, sizeof head,
                      "POST /v1/create HTTP/1.1\r\nHost: hamid\r\nConnection: close\r\n"
                      "Content-Type: application/json\r\nContent-Length: %zu\r\n\r\n", len);
    if (write(fd, head, (size_t)hl) != hl || write(fd, body, len) != (ssize_t)len) fallback();
    char resp[65536];
    size_t got = 0;
    for (;;) {
        ssize_t n = read(fd, resp + got, sizeof resp - 1 - got);
        if (n < 0) { if (errno == EINTR) continue; fallback(); }
        if (n == 0) break;
        got += (size_t)n;
        if (got >= sizeof resp - 1) break;
    }
    close(fd);
    resp[got] = 0;
    int status = 0;
    if (sscanf(resp, "HTTP/1.%*d %d", &status) != 1) fallback(); /* it died while answering */
    char *payload = strstr(resp, "\r\n\r\n");
    if (!payload) fallback();
    payload += 4;
    if (status == 200) return exec_runc(runc, argv, first_runc, log_file, log_format);
    if (status == 400 || status == 409 || status == 413 || status == 500) {
        char msg[4096];
        if (get_json_string(payload, "error", msg, sizeof msg) != 0)
            snprintf(msg, sizeof msg, "the daemon refused the container (HTTP %d)", status);
        report(log_file, log_format, msg);
        return 1;
    }
    fallback(); /* 410 and anything unexpected: the Python runtime decides */
    return 1;
}
