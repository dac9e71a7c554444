/*
 * fake_cuda.c: TEST STAND-IN ONLY, built by tests/shim as libcuda.so.1. It is
 * not NVIDIA's driver and implements no GPU: just enough of the driver API
 * (same names, same signatures, same CUresult values) for the shim's tests to
 * exercise every path on a machine without a GPU. Memory is bookkept in the
 * shared fake_state; a kernel "runs" for as many microseconds as its
 * CUfunction handle's value, on one busy timeline per device, which events
 * observe the way real events do. It also owns the virtual clock's taking
 * part and sleeping (FAKE_VCLOCK=1, see struct fake_vclock), exported as
 * fake_clock_* for the shim's test build and shimtest: its timeline, its
 * sleeps and its CPU costs are then on simulated time.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <limits.h>
#include <linux/futex.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "fake_state.h"
#include "hamid_cuda.h"

#define API __attribute__((visibility("default")))

/* ---- the virtual clock (FAKE_VCLOCK=1; see struct fake_vclock): taking part, reading, sleeping ---- */
static __thread int t_vc_slot = -1;
static __thread int32_t t_vc_pid, t_vc_tid;
static pthread_key_t g_vc_key;
static pthread_once_t g_vc_once = PTHREAD_ONCE_INIT;
static int g_vc_exiting;

static void vc_lock(struct fake_vclock *c)
{
    while (__atomic_exchange_n(&c->lock, 1, __ATOMIC_ACQUIRE)) usleep(10);
}
static void vc_unlock(struct fake_vclock *c) { __atomic_store_n(&c->lock, 0, __ATOMIC_RELEASE); }

static int vc_mine(struct fake_vclock *c)
{
    return t_vc_slot >= 0 && t_vc_pid == fake_host_pid() && c->who[t_vc_slot].pid == t_vc_pid &&
           c->who[t_vc_slot].tid == t_vc_tid;
}

/* How many threads a process has now (/proc/<pid>/stat's 20th field); 0 when it is gone. */
static int proc_threads(int32_t pid)
{
    char path[64], buf[1024];
    snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
    FILE *f = fopen(path, "re");
    if (!f) return 0;
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = 0;
    char *p = strrchr(buf, ')');
    for (int field = 2; p && field < 20; field++) p = strchr(p + 1, ' ');
    return p ? atoi(p + 1) : 0;
}

/*
 * Under the lock: when every thread taking part sleeps, and every thread of their processes takes part (a
 * thread just started has yet to read the clock: time waits for it, as it would not wait in a real process
 * only for as long as starting a thread takes), the one to wake first (the earliest wake-up; on a tie the
 * first to take part) wakes alone and time moves to its wake-up. One thread runs at a time, in an order set
 * by simulated time alone: the same run gives the same result on a quiet machine and a loaded one.
 */
static void vc_advance_locked(struct fake_vclock *c)
{
    int first = -1;
    for (int i = 0; i < FAKE_VCLOCK_THREADS; i++) {
        if (!c->who[i].pid) continue;
        if (!c->who[i].asleep) return;
        if (first < 0 || c->who[i].wake < c->who[first].wake) first = i;
    }
    if (first < 0) return;
    for (int i = 0; i < FAKE_VCLOCK_THREADS; i++) {
        int32_t pid = c->who[i].pid, mine = 0, seen = 0;
        if (!pid) continue;
        for (int j = 0; j < FAKE_VCLOCK_THREADS; j++) {
            if (c->who[j].pid != pid) continue;
            mine++;
            if (j < i) seen = 1;
        }
        if (!seen && proc_threads(pid) > mine) return;
    }
    if (c->who[first].wake > c->now) __atomic_store_n(&c->now, c->who[first].wake, __ATOMIC_RELEASE);
    __atomic_store_n(&c->who[first].asleep, 0, __ATOMIC_RELEASE);
    __atomic_add_fetch(&c->epoch, 1, __ATOMIC_RELEASE);
    syscall(SYS_futex, &c->epoch, FUTEX_WAKE, INT_MAX, NULL, NULL, 0);
}

/* Under the lock: threads of processes that died (killed: no exit handler ran) take part no more. */
static void vc_reap_locked(struct fake_vclock *c)
{
    for (int i = 0; i < FAKE_VCLOCK_THREADS; i++)
        if (c->who[i].pid && !fake_pid_alive(c->who[i].pid)) c->who[i].pid = 0;
}

static void vc_leave_thread(void *unused)
{
    (void)unused;
    struct fake_vclock *c = &fake_state_get()->vc;
    vc_lock(c);
    if (vc_mine(c)) c->who[t_vc_slot].pid = 0;
    t_vc_slot = -1;
    vc_advance_locked(c);
    vc_unlock(c);
}

/* The process ends (exit(), not a thread's end: the main thread runs no key destructor): all its threads leave. */
static void vc_leave_process(void)
{
    struct fake_vclock *c = &fake_state_get()->vc;
    int32_t pid = fake_host_pid();
    vc_lock(c);
    __atomic_store_n(&g_vc_exiting, 1, __ATOMIC_RELEASE);
    for (int i = 0; i < FAKE_VCLOCK_THREADS; i++)
        if (c->who[i].pid == pid) c->who[i].pid = 0;
    vc_advance_locked(c);
    vc_unlock(c);
}

static void vc_setup(void)
{
    pthread_key_create(&g_vc_key, vc_leave_thread);
    atexit(vc_leave_process);
}

