/*
 * fake_state.h: TEST STAND-IN ONLY. The state shared by the fake
 * libcuda.so.1 and the fake libnvidia-ml.so.1 that tests/shim builds: a tiny
 * simulated GPU (memory per device and per process, one busy timeline per
 * device) kept in a file named by FAKE_GPU_STATE so that every process of a
 * test sees the same "hardware", the way NVML sees the host, and with it the
 * virtual clock those processes share when a test asks for one.
 */
#ifndef FAKE_STATE_H
#define FAKE_STATE_H

#include <fcntl.h>
#include <stdio.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#define FAKE_MAX_DEV 4
#define FAKE_MAX_PROC 256
/* The busy history NVML's device samples are computed from: GPU time per 10 ms bucket, 4 s of them. */
#define FAKE_BUCKET_NS 10000000ll
#define FAKE_BUCKETS 400
/* The virtual clock (FAKE_VCLOCK=1): where it starts (a monotonic clock is never 0), and how many threads of
   the test's processes may take part in it. */
#define FAKE_VCLOCK_START_NS 1000000000000ll
#define FAKE_VCLOCK_THREADS 64

/*
 * The virtual clock a test's processes share when FAKE_VCLOCK=1: simulated time that moves only when every
 * thread taking part (any thread that read it or slept on it, until it ends) is asleep on it, and then
 * straight to the earliest wake-up. CPU work takes no simulated time; a kernel takes its own time on the
 * device's timeline; a sleep, a launch's CPU cost and a full launch queue take the caller's. So a rate
 * measured on it is the same on a quiet machine and a loaded one. fake_cuda.c owns the taking part and the
 * sleeping (it exports them to the shim's test build and to shimtest); fake_nvml.c only reads it.
 */
struct fake_vclock {
    int64_t now;   /* virtual CLOCK_MONOTONIC, ns */
    int64_t real0; /* CLOCK_REALTIME when now was FAKE_VCLOCK_START_NS: the virtual wall clock runs from it */
    uint32_t lock;
    uint32_t epoch; /* a futex word: bumped whenever now moves */
    struct {
        int32_t pid; /* host pid (0: a free entry) */
        int32_t tid;
        int32_t asleep;
        int32_t pad;
        int64_t wake; /* while asleep: the now it waits for */
    } who[FAKE_VCLOCK_THREADS];
};

struct fake_state {
    uint64_t magic;
    uint32_t lock;
    uint32_t ndev;
    struct {
        uint64_t total;
        uint64_t used;
        int64_t busy_until;
        int64_t bucket_no[FAKE_BUCKETS]; /* which bucket (mono ns / FAKE_BUCKET_NS) a slot holds */
        int64_t bucket_busy[FAKE_BUCKETS]; /* ns of it a kernel ran */
    } dev[FAKE_MAX_DEV];
    struct {
        int32_t pid;
        uint32_t dev;
        uint64_t used;
    } procs[FAKE_MAX_PROC];
    struct fake_vclock vc;
};

static inline struct fake_state *fake_state_get(void);

static inline int fake_vclock_on(void)
{
    static int on = -1;
    if (on < 0) {
        const char *v = getenv("FAKE_VCLOCK");
        on = v && !strcmp(v, "1");
    }
    return on;
}

static inline int64_t fake_clock_read(clockid_t id)
{
    struct timespec ts;
    clock_gettime(id, &ts);
    return (int64_t)ts.tv_sec * 1000000000ll + ts.tv_nsec;
}

/* Monotonic ns: the virtual clock's with FAKE_VCLOCK=1, else the kernel's. */
static inline int64_t fake_now(void)
{
    if (fake_vclock_on()) return __atomic_load_n(&fake_state_get()->vc.now, __ATOMIC_ACQUIRE);
    return fake_clock_read(CLOCK_MONOTONIC);
}

/* Wall-clock ns (NVML's sample stamps): with FAKE_VCLOCK=1 moving with the virtual clock. */
static inline int64_t fake_real_now(void)
{
    if (!fake_vclock_on()) return fake_clock_read(CLOCK_REALTIME);
    struct fake_state *s = fake_state_get();
    return s->vc.real0 + (__atomic_load_n(&s->vc.now, __ATOMIC_ACQUIRE) - FAKE_VCLOCK_START_NS);
}

static inline void fake_lock(struct fake_state *s)
{
    while (__atomic_exchange_n(&s->lock, 1, __ATOMIC_ACQUIRE)) usleep(10);
}
static inline void fake_unlock(struct fake_state *s) { __atomic_store_n(&s->lock, 0, __ATOMIC_RELEASE); }