/* The calling thread takes part in the virtual clock (once): from now on time waits for it to sleep. */
static int vc_join(struct fake_vclock *c)
{
    if (vc_mine(c)) return t_vc_slot;
    pthread_once(&g_vc_once, vc_setup);
    int32_t pid = fake_host_pid(), tid = (int32_t)syscall(SYS_gettid);
    vc_lock(c);
    int slot = -1;
    for (int i = 0; i < FAKE_VCLOCK_THREADS && slot < 0; i++)
        if (!c->who[i].pid) slot = i;
    if (slot < 0) {
        vc_unlock(c);
        fprintf(stderr, "fake_cuda: more than %d threads on the virtual clock\n", FAKE_VCLOCK_THREADS);
        abort();
    }
    c->who[slot].pid = pid;
    c->who[slot].tid = tid;
    c->who[slot].asleep = 0;
    vc_unlock(c);
    t_vc_slot = slot;
    t_vc_pid = pid;
    t_vc_tid = tid;
    pthread_setspecific(g_vc_key, (void *)1);
    return slot;
}

/* Monotonic ns on the stand-in's clock (the shim's test build and shimtest read time here). */
API uint64_t fake_clock_mono_ns(void)
{
    if (fake_vclock_on()) vc_join(&fake_state_get()->vc);
    return (uint64_t)fake_now();
}
API uint64_t fake_clock_real_ns(void)
{
    if (fake_vclock_on()) vc_join(&fake_state_get()->vc);
    return (uint64_t)fake_real_now();
}

/* Sleep until fake_clock_mono_ns() reads t. */
API void fake_clock_sleep_until(uint64_t t)
{
    if (!fake_vclock_on()) {
        struct timespec ts = {(time_t)(t / 1000000000ull), (long)(t % 1000000000ull)};
        while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL) == EINTR) {
        }
        return;
    }
    struct fake_vclock *c = &fake_state_get()->vc;
    int me = vc_join(c);
    vc_lock(c);
    if (__atomic_load_n(&c->now, __ATOMIC_ACQUIRE) >= (int64_t)t) {
        vc_unlock(c);
        return;
    }
    c->who[me].wake = (int64_t)t;
    c->who[me].asleep = 1;
    vc_advance_locked(c);
    vc_unlock(c);
    for (;;) {
        uint32_t e = __atomic_load_n(&c->epoch, __ATOMIC_ACQUIRE);
        if (!__atomic_load_n(&c->who[me].asleep, __ATOMIC_ACQUIRE) && vc_mine(c)) break;
        if (__atomic_load_n(&g_vc_exiting, __ATOMIC_ACQUIRE)) /* the process is ending: this thread with it */
            for (;;) pause();
        /* woken when time moves; the real timeout only looks for participants that died or threads that ended
           before taking part */
        struct timespec rt = {0, 20000000};
        if (syscall(SYS_futex, &c->epoch, FUTEX_WAIT, e, &rt, NULL, 0) != 0 && errno == ETIMEDOUT) {
            vc_lock(c);
            vc_reap_locked(c);
            vc_advance_locked(c);
            vc_unlock(c);
        }
    }
}

/* The caller spends ns: asleep on the virtual clock, or (real clock) sleeping. */
static void spend_sleeping(int64_t ns)
{
    if (ns > 0) fake_clock_sleep_until(fake_clock_mono_ns() + (uint64_t)ns);
}
/* The caller's CPU is busy for ns (a launch's own cost): on the virtual clock a sleep, on the real one a spin. */
static void spend_cpu(int64_t ns)
{
    if (fake_vclock_on()) {
        spend_sleeping(ns);
        return;
    }
    int64_t until = fake_now() + ns;
    while (fake_now() < until) {
    }
}

static __thread int t_cur = -1; /* current device ordinal (via context) */
static __thread uintptr_t t_ctx;  /* current context: 0x1000 + ordinal for a primary one, see cuCtxCreate_v2 */
static int g_inited;

/* ordinal -> physical device, honouring CUDA_VISIBLE_DEVICES */
static int g_map[FAKE_MAX_DEV];
static int g_count = -1;
static void map_devices(void)
{
    if (g_count >= 0) return;
    struct fake_state *s = fake_state_get();
    const char *v = getenv("CUDA_VISIBLE_DEVICES");
    int n = 0;
    if (v && *v) {
        char buf[128];
        snprintf(buf, sizeof buf, "%s", v);
        for (char *tok = strtok(buf, ","); tok && n < FAKE_MAX_DEV; tok = strtok(NULL, ",")) {
            int p = atoi(tok);
            if (p >= 0 && (uint32_t)p < s->ndev) g_map[n++] = p;
        }
    } else {
        for (uint32_t i = 0; i < s->ndev; i++) g_map[n++] = (int)i;
    }
    g_count = n;
}
static int phys(int ord) { map_devices(); return (ord >= 0 && ord < g_count) ? g_map[ord] : -1; }

/* ---- allocation records (per process) ---- */
struct alloc { uint64_t key; int dev; uint64_t charged; int kind; uintptr_t ctx; /* 0: VMM, the device's */ };
static struct alloc g_allocs[65536];
static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;
static uint64_t g_next_ptr = 0x7f0000000000ull;

static uint64_t page_round(uint64_t b) { return (b + (2u << 20) - 1) / (2u << 20) * (2u << 20); }

static CUresult fake_alloc(int kind, uint64_t bytes, unsigned long long *out, int dev_ord)
{
    int ord = dev_ord >= 0 ? dev_ord : t_cur;
    if (!g_inited) return CUDA_ERROR_NOT_INITIALIZED;
    if (ord < 0) return CUDA_ERROR_INVALID_CONTEXT;
    int p = phys(ord);
    if (p < 0) return CUDA_ERROR_INVALID_VALUE;
    uint64_t c = page_round(bytes);
    if (fake_charge(p, (int64_t)c, 1) != 0) return CUDA_ERROR_OUT_OF_MEMORY;
    pthread_mutex_lock(&g_mu);
    uint64_t key = __atomic_fetch_add(&g_next_ptr, c + 4096, __ATOMIC_RELAXED);
    for (int i = 0; i < 65536; i++)
        if (!g_allocs[i].key) { g_allocs[i] = (struct alloc){key, p, c, kind, dev_ord >= 0 ? 0 : t_ctx}; break; }
    pthread_mutex_unlock(&g_mu);
    *out = key;
    return CUDA_SUCCESS;
}

static CUresult fake_free(int kind, uint64_t key)
{
    if (!key) return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&g_mu);
    for (int i = 0; i < 65536; i++)
        if (g_allocs[i].key == key && g_allocs[i].kind == kind) {
            struct alloc a = g_allocs[i];
            g_allocs[i].key = 0;
            pthread_mutex_unlock(&g_mu);
            fake_charge(a.dev, -(int64_t)a.charged, 0);
            return CUDA_SUCCESS;
        }
    pthread_mutex_unlock(&g_mu);
    return CUDA_ERROR_INVALID_VALUE;
}

/* ---- init, devices, contexts ---- */
/* FAKE_CUINIT_ENV: a file where cuInit writes the MPS variables it sees, as the real driver reads
   them when it connects to an MPS control daemon (tests of what the shim hands the driver). */
static void record_mps_env(void)
{
    const char *out = getenv("FAKE_CUINIT_ENV");
    if (!out || !*out) return;
    FILE *f = fopen(out, "w");
    if (!f) return;
    static const char *names[] = {"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT",
                                  "CUDA_MPS_PIPE_DIRECTORY", NULL};
    for (int i = 0; names[i]; i++) {
        const char *v = getenv(names[i]);
        fprintf(f, "%s=%s\n", names[i], v ? v : "<unset>");
    }
    fclose(f);
}
API CUresult cuInit(unsigned int flags) { (void)flags; record_mps_env(); fake_state_get(); map_devices(); g_inited = 1; return CUDA_SUCCESS; }
API CUresult cuDriverGetVersion(int *v) { *v = 13000; return CUDA_SUCCESS; }
API CUresult cuDeviceGetCount(int *n) { if (!g_inited) return CUDA_ERROR_NOT_INITIALIZED; map_devices(); *n = g_count; return CUDA_SUCCESS; }
API CUresult cuDeviceGet(CUdevice *d, int ord) { map_devices(); if (ord < 0 || ord >= g_count) return CUDA_ERROR_INVALID_VALUE; *d = ord; return CUDA_SUCCESS; }
static CUresult get_uuid(CUuuid *u, CUdevice d)
{
    int p = phys(d);
    if (p < 0) return CUDA_ERROR_INVALID_VALUE;
    memset(u->bytes, 0, 16);
    u->bytes[0] = (char)0xfa; u->bytes[1] = (char)0x4e; u->bytes[15] = (char)p;
    return CUDA_SUCCESS;
}
API CUresult cuDeviceGetUuid(CUuuid *u, CUdevice d) { return get_uuid(u, d); }
API CUresult cuDeviceGetUuid_v2(CUuuid *u, CUdevice d) { return get_uuid(u, d); }
API CUresult cuDeviceTotalMem_v2(size_t *b, CUdevice d)
{
    int p = phys(d);
    if (p < 0 || !b) return CUDA_ERROR_INVALID_VALUE;
    *b = fake_state_get()->dev[p].total;
    return CUDA_SUCCESS;
}

static int g_primary[FAKE_MAX_DEV];
static void unload_module(int p);
static uint64_t ctx_size(void) { const char *v = getenv("FAKE_CTX_MB"); return (uint64_t)(v ? atoi(v) : 40) << 20; }
/* FAKE_CTX_CREATE_MS: creating a context takes that long (the real one takes 0.1-0.5 s); the process shows in
   NVML's list halfway through. */