/* The device ran kernels over [start, end) (mono ns): into the buckets it spans (under the lock). */
static inline void fake_busy_add_locked(struct fake_state *s, int d, int64_t start, int64_t end)
{
    for (int64_t b = start / FAKE_BUCKET_NS; b * FAKE_BUCKET_NS < end; b++) {
        int64_t lo = b * FAKE_BUCKET_NS > start ? b * FAKE_BUCKET_NS : start;
        int64_t hi = (b + 1) * FAKE_BUCKET_NS < end ? (b + 1) * FAKE_BUCKET_NS : end;
        int i = (int)(b % FAKE_BUCKETS);
        if (s->dev[d].bucket_no[i] != b) {
            s->dev[d].bucket_no[i] = b;
            s->dev[d].bucket_busy[i] = 0;
        }
        s->dev[d].bucket_busy[i] += hi - lo;
    }
}

/* ns of [start, end) in which device d ran a kernel (whole buckets; under the lock). */
static inline int64_t fake_busy_in_locked(struct fake_state *s, int d, int64_t start, int64_t end)
{
    int64_t t = 0;
    for (int64_t b = start / FAKE_BUCKET_NS; b * FAKE_BUCKET_NS < end; b++) {
        int i = (int)(b % FAKE_BUCKETS);
        if (s->dev[d].bucket_no[i] == b) t += s->dev[d].bucket_busy[i];
    }
    return t;
}

static inline struct fake_state *fake_state_get(void)
{
    static struct fake_state *st;
    if (st) return st;
    const char *p = getenv("FAKE_GPU_STATE");
    if (!p) p = "/tmp/fake_gpu_state";
    int fd = open(p, O_RDWR | O_CREAT, 0666);
    if (fd < 0) abort();
    if (ftruncate(fd, sizeof(struct fake_state)) != 0) abort();
    void *m = mmap(NULL, sizeof(struct fake_state), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    if (m == MAP_FAILED) abort();
    struct fake_state *s = m;
    fake_lock(s);
    if (s->magic != 0xFA4EC0DAull) {
        const char *n = getenv("FAKE_GPU_COUNT");
        const char *mem = getenv("FAKE_GPU_MEM_MB");
        s->ndev = n ? (uint32_t)atoi(n) : 2;
        if (s->ndev > FAKE_MAX_DEV) s->ndev = FAKE_MAX_DEV;
        for (uint32_t i = 0; i < FAKE_MAX_DEV; i++) s->dev[i].total = (mem ? strtoull(mem, 0, 10) : 16384ull) << 20;
        s->vc.now = FAKE_VCLOCK_START_NS;
        s->vc.real0 = fake_clock_read(CLOCK_REALTIME) / 1000000000ll * 1000000000ll; /* whole: no run's digits */
        s->magic = 0xFA4EC0DAull;
    }
    fake_unlock(s);
    st = s;
    return s;
}

/*
 * The pid the real driver would report: the host's. The driver is not aware
 * of pid namespaces; this stand-in reads the first NSpid entry of
 * /proc/self/status, which is the pid in the namespace /proc was mounted for
 * (the host's, in the tests that run the shim under `unshare --pid` without
 * remounting /proc). The shim itself must not learn its host pid this way: in
 * a container /proc is the container's own and shows one level only.
 */
static inline int32_t fake_host_pid(void)
{
    static int32_t cached_for, cached;
    int32_t me = (int32_t)getpid();
    if (cached_for == me) return cached;
    int32_t host = me;
    int fd = open("/proc/self/status", O_RDONLY | O_CLOEXEC);
    if (fd >= 0) {
        char buf[4096];
        ssize_t n = read(fd, buf, sizeof buf - 1);
        close(fd);
        if (n > 0) {
            buf[n] = 0;
            char *p = strstr(buf, "\nNSpid:");
            if (p) host = (int32_t)strtol(p + 7, NULL, 10);
        }
    }
    cached_for = me;
    cached = host;
    return host;
}

/* Whether a host pid still runs (through /proc: kill() would take it as a
   pid of the caller's namespace). */
static inline int fake_pid_alive(int32_t pid)
{
    char path[64], buf[512];
    snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return 0;
    ssize_t n = read(fd, buf, sizeof buf - 1);
    close(fd);
    if (n <= 0) return 0;
    buf[n] = 0;
    char *p = strrchr(buf, ')');
    return !(p && p[1] == ' ' && (p[2] == 'Z' || p[2] == 'X'));
}

/* Charge (or refund, delta < 0) a process's memory on a physical device. */
static inline int fake_charge(int dev, int64_t delta, int check)
{
    struct fake_state *s = fake_state_get();
    int32_t pid = fake_host_pid();
    fake_lock(s);
    if (check && delta > 0 && s->dev[dev].used + (uint64_t)delta > s->dev[dev].total) {
        fake_unlock(s);
        return -1;
    }
    s->dev[dev].used += (uint64_t)delta;
    int slot = -1;
    for (int i = 0; i < FAKE_MAX_PROC; i++) {
        if (s->procs[i].pid == pid && s->procs[i].dev == (uint32_t)dev) { slot = i; break; }
        if (slot < 0 && s->procs[i].pid == 0) slot = i;
    }
    if (slot >= 0) {
        s->procs[slot].pid = pid;
        s->procs[slot].dev = (uint32_t)dev;
        s->procs[slot].used += (uint64_t)delta;
    }
    fake_unlock(s);
    return 0;
}

#endif