static void ctx_create(int p)
{
    const char *v = getenv("FAKE_CTX_CREATE_MS");
    long ms = v && *v ? atol(v) : 0;
    spend_sleeping(ms * 500000);
    fake_charge(p, (int64_t)ctx_size(), 0);
    spend_sleeping(ms * 500000);
}
API CUresult cuDevicePrimaryCtxRetain(CUcontext *pctx, CUdevice d)
{
    int p = phys(d);
    if (!g_inited) return CUDA_ERROR_NOT_INITIALIZED;
    if (p < 0 || !pctx) return CUDA_ERROR_INVALID_VALUE;
    if (__atomic_fetch_add(&g_primary[d], 1, __ATOMIC_RELAXED) == 0) ctx_create(p);
    *pctx = (CUcontext)(uintptr_t)(0x1000 + d);
    return CUDA_SUCCESS;
}
/* A context's end frees what was made in it; a primary context's also what belongs to no context (VMM). */
static void drop_context_allocs(uintptr_t ctx, int primary_dev)
{
    uint64_t sum[FAKE_MAX_DEV] = {0};
    pthread_mutex_lock(&g_mu);
    for (int i = 0; i < 65536; i++)
        if (g_allocs[i].key && (g_allocs[i].ctx == ctx || (!g_allocs[i].ctx && g_allocs[i].dev == primary_dev))) {
            sum[g_allocs[i].dev] += g_allocs[i].charged;
            g_allocs[i].key = 0;
        }
    pthread_mutex_unlock(&g_mu);
    for (int p = 0; p < FAKE_MAX_DEV; p++) if (sum[p]) fake_charge(p, -(int64_t)sum[p], 0);
}
API CUresult cuDevicePrimaryCtxRelease_v2(CUdevice d)
{
    int p = phys(d);
    if (p < 0 || g_primary[d] <= 0) return CUDA_ERROR_INVALID_CONTEXT;
    if (--g_primary[d] == 0) { drop_context_allocs(0x1000 + (uintptr_t)d, p); unload_module(p); fake_charge(p, -(int64_t)ctx_size(), 0); }
    return CUDA_SUCCESS;
}
API CUresult cuDevicePrimaryCtxReset_v2(CUdevice d)
{
    int p = phys(d);
    if (p < 0) return CUDA_ERROR_INVALID_VALUE;
    if (g_primary[d] > 0) { drop_context_allocs(0x1000 + (uintptr_t)d, p); unload_module(p); fake_charge(p, -(int64_t)ctx_size(), 0); }
    g_primary[d] = 0;
    return CUDA_SUCCESS;
}
static int ctx_dev(uintptr_t c) { return !c ? -1 : c < 0x100000 ? (int)(c - 0x1000) : (int)(c & 0xf); }
API CUresult cuCtxSetCurrent(CUcontext c) { t_ctx = (uintptr_t)c; t_cur = ctx_dev(t_ctx); return CUDA_SUCCESS; }
API CUresult cuCtxGetCurrent(CUcontext *c) { *c = (CUcontext)t_ctx; return CUDA_SUCCESS; }
/* A context of the program's own (0x100000 + n * 16 + ordinal): made current, with its own overhead. */
static uintptr_t g_nctx;
static CUresult own_ctx_create(CUcontext *pctx, unsigned int flags, CUdevice d)
{
    (void)flags;
    int p = phys(d);
    if (!g_inited) return CUDA_ERROR_NOT_INITIALIZED;
    if (p < 0 || !pctx) return CUDA_ERROR_INVALID_VALUE;
    ctx_create(p);
    uintptr_t c = 0x100000 + (__atomic_add_fetch(&g_nctx, 1, __ATOMIC_RELAXED) << 4) + (uintptr_t)d;
    *pctx = (CUcontext)c;
    return cuCtxSetCurrent(*pctx);
}
/* Every ABI calls the same internal function (a call to the exported cuCtxCreate_v2 would reach the shim's
 * wrapper of it and be counted twice). v3 adds execution affinity, v4 creation parameters; neither changes what
 * the stand-in does. */
API CUresult cuCtxCreate_v2(CUcontext *pctx, unsigned int flags, CUdevice d) { return own_ctx_create(pctx, flags, d); }
API CUresult cuCtxCreate_v3(CUcontext *pctx, CUexecAffinityParam *params, int n, unsigned int flags, CUdevice d)
{
    (void)params;
    (void)n;
    return own_ctx_create(pctx, flags, d);
}
API CUresult cuCtxCreate_v4(CUcontext *pctx, CUctxCreateParams *params, unsigned int flags, CUdevice d)
{
    (void)params;
    return own_ctx_create(pctx, flags, d);
}
API CUresult cuCtxDestroy_v2(CUcontext c)
{
    uintptr_t h = (uintptr_t)c;
    if (h < 0x100000) return CUDA_ERROR_INVALID_CONTEXT;
    int p = phys(ctx_dev(h));
    drop_context_allocs(h, -1);
    fake_charge(p, -(int64_t)ctx_size(), 0);
    if (t_ctx == h) cuCtxSetCurrent(NULL);
    return CUDA_SUCCESS;
}
API CUresult cuCtxGetDevice(CUdevice *d) { if (t_cur < 0) return CUDA_ERROR_INVALID_CONTEXT; *d = t_cur; return CUDA_SUCCESS; }

/* ---- memory ---- */
API CUresult cuMemAlloc_v2(CUdeviceptr *p, size_t b) { if (!p || !b) return CUDA_ERROR_INVALID_VALUE; return fake_alloc(1, b, p, -1); }
/* The CUDA 3.0 ABI: 32-bit size. A different function, as in the real driver. */
API CUresult cuMemAlloc(unsigned int *p, unsigned int b)
{
    unsigned long long x;
    CUresult r = fake_alloc(9, b, &x, -1);
    if (r == CUDA_SUCCESS) *p = (unsigned int)(x & 0xffffffffu);
    return r;
}
API CUresult cuMemFree_v2(CUdeviceptr p) { return fake_free(1, p); }
API CUresult cuMemAllocManaged(CUdeviceptr *p, size_t b, unsigned int f) { (void)f; return fake_alloc(1, b, p, -1); }
API CUresult cuMemAllocPitch_v2(CUdeviceptr *p, size_t *pitch, size_t w, size_t h, unsigned int e)
{
    (void)e;
    if (!p || !pitch) return CUDA_ERROR_INVALID_VALUE;
    /* FAKE_PITCH_ALIGN: the row alignment this "GPU" needs (default 512; real ones differ by texture unit) */
    const char *a = getenv("FAKE_PITCH_ALIGN");
    uint64_t al = a && *a ? strtoull(a, NULL, 10) : 512;
    *pitch = (w + al - 1) / al * al;
    return fake_alloc(1, *pitch * h, p, -1);
}
API CUresult cuMemAllocAsync(CUdeviceptr *p, size_t b, CUstream s) { (void)s; return fake_alloc(1, b, p, -1); }
API CUresult cuMemAllocAsync_ptsz(CUdeviceptr *p, size_t b, CUstream s) { (void)s; return fake_alloc(1, b, p, -1); }
API CUresult cuMemAllocFromPoolAsync(CUdeviceptr *p, size_t b, CUmemoryPool pool, CUstream s) { (void)s; if (!pool) return CUDA_ERROR_INVALID_VALUE; return fake_alloc(1, b, p, -1); }
API CUresult cuMemAllocFromPoolAsync_ptsz(CUdeviceptr *p, size_t b, CUmemoryPool pool, CUstream s) { (void)s; if (!pool) return CUDA_ERROR_INVALID_VALUE; return fake_alloc(1, b, p, -1); }
API CUresult cuMemFreeAsync(CUdeviceptr p, CUstream s) { (void)s; return fake_free(1, p); }
API CUresult cuMemFreeAsync_ptsz(CUdeviceptr p, CUstream s) { (void)s; return fake_free(1, p); }
API CUresult cuMemCreate(CUmemGenericAllocationHandle *h, size_t b, const CUmemAllocationProp *prop, unsigned long long f)
{
    (void)f;
    if (!h || !prop || b % (2u << 20)) return CUDA_ERROR_INVALID_VALUE;
    return fake_alloc(2, b, h, prop->location.type == CU_MEM_LOCATION_TYPE_DEVICE ? prop->location.id : t_cur);
}
API CUresult cuMemRelease(CUmemGenericAllocationHandle h) { return fake_free(2, h); }
static unsigned fmt_bytes(int f) { return f == 1 || f == 8 ? 1 : f == 2 || f == 9 || f == 0x10 ? 2 : 4; }
/* FAKE_ARRAY_PAD_PCT: an array takes that much more than its texels (tiling, alignment) */
static uint64_t array_bytes(uint64_t texels)
{
    const char *v = getenv("FAKE_ARRAY_PAD_PCT");
    return texels + (v && *v ? texels * strtoull(v, NULL, 10) / 100 : 0);
}
API CUresult cuArrayCreate_v2(CUarray *a, const CUDA_ARRAY_DESCRIPTOR *d)
{
    unsigned long long x;
    CUresult r = fake_alloc(3, array_bytes(d->Width * (d->Height ? d->Height : 1) * fmt_bytes(d->Format) * d->NumChannels), &x, -1);
    if (r == CUDA_SUCCESS) *a = (CUarray)(uintptr_t)x;
    return r;
}
API CUresult cuArray3DCreate_v2(CUarray *a, const CUDA_ARRAY3D_DESCRIPTOR *d)
{
    unsigned long long x;
    CUresult r = fake_alloc(3, array_bytes(d->Width * (d->Height ? d->Height : 1) * (d->Depth ? d->Depth : 1) * fmt_bytes(d->Format) * d->NumChannels), &x, -1);
    if (r == CUDA_SUCCESS) *a = (CUarray)(uintptr_t)x;
    return r;
}
API CUresult cuArrayDestroy(CUarray a) { return fake_free(3, (uint64_t)(uintptr_t)a); }
API CUresult cuArrayGetMemoryRequirements(CUDA_ARRAY_MEMORY_REQUIREMENTS *m, CUarray a, CUdevice d)
{
    (void)d;
    pthread_mutex_lock(&g_mu);
    for (int i = 0; i < 65536; i++)
        if (g_allocs[i].key == (uint64_t)(uintptr_t)a && g_allocs[i].kind == 3) {
            m->size = g_allocs[i].charged;
            m->alignment = 2u << 20;
            pthread_mutex_unlock(&g_mu);
            return CUDA_SUCCESS;
        }
    pthread_mutex_unlock(&g_mu);
    return CUDA_ERROR_INVALID_VALUE;
}
API CUresult cuMipmappedArrayCreate(CUmipmappedArray *m, const CUDA_ARRAY3D_DESCRIPTOR *d, unsigned int levels)
{
    /* every level of the chain: a 1-D chain takes nearly twice its base */
    uint64_t sum = 0;
    for (unsigned l = 0; l < (levels ? levels : 1); l++) {
        uint64_t w = d->Width >> l, h = d->Height ? d->Height >> l : 1, z = d->Depth ? d->Depth >> l : 1;
        sum += (w ? w : 1) * (h ? h : 1) * (z ? z : 1) * fmt_bytes(d->Format) * d->NumChannels;
    }
    unsigned long long x;
    CUresult r = fake_alloc(4, sum, &x, -1);
    if (r == CUDA_SUCCESS) *m = (CUmipmappedArray)(uintptr_t)x;
    return r;
}
API CUresult cuMipmappedArrayGetMemoryRequirements(CUDA_ARRAY_MEMORY_REQUIREMENTS *m, CUmipmappedArray a, CUdevice d)
{
    (void)d;
    pthread_mutex_lock(&g_mu);
    for (int i = 0; i < 65536; i++)
        if (g_allocs[i].key == (uint64_t)(uintptr_t)a && g_allocs[i].kind == 4) {
            m->size = g_allocs[i].charged;
            m->alignment = 2u << 20;
            pthread_mutex_unlock(&g_mu);
            return CUDA_SUCCESS;
        }
    pthread_mutex_unlock(&g_mu);
    return CUDA_ERROR_INVALID_VALUE;
}
API CUresult cuMipmappedArrayDestroy(CUmipmappedArray m) { return fake_free(4, (uint64_t)(uintptr_t)m); }
API CUresult cuMemGetInfo_v2(size_t *f, size_t *t)
{
    if (t_cur < 0) return CUDA_ERROR_INVALID_CONTEXT;
    struct fake_state *s = fake_state_get();
    int p = phys(t_cur);
    *t = s->dev[p].total;
    *f = s->dev[p].total - s->dev[p].used;
    return CUDA_SUCCESS;
}

/* ---- streams, events, the busy timeline ---- */
struct fstream { int capturing; int captured; unsigned record_block_ms; unsigned launch_cpu_us; };
/* Test-only knobs of one stream: an event record on it blocks that long (a full launch queue), and a launch on
   it costs the CPU that long. Not a driver function; shimtest looks it up by name. */
API void fake_stream_set(CUstream s, unsigned record_block_ms, unsigned launch_cpu_us)
{
    ((struct fstream *)s)->record_block_ms = record_block_ms;
    ((struct fstream *)s)->launch_cpu_us = launch_cpu_us;
}
API CUresult cuStreamCreate(CUstream *s, unsigned int f) { (void)f; *s = calloc(1, sizeof(struct fstream)); return CUDA_SUCCESS; }
static int is_real_stream(CUstream s) { return s && s != CU_STREAM_LEGACY && s != CU_STREAM_PER_THREAD; }
static CUresult is_capturing(CUstream s, CUstreamCaptureStatus *st)
{
    *st = is_real_stream(s) && ((struct fstream *)s)->capturing ? CU_STREAM_CAPTURE_STATUS_ACTIVE : CU_STREAM_CAPTURE_STATUS_NONE;
    return CUDA_SUCCESS;
}
API CUresult cuStreamIsCapturing(CUstream s, CUstreamCaptureStatus *st) { return is_capturing(s, st); }
API CUresult cuStreamIsCapturing_ptsz(CUstream s, CUstreamCaptureStatus *st) { return is_capturing(s, st); }
API CUresult cuThreadExchangeStreamCaptureMode(CUstreamCaptureMode *m) { (void)m; return CUDA_SUCCESS; }
static CUresult begin_capture(CUstream s) { if (!is_real_stream(s)) return CUDA_ERROR_NOT_SUPPORTED; ((struct fstream *)s)->capturing = 1; return CUDA_SUCCESS; }
API CUresult cuStreamBeginCapture_v2(CUstream s, int mode) { (void)mode; return begin_capture(s); }
API CUresult cuStreamBeginCapture_v2_ptsz(CUstream s, int mode) { (void)mode; return begin_capture(s); }
API CUresult cuStreamEndCapture(CUstream s, CUgraph *g)
{
    if (!is_real_stream(s) || !((struct fstream *)s)->capturing) return CUDA_ERROR_INVALID_VALUE;
    ((struct fstream *)s)->capturing = 0;
    if (g) *g = (CUgraph)(uintptr_t)((struct fstream *)s)->captured;
    return CUDA_SUCCESS;
}
API CUresult cuStreamEndCapture_ptsz(CUstream s, CUgraph *g) { return cuStreamEndCapture(s, g); }

static int64_t busy_until(int p) { return __atomic_load_n(&fake_state_get()->dev[p].busy_until, __ATOMIC_ACQUIRE); }

/*
 * How long a launch runs, in us: the kernel's own value, except for two
 * simulated behaviours of real GPUs the tests ask for by environment:
 * FAKE_FIRST_LAUNCH_US, the first launch of each kernel in a process runs this
 * long (lazy module loading, cold caches); FAKE_SLOW_AFTER=N:F, after N launches
 * in a process every kernel runs F times longer (data-dependent work).
 */
static uint64_t work_us(uint64_t key, uint64_t us)
{
    static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
    static uint64_t seen[256];
    static int nseen;
    static long launches;
    const char *v = getenv("FAKE_FIRST_LAUNCH_US");
    if (v && *v) {
        int first = 1;
        pthread_mutex_lock(&mu);
        for (int i = 0; i < nseen; i++) if (seen[i] == key) { first = 0; break; }
        if (first && nseen < 256) seen[nseen++] = key;
        pthread_mutex_unlock(&mu);
        if (first) return strtoull(v, NULL, 10);
    }
    v = getenv("FAKE_SLOW_AFTER");
    long n = __atomic_add_fetch(&launches, 1, __ATOMIC_RELAXED);
    if (v && *v && n > atol(v) && strchr(v, ':')) us = (uint64_t)((double)us * strtod(strchr(v, ':') + 1, NULL));
    return us;
}

/* The launch queue holds FAKE_QUEUE_MS of work (default 20): then the CPU blocks. */
static int64_t queue_ns(void)
{
    const char *v = getenv("FAKE_QUEUE_MS");
    return (v && *v ? atoll(v) : 20) * 1000000;
}

/*
 * FAKE_MODULE_MB: a process's first kernel launch on a device loads its
 * module into device memory (as the real driver's lazy loading does): memory
 * that only NVML's per-process figure shows, no allocation call the shim sees.
 */
static uint64_t g_module[FAKE_MAX_DEV];
static void load_module(int p)
{
    const char *v = getenv("FAKE_MODULE_MB");
    if (!v || !*v || g_module[p]) return;
    g_module[p] = strtoull(v, NULL, 10) << 20;
    fake_charge(p, (int64_t)g_module[p], 0);
}
static void unload_module(int p)
{
    if (g_module[p]) fake_charge(p, -(int64_t)g_module[p], 0);
    g_module[p] = 0;
}

/* FAKE_LAUNCH_US: a launch costs the CPU that long before the GPU sees the kernel (a real one: 3-4 us). On the
   virtual clock 1 us unless set: a launch that took no time at all would line work up to the nanosecond with the
   limiter's slot ends and period edges, which no real launcher does. */
static void launch_cpu_cost(void)
{
    const char *v = getenv("FAKE_LAUNCH_US");
    if (v && *v) spend_cpu(atoll(v) * 1000);
    else if (fake_vclock_on()) spend_cpu(1000);
}

static CUresult run_work(CUstream s, uint64_t us)
{
    if (t_cur < 0) return CUDA_ERROR_INVALID_CONTEXT;
    launch_cpu_cost();
    if (s && s != CU_STREAM_LEGACY && s != CU_STREAM_PER_THREAD && ((struct fstream *)s)->launch_cpu_us)
        spend_cpu((int64_t)((struct fstream *)s)->launch_cpu_us * 1000);
    if (is_real_stream(s) && ((struct fstream *)s)->capturing) { ((struct fstream *)s)->captured += (int)us; return CUDA_SUCCESS; }
    us = work_us(us, us);
    struct fake_state *st = fake_state_get();
    int p = phys(t_cur);
    load_module(p);
    int64_t now = (int64_t)fake_clock_mono_ns(), old, end;
    fake_lock(st); /* the timeline and its history (NVML's device samples) move together */
    old = st->dev[p].busy_until;
    end = (old > now ? old : now) + (int64_t)us * 1000;
    __atomic_store_n(&st->dev[p].busy_until, end, __ATOMIC_RELEASE);
    fake_busy_add_locked(st, p, end - (int64_t)us * 1000, end);
    fake_unlock(st);
    if (end - now > queue_ns()) fake_clock_sleep_until((uint64_t)(end - queue_ns()));
    return CUDA_SUCCESS;
}
/* A kernel's work in us: the function's value, or, when its first argument is given, that argument (a
   uint32 of us): a persistent kernel, one grid whatever the size of its work (cuBLAS's nvjet GEMMs on Hopper). */
static uint64_t kernel_us(CUfunction f, void **pa)
{
    return pa && pa[0] ? *(const uint32_t *)pa[0] : (uint64_t)(uintptr_t)f;
}
API CUresult cuLaunchKernel(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz, unsigned sm, CUstream s, void **pa, void **ex) { return run_work(s, kernel_us(f, pa)); }
API CUresult cuLaunchKernel_ptsz(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz, unsigned sm, CUstream s, void **pa, void **ex) { return run_work(s, kernel_us(f, pa)); }
API CUresult cuLaunchKernelEx(const CUlaunchConfig *c, CUfunction f, void **pa, void **ex) { return run_work(c->hStream, kernel_us(f, pa)); }
API CUresult cuLaunchKernelEx_ptsz(const CUlaunchConfig *c, CUfunction f, void **pa, void **ex) { return run_work(c->hStream, kernel_us(f, pa)); }
API CUresult cuLaunchCooperativeKernel(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz, unsigned sm, CUstream s, void **pa) { return run_work(s, kernel_us(f, pa)); }
API CUresult cuLaunchCooperativeKernel_ptsz(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz, unsigned sm, CUstream s, void **pa) { return run_work(s, kernel_us(f, pa)); }
API CUresult cuGraphLaunch(CUgraphExec g, CUstream s) { return run_work(s, (uint64_t)(uintptr_t)g); }
API CUresult cuGraphLaunch_ptsz(CUgraphExec g, CUstream s) { return run_work(s, (uint64_t)(uintptr_t)g); }
static void wait_idle(void)
{
    if (t_cur < 0) return;
    fake_clock_sleep_until((uint64_t)busy_until(phys(t_cur)));
}
API CUresult cuCtxSynchronize(void) { wait_idle(); return CUDA_SUCCESS; }
API CUresult cuStreamSynchronize(CUstream s) { (void)s; wait_idle(); return CUDA_SUCCESS; }

struct fevent { int64_t ts; };
API CUresult cuEventCreate(CUevent *e, unsigned int f) { (void)f; *e = calloc(1, sizeof(struct fevent)); return CUDA_SUCCESS; }
API CUresult cuEventDestroy_v2(CUevent e) { free(e); return CUDA_SUCCESS; }
API CUresult cuEventRecord(CUevent e, CUstream s)
{
    if (t_cur < 0) return CUDA_ERROR_INVALID_CONTEXT;
    if (s && s != CU_STREAM_LEGACY && s != CU_STREAM_PER_THREAD && ((struct fstream *)s)->record_block_ms)
        spend_sleeping((int64_t)((struct fstream *)s)->record_block_ms * 1000000);
    /* FAKE_RECORD_US: recording an event costs the CPU that long before the GPU sees it (as a launch does: the
       driver rings the doorbell at the call's end; a real record takes 1-2 us, more with the driver busy) */
    const char *rv = getenv("FAKE_RECORD_US");
    if (rv && *rv) spend_cpu(atoll(rv) * 1000);
    int64_t now = (int64_t)fake_clock_mono_ns(), b = busy_until(phys(t_cur));
    ((struct fevent *)e)->ts = b > now ? b : now;
    return CUDA_SUCCESS;
}
API CUresult cuEventQuery(CUevent e) { return fake_now() >= ((struct fevent *)e)->ts ? CUDA_SUCCESS : CUDA_ERROR_NOT_READY; }
/* FAKE_EVENT_SCALE: events that read kernel times scaled (a GPU whose per-launch timing misleads: what the
   measured-busy feedback must correct) */
API CUresult cuEventElapsedTime(float *ms, CUevent a, CUevent b)
{
    const char *v = getenv("FAKE_EVENT_SCALE");
    double k = v && *v ? strtod(v, NULL) : 1.0;
    *ms = (float)((double)(((struct fevent *)b)->ts - ((struct fevent *)a)->ts) * k / 1e6);
    return CUDA_SUCCESS;
}
API CUresult cuCtxSynchronize_marker(void) { return 4242; } /* a symbol the shim does not intercept */

/* ---- cuGetProcAddress, answering per version like the driver ---- */
struct ver { const char *base; int min; const char *exported; };
static const struct ver g_vers[] = {
    {"cuMemAlloc", 3020, "cuMemAlloc_v2"}, {"cuMemAlloc", 2000, "cuMemAlloc"},
    {"cuMemFree", 3020, "cuMemFree_v2"}, {"cuMemAllocPitch", 3020, "cuMemAllocPitch_v2"},
    {"cuMemGetInfo", 3020, "cuMemGetInfo_v2"}, {"cuDeviceTotalMem", 3020, "cuDeviceTotalMem_v2"},
    {"cuArrayCreate", 3020, "cuArrayCreate_v2"}, {"cuArray3DCreate", 3020, "cuArray3DCreate_v2"},
    {"cuDevicePrimaryCtxRelease", 11000, "cuDevicePrimaryCtxRelease_v2"},
    {"cuDevicePrimaryCtxReset", 11000, "cuDevicePrimaryCtxReset_v2"},
    {"cuStreamBeginCapture", 10010, "cuStreamBeginCapture_v2"},
    {"cuEventDestroy", 4000, "cuEventDestroy_v2"}, {"cuDeviceGetUuid", 11040, "cuDeviceGetUuid_v2"},
    {"cuGetProcAddress", 12000, "cuGetProcAddress_v2"}, {"cuGetProcAddress", 11030, "cuGetProcAddress"},
    {"cuMemAllocAsync", 11020, "cuMemAllocAsync"}, {"cuMemAllocFromPoolAsync", 11020, "cuMemAllocFromPoolAsync"},
    {"cuMemFreeAsync", 11020, "cuMemFreeAsync"}, {"cuLaunchKernelEx", 11060, "cuLaunchKernelEx"},
    {"cuMemCreate", 10020, "cuMemCreate"}, {"cuCtxCreate", 12050, "cuCtxCreate_v4"},
    {"cuCtxCreate", 11040, "cuCtxCreate_v3"}, {"cuCtxCreate", 3020, "cuCtxCreate_v2"}, {"cuCtxDestroy", 4000, "cuCtxDestroy_v2"},
};

static CUresult proc_address(const char *sym, void **pfn, int ver, cuuint64_t flags, CUdriverProcAddressQueryResult *st)
{
    if (!sym || !pfn) return CUDA_ERROR_INVALID_VALUE;
    const char *name = NULL;
    int known = 0;
    for (size_t i = 0; i < sizeof g_vers / sizeof g_vers[0]; i++)
        if (strcmp(g_vers[i].base, sym) == 0) {
            known = 1;
            if (g_vers[i].min <= ver) { name = g_vers[i].exported; break; }
        }
    if (known && !name) {
        if (st) *st = CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT;
        *pfn = NULL;
        return CUDA_ERROR_NOT_FOUND;
    }
    if (!name) name = sym;
    void *self = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
    void *(*real_dlsym)(void *, const char *) = (void *(*)(void *, const char *))dlvsym(RTLD_DEFAULT, "dlsym", "GLIBC_2.34");
    if (!real_dlsym) real_dlsym = (void *(*)(void *, const char *))dlvsym(RTLD_DEFAULT, "dlsym", "GLIBC_2.2.5");
    void *f = NULL;
    if (flags & CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM) {
        char buf[256];
        snprintf(buf, sizeof buf, "%s_ptsz", name);
        f = real_dlsym(self, buf);
    }
    if (!f) f = real_dlsym(self, name);
    if (self) dlclose(self);
    *pfn = f;
    if (st) *st = f ? CU_GET_PROC_ADDRESS_SUCCESS : CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
    return f ? CUDA_SUCCESS : CUDA_ERROR_NOT_FOUND;
}
API CUresult cuGetProcAddress_v2(const char *s, void **p, int v, cuuint64_t f, CUdriverProcAddressQueryResult *st) { return proc_address(s, p, v, f, st); }
API CUresult cuGetProcAddress(const char *s, void **p, int v, cuuint64_t f) { return proc_address(s, p, v, f, NULL); }
