/*
 * shimtest.c: the test program tests/shim drives. It reaches the driver in
 * one of three ways (argv[1]): "direct" (linked against libcuda.so.1 and
 * libnvidia-ml.so.1), "dlsym" (dlopen + dlsym) or "procaddr"
 * (cuGetProcAddress_v2 with a CUDA version, as every CUDA 12/13 runtime does),
 * then runs the commands in argv[2..] in order, printing one line per result
 * for the Python test to parse. Used only by the test suite.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "hamid_cuda.h"
#include "hamid_region.h"

/* direct-link declarations */
CUresult cuInit(unsigned int);
CUresult cuDevicePrimaryCtxRetain(CUcontext *, CUdevice);
CUresult cuDevicePrimaryCtxRelease_v2(CUdevice);
CUresult cuDevicePrimaryCtxReset_v2(CUdevice);
CUresult cuCtxSetCurrent(CUcontext);
CUresult cuCtxSynchronize(void);
CUresult cuStreamCreate(CUstream *, unsigned int);
CUresult cuMemAlloc_v2(CUdeviceptr *, size_t);
CUresult cuMemFree_v2(CUdeviceptr);
CUresult cuMemAllocPitch_v2(CUdeviceptr *, size_t *, size_t, size_t, unsigned int);
CUresult cuMemAllocManaged(CUdeviceptr *, size_t, unsigned int);
CUresult cuMemAllocAsync(CUdeviceptr *, size_t, CUstream);
CUresult cuMemAllocAsync_ptsz(CUdeviceptr *, size_t, CUstream);
CUresult cuMemAllocFromPoolAsync(CUdeviceptr *, size_t, CUmemoryPool, CUstream);
CUresult cuMemFreeAsync(CUdeviceptr, CUstream);
CUresult cuMemCreate(CUmemGenericAllocationHandle *, size_t, const CUmemAllocationProp *, unsigned long long);
CUresult cuMemRelease(CUmemGenericAllocationHandle);
CUresult cuArrayCreate_v2(CUarray *, const CUDA_ARRAY_DESCRIPTOR *);
CUresult cuArray3DCreate_v2(CUarray *, const CUDA_ARRAY3D_DESCRIPTOR *);
CUresult cuArrayDestroy(CUarray);
CUresult cuMipmappedArrayCreate(CUmipmappedArray *, const CUDA_ARRAY3D_DESCRIPTOR *, unsigned int);
CUresult cuMipmappedArrayDestroy(CUmipmappedArray);
CUresult cuMemGetInfo_v2(size_t *, size_t *);
CUresult cuDeviceTotalMem_v2(size_t *, CUdevice);
CUresult cuLaunchKernel(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, CUstream, void **, void **);
CUresult cuLaunchKernel_ptsz(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, CUstream, void **, void **);
CUresult cuLaunchKernelEx(const CUlaunchConfig *, CUfunction, void **, void **);
CUresult cuLaunchCooperativeKernel(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, CUstream, void **);
CUresult cuGraphLaunch(CUgraphExec, CUstream);
CUresult cuStreamBeginCapture_v2(CUstream, int);
CUresult cuCtxCreate_v2(CUcontext *, unsigned int, CUdevice);
CUresult cuCtxCreate_v3(CUcontext *, CUexecAffinityParam *, int, unsigned int, CUdevice);
CUresult cuCtxCreate_v4(CUcontext *, CUctxCreateParams *, unsigned int, CUdevice);
CUresult cuCtxDestroy_v2(CUcontext);
CUresult cuStreamEndCapture(CUstream, CUgraph *);
CUresult cuGetProcAddress_v2(const char *, void **, int, cuuint64_t, CUdriverProcAddressQueryResult *);
nvmlReturn_t nvmlInit_v2(void);
nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int, nvmlDevice_t *);
nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t, nvmlMemory_t *);
nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t, nvmlMemory_v2_t *);
nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v3(nvmlDevice_t, unsigned int *, nvmlProcessInfo_t *);

#define APIS(X)                                                                                                       \
    X(cuInit, "cuInit", 0) X(cuDevicePrimaryCtxRetain, "cuDevicePrimaryCtxRetain", 0)                                 \
    X(cuDevicePrimaryCtxRelease_v2, "cuDevicePrimaryCtxRelease", 0)                                                   \
    X(cuDevicePrimaryCtxReset_v2, "cuDevicePrimaryCtxReset", 0) X(cuCtxSetCurrent, "cuCtxSetCurrent", 0)              \
    X(cuCtxSynchronize, "cuCtxSynchronize", 0) X(cuStreamCreate, "cuStreamCreate", 0)                                 \
    X(cuMemAlloc_v2, "cuMemAlloc", 0) X(cuMemFree_v2, "cuMemFree", 0) X(cuMemAllocPitch_v2, "cuMemAllocPitch", 0)     \
    X(cuMemAllocManaged, "cuMemAllocManaged", 0) X(cuMemAllocAsync, "cuMemAllocAsync", 0)                             \
    X(cuMemAllocAsync_ptsz, "cuMemAllocAsync", 2) X(cuMemAllocFromPoolAsync, "cuMemAllocFromPoolAsync", 0)            \
    X(cuMemFreeAsync, "cuMemFreeAsync", 0) X(cuMemCreate, "cuMemCreate", 0) X(cuMemRelease, "cuMemRelease", 0)        \
    X(cuArrayCreate_v2, "cuArrayCreate", 0) X(cuArray3DCreate_v2, "cuArray3DCreate", 0)                               \
    X(cuArrayDestroy, "cuArrayDestroy", 0) X(cuMipmappedArrayCreate, "cuMipmappedArrayCreate", 0)                     \
    X(cuMipmappedArrayDestroy, "cuMipmappedArrayDestroy", 0) X(cuMemGetInfo_v2, "cuMemGetInfo", 0)                    \
    X(cuDeviceTotalMem_v2, "cuDeviceTotalMem", 0) X(cuLaunchKernel, "cuLaunchKernel", 0)                              \
    X(cuLaunchKernel_ptsz, "cuLaunchKernel", 2) X(cuLaunchKernelEx, "cuLaunchKernelEx", 0)                            \
    X(cuLaunchCooperativeKernel, "cuLaunchCooperativeKernel", 0) X(cuGraphLaunch, "cuGraphLaunch", 0)                 \
    X(cuStreamBeginCapture_v2, "cuStreamBeginCapture", 0) X(cuStreamEndCapture, "cuStreamEndCapture", 0)          \
    X(cuCtxDestroy_v2, "cuCtxDestroy", 0)

static struct {
#define F(n, b, fl) __typeof__(&n) n;
    APIS(F)
#undef F
    __typeof__(&nvmlInit_v2) nvmlInit_v2;
    __typeof__(&nvmlDeviceGetHandleByIndex_v2) nvmlDeviceGetHandleByIndex_v2;
    __typeof__(&nvmlDeviceGetMemoryInfo) nvmlDeviceGetMemoryInfo;
    __typeof__(&nvmlDeviceGetMemoryInfo_v2) nvmlDeviceGetMemoryInfo_v2;
    __typeof__(&nvmlDeviceGetComputeRunningProcesses_v3) nvmlDeviceGetComputeRunningProcesses_v3;
    /* each ABI of cuCtxCreate, asked for with the version of its own typedef (as cudaTypedefs.h users do) */
    __typeof__(&cuCtxCreate_v2) cuCtxCreate_v2;
    __typeof__(&cuCtxCreate_v3) cuCtxCreate_v3;
    __typeof__(&cuCtxCreate_v4) cuCtxCreate_v4;
} api;

static int g_version = 12080;
static CUstream g_stream;

static void load(const char *mode)
{
    if (!strcmp(mode, "direct")) {
#define F(n, b, fl) api.n = &n;
        APIS(F)
#undef F
        api.nvmlInit_v2 = nvmlInit_v2;
        api.nvmlDeviceGetHandleByIndex_v2 = nvmlDeviceGetHandleByIndex_v2;
        api.nvmlDeviceGetMemoryInfo = nvmlDeviceGetMemoryInfo;
        api.nvmlDeviceGetMemoryInfo_v2 = nvmlDeviceGetMemoryInfo_v2;
        api.nvmlDeviceGetComputeRunningProcesses_v3 = nvmlDeviceGetComputeRunningProcesses_v3;
        api.cuCtxCreate_v2 = cuCtxCreate_v2;
        api.cuCtxCreate_v3 = cuCtxCreate_v3;
        api.cuCtxCreate_v4 = cuCtxCreate_v4;
        return;
    }
    void *h = dlopen("libcuda.so.1", RTLD_NOW);
    void *hn = dlopen("libnvidia-ml.so.1", RTLD_NOW);
    if (!h || !hn) { printf("error dlopen\n"); exit(3); }
    api.nvmlInit_v2 = dlsym(hn, "nvmlInit_v2");
    api.nvmlDeviceGetHandleByIndex_v2 = dlsym(hn, "nvmlDeviceGetHandleByIndex_v2");
    api.nvmlDeviceGetMemoryInfo = dlsym(hn, "nvmlDeviceGetMemoryInfo");
    api.nvmlDeviceGetMemoryInfo_v2 = dlsym(hn, "nvmlDeviceGetMemoryInfo_v2");
    api.nvmlDeviceGetComputeRunningProcesses_v3 = dlsym(hn, "nvmlDeviceGetComputeRunningProcesses_v3");
    if (!strcmp(mode, "dlsym")) {
#define F(n, b, fl) api.n = dlsym(h, #n);
        APIS(F)
#undef F
        api.cuCtxCreate_v2 = dlsym(h, "cuCtxCreate_v2");
        api.cuCtxCreate_v3 = dlsym(h, "cuCtxCreate_v3");
        api.cuCtxCreate_v4 = dlsym(h, "cuCtxCreate_v4");
        return;
    }
    /* procaddr: like cudart, fetch cuGetProcAddress_v2 by dlsym, everything else through it */
    __typeof__(&cuGetProcAddress_v2) gpa = dlsym(h, "cuGetProcAddress_v2");
    void *self = NULL;
    gpa("cuGetProcAddress", &self, g_version, 0, NULL);
    if (self) gpa = self; /* nested lookups go through what the driver (or shim) answered */
#define F(n, b, fl)                                                                                                   \
    {                                                                                                                 \
        CUdriverProcAddressQueryResult st;                                                                            \
        void *p = NULL;                                                                                               \
        if (gpa(b, &p, g_version, fl, &st) != CUDA_SUCCESS) { printf("error procaddr %s\n", b); exit(3); }          \
        api.n = p;                                                                                                    \
    }
    APIS(F)
#undef F
    gpa("cuCtxCreate", (void **)&api.cuCtxCreate_v2, 3020, 0, NULL);
    gpa("cuCtxCreate", (void **)&api.cuCtxCreate_v3, 11040, 0, NULL);
    gpa("cuCtxCreate", (void **)&api.cuCtxCreate_v4, 12050, 0, NULL);
}

static const char *owner(void *p)
{
    static char buf[512];
    Dl_info i;
    if (!p || !dladdr(p, &i) || !i.dli_fname) return "none";
    const char *b = strrchr(i.dli_fname, '/');
    snprintf(buf, sizeof buf, "%s:%s", b ? b + 1 : i.dli_fname, i.dli_sname ? i.dli_sname : "?");
    return buf;
}

struct handle { char kind[16]; uint64_t v; };
static struct handle g_h[4096];
static int g_nh;

static uint64_t parse_size(const char *s)
{
    char *e;
    uint64_t v = strtoull(s, &e, 10);
    if (*e == 'k') v <<= 10; else if (*e == 'm') v <<= 20; else if (*e == 'g') v <<= 30;
    return v;
}

/* Time is the stand-in driver's (tests/shim/csrc/fake_clock in fake_state.h): virtual under FAKE_VCLOCK=1, so the
   rates this program prints are measured on the same clock the driver runs kernels on and the shim limits by. */
static uint64_t (*g_clock_now)(void);
static void (*g_clock_sleep_until)(uint64_t);
static void clock_load(void)
{
    void *h = dlopen("libcuda.so.1", RTLD_NOW);
    g_clock_now = h ? (uint64_t (*)(void))dlsym(h, "fake_clock_mono_ns") : NULL;
    g_clock_sleep_until = h ? (void (*)(uint64_t))dlsym(h, "fake_clock_sleep_until") : NULL;
    if (!g_clock_now || !g_clock_sleep_until) { printf("error no fake_clock in libcuda.so.1\n"); exit(3); }
}
static int64_t now_ns(void) { return (int64_t)g_clock_now(); }
static void sleep_us(int64_t us) { g_clock_sleep_until((uint64_t)(now_ns() + us * 1000)); }

static CUresult do_alloc(const char *kind, uint64_t size, uint64_t *out)
{
    CUresult r;
    CUdeviceptr p = 0;
    if (!strcmp(kind, "mem")) r = api.cuMemAlloc_v2(&p, size);
    else if (!strcmp(kind, "managed")) r = api.cuMemAllocManaged(&p, size, 1);
    else if (!strcmp(kind, "pitch")) { size_t pitch; r = api.cuMemAllocPitch_v2(&p, &pitch, size / 1024, 1024, 4); }
    else if (!strcmp(kind, "async")) r = api.cuMemAllocAsync(&p, size, g_stream);
    else if (!strcmp(kind, "asyncptsz")) r = api.cuMemAllocAsync_ptsz(&p, size, NULL);
    else if (!strcmp(kind, "pool")) r = api.cuMemAllocFromPoolAsync(&p, size, (CUmemoryPool)0x1, g_stream);
    else if (!strcmp(kind, "vmm")) {
        CUmemAllocationProp prop;
        memset(&prop, 0, sizeof prop);
        prop.type = 1;
        prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
        prop.location.id = 0;
        CUmemGenericAllocationHandle h = 0;
        r = api.cuMemCreate(&h, size, &prop, 0);
        p = h;
    } else if (!strcmp(kind, "array")) {
        CUDA_ARRAY_DESCRIPTOR d = {size / 4096, 1024, 0x20, 1};
        CUarray a = NULL;
        r = api.cuArrayCreate_v2(&a, &d);
        p = (uint64_t)(uintptr_t)a;
    } else if (!strcmp(kind, "array3d")) {
        CUDA_ARRAY3D_DESCRIPTOR d = {size / (4096 * 4), 1024, 4, 0x20, 1, 0};
        CUarray a = NULL;
        r = api.cuArray3DCreate_v2(&a, &d);
        p = (uint64_t)(uintptr_t)a;
    } else if (!strcmp(kind, "mipmap")) {
        CUDA_ARRAY3D_DESCRIPTOR d = {size / 4096, 1024, 0, 0x20, 1, 0};
        CUmipmappedArray m = NULL;
        r = api.cuMipmappedArrayCreate(&m, &d, 4);
        p = (uint64_t)(uintptr_t)m;
    } else if (!strcmp(kind, "mipmap1d")) { /* a 1-D chain of 12 levels: nearly twice its base */
        CUDA_ARRAY3D_DESCRIPTOR d = {size / 4, 0, 0, 0x20, 1, 0};
        CUmipmappedArray m = NULL;
        r = api.cuMipmappedArrayCreate(&m, &d, 12);
        p = (uint64_t)(uintptr_t)m;
    } else { printf("error kind %s\n", kind); exit(3); }
    *out = p;
    return r;
}

static CUresult do_free(struct handle *h)
{
    const char *k = h->kind;
    if (!strcmp(k, "vmm")) return api.cuMemRelease(h->v);
    if (!strcmp(k, "array") || !strcmp(k, "array3d")) return api.cuArrayDestroy((CUarray)(uintptr_t)h->v);
    if (!strcmp(k, "mipmap") || !strcmp(k, "mipmap1d")) return api.cuMipmappedArrayDestroy((CUmipmappedArray)(uintptr_t)h->v);
    if (!strcmp(k, "async") || !strcmp(k, "pool")) return api.cuMemFreeAsync(h->v, g_stream);
    return api.cuMemFree_v2(h->v);
}

/* forgetat: what a tenant may do to its own region (mapped writable in its container): move the limiter's
   schedule back before every launch of a later run, as if it had used nothing */
static struct hamid_region *g_forge;

static CUresult launch(const char *variant, uint64_t us)
{
    if (g_forge) __atomic_store_n(&g_forge->devices[0].tat_ns, 0, __ATOMIC_RELAXED);
    CUfunction f = (CUfunction)(uintptr_t)us;
    if (!strcmp(variant, "k")) return api.cuLaunchKernel(f, 1, 1, 1, 1, 1, 1, 0, NULL, NULL, NULL);
    if (!strcmp(variant, "p")) return api.cuLaunchKernel_ptsz(f, 1, 1, 1, 1, 1, 1, 0, NULL, NULL, NULL);
    if (!strcmp(variant, "ex")) { CUlaunchConfig c = {1, 1, 1, 1, 1, 1, 0, NULL, NULL, 0}; return api.cuLaunchKernelEx(&c, f, NULL, NULL); }
    if (!strcmp(variant, "coop")) return api.cuLaunchCooperativeKernel(f, 1, 1, 1, 1, 1, 1, 0, NULL, NULL);
    if (!strcmp(variant, "graph")) return api.cuGraphLaunch((CUgraphExec)(uintptr_t)us, NULL);
    return CUDA_ERROR_INVALID_VALUE;
}

/* The shim's shape key (shim/src/limiter.c, key_kernel), copied to choose shapes whose keys collide. */
static uint64_t fmix(uint64_t k)
{
    k ^= k >> 33;
    k *= 0xff51afd7ed558ccdull;
    k ^= k >> 33;
    k *= 0xc4ceb9fe1a85ec53ull;
    k ^= k >> 33;
    return k ? k : 1;
}
static uint64_t shape_key(uint64_t f, unsigned gx)
{
    uint64_t k = fmix(f ^ 0x5bd1e995ull);
    k = fmix(k ^ ((uint64_t)gx | (uint64_t)1 << 32));
    k = fmix(k ^ (1ull | 1ull << 32));
    return fmix(k ^ (1ull | 1ull << 20));
}

/* stall: thread B launches on a stream whose launches cost 20 ms of CPU, each a new shape (so sampled);
   thread A, 100 ms in, launches once on a stream whose event records block for 1.5 s. */
static CUcontext g_stall_ctx;
static int g_stall_done; /* threads finished: the main thread waits for them asleep, not in a join, so that on the
                            virtual clock (where a thread blocked in a join would hold time still) time moves on */
static int64_t g_stall_longest;
static long g_stall_n;
static void *stall_b(void *arg)
{
    double secs = *(double *)arg;
    api.cuCtxSetCurrent(g_stall_ctx);
    CUstream sb;
    api.cuStreamCreate(&sb, 0);
    void (*set)(CUstream, unsigned, unsigned) = (void (*)(CUstream, unsigned, unsigned))dlsym(RTLD_DEFAULT, "fake_stream_set");
    set(sb, 0, 20000);
    int64_t t0 = now_ns(), t = t0;
    for (unsigned i = 1; t - t0 < (int64_t)(secs * 1e9); i++) {
        api.cuLaunchKernel((CUfunction)(uintptr_t)100, i, 1, 1, 1, 1, 1, 0, sb, NULL, NULL);
        int64_t t2 = now_ns();
        if (t2 - t > g_stall_longest) g_stall_longest = t2 - t;
        t = t2;
        g_stall_n++;
    }
    __atomic_add_fetch(&g_stall_done, 1, __ATOMIC_RELEASE);
    return NULL;
}
static void *stall_a(void *arg)
{
    (void)arg;
    api.cuCtxSetCurrent(g_stall_ctx);
    CUstream sa;
    api.cuStreamCreate(&sa, 0);
    void (*set)(CUstream, unsigned, unsigned) = (void (*)(CUstream, unsigned, unsigned))dlsym(RTLD_DEFAULT, "fake_stream_set");
    set(sa, 1500, 0);
    sleep_us(100000);
    api.cuLaunchKernel((CUfunction)(uintptr_t)50, 7, 1, 1, 1, 1, 1, 0, sa, NULL, NULL);
    __atomic_add_fetch(&g_stall_done, 1, __ATOMIC_RELEASE);
    return NULL;
}

/* at:<ms>:<file>:<text>: a thread that, ms after the command (on the process's clock), writes text and a newline
   to file: a test's change of the world (NVML's samples) at a set moment of a run, virtual or not. */
struct at_job { int64_t when; char path[256]; char text[128]; };
static void *at_main(void *arg)
{
    struct at_job *j = arg;
    g_clock_sleep_until((uint64_t)j->when);
    char tmp[300];
    snprintf(tmp, sizeof tmp, "%s.at", j->path);
    FILE *f = fopen(tmp, "w");
    if (f) {
        fprintf(f, "%s\n", j->text);
        fclose(f);
        rename(tmp, j->path); /* whole: a reader never sees half of it */
    }
    free(j);
    return NULL;
}

static int g_thread_iters;
static uint64_t g_thread_size;
static void *thread_main(void *arg)
{
    CUcontext c = arg;
    api.cuCtxSetCurrent(c);
    for (int i = 0; i < g_thread_iters; i++) {
        CUdeviceptr p;
        if (api.cuMemAlloc_v2(&p, g_thread_size) == CUDA_SUCCESS) api.cuMemFree_v2(p);
    }
    return NULL;
}

int main(int argc, char **argv)
{
    setvbuf(stdout, NULL, _IOLBF, 0);
    if (argc < 2) return 2;
    if (getenv("SHIMTEST_CUDA_VERSION")) g_version = atoi(getenv("SHIMTEST_CUDA_VERSION"));
    load(argv[1]);
    clock_load();
    CUcontext ctx = NULL, own = NULL;
    for (int i = 2; i < argc; i++) {
        char buf[512];
        snprintf(buf, sizeof buf, "%s", argv[i]);
        char *tok[6] = {0};
        int nt = 0;
        for (char *t = strtok(buf, ":"); t && nt < 6; t = strtok(NULL, ":")) tok[nt++] = t;
        const char *c = tok[0];
        if (!strcmp(c, "cuinit")) { /* cuInit alone: no primary context (a program that makes its own) */
            printf("cuinit %d\n", api.cuInit(0));
        } else if (!strcmp(c, "init")) {
            int dev = tok[1] ? atoi(tok[1]) : 0;
            CUresult r = api.cuInit(0);
            if (r == CUDA_SUCCESS) r = api.cuDevicePrimaryCtxRetain(&ctx, dev);
            if (r == CUDA_SUCCESS) r = api.cuCtxSetCurrent(ctx);
            api.cuStreamCreate(&g_stream, 0);
            printf("init %d\n", r);
        } else if (!strcmp(c, "alloc")) {
            int count = tok[3] ? atoi(tok[3]) : 1;
            for (int k = 0; k < count; k++) {
                uint64_t v = 0;
                CUresult r = do_alloc(tok[1], parse_size(tok[2]), &v);
                if (r == CUDA_SUCCESS) { snprintf(g_h[g_nh].kind, 16, "%s", tok[1]); g_h[g_nh++].v = v; }
                printf("alloc %s %s %d\n", tok[1], tok[2], r);
            }
        } else if (!strcmp(c, "free")) {
            int idx = atoi(tok[1]);
            printf("free %d %d\n", idx, do_free(&g_h[idx]));
        } else if (!strcmp(c, "freeall")) {
            int bad = 0;
            for (int k = 0; k < g_nh; k++) if (do_free(&g_h[k]) != CUDA_SUCCESS) bad++;
            g_nh = 0;
            printf("freeall %d\n", bad);
        } else if (!strcmp(c, "freebad")) {
            printf("freebad %d\n", api.cuMemFree_v2(0xdead0000ull));
        } else if (!strcmp(c, "meminfo")) {
            size_t f = 0, t = 0;
            CUresult r = api.cuMemGetInfo_v2(&f, &t);
            printf("meminfo %d %zu %zu\n", r, f, t);
        } else if (!strcmp(c, "totalmem")) {
            size_t t = 0;
            CUresult r = api.cuDeviceTotalMem_v2(&t, tok[1] ? atoi(tok[1]) : 0);
            printf("totalmem %d %zu\n", r, t);
        } else if (!strcmp(c, "nvml")) {
            nvmlDevice_t h;
            nvmlMemory_t m = {0, 0, 0};
            nvmlMemory_v2_t m2;
            memset(&m2, 0, sizeof m2);
            m2.version = nvmlMemory_v2;
            api.nvmlInit_v2();
            api.nvmlDeviceGetHandleByIndex_v2(tok[1] ? (unsigned)atoi(tok[1]) : 0, &h);
            int r1 = api.nvmlDeviceGetMemoryInfo(h, &m), r2 = api.nvmlDeviceGetMemoryInfo_v2(h, &m2);
            printf("nvml %d %llu %llu %llu\n", r1, m.total, m.used, m.free);
            printf("nvml2 %d %llu %llu %llu\n", r2, m2.total, m2.used, m2.free);
        } else if (!strcmp(c, "ctxcreate")) { /* ctxcreate[:dev[:v2|v3|v4]]: a context of its own, made current */
            int dev = tok[1] ? atoi(tok[1]) : 0;
            const char *abi = tok[2] ? tok[2] : "v2";
            CUresult r = !strcmp(abi, "v3")   ? api.cuCtxCreate_v3(&own, NULL, 0, 0, dev)
                         : !strcmp(abi, "v4") ? api.cuCtxCreate_v4(&own, NULL, 0, dev)
                                              : api.cuCtxCreate_v2(&own, 0, dev);
            printf("ctxcreate %d\n", r);
        } else if (!strcmp(c, "ctxdestroy")) { /* destroy it, back to the primary one */
            printf("ctxdestroy %d\n", api.cuCtxDestroy_v2(own));
            api.cuCtxSetCurrent(ctx);
        } else if (!strcmp(c, "nvmlprocs")) { /* NVML's per-process list of a device: "proc <pid> <bytes>" */
            nvmlDevice_t h;
            nvmlProcessInfo_t v[64];
            unsigned int n = 64;
            api.nvmlInit_v2();
            api.nvmlDeviceGetHandleByIndex_v2(tok[1] ? (unsigned)atoi(tok[1]) : 0, &h);
            int r = api.nvmlDeviceGetComputeRunningProcesses_v3(h, &n, v);
            for (unsigned int k = 0; r == 0 && k < n; k++) printf("proc %u %llu\n", v[k].pid, v[k].usedGpuMemory);
        } else if (!strcmp(c, "waitfile")) { /* like wait, for processes without a stdin of their own */
            printf("ready\n");
            fflush(stdout);
            while (access(tok[1], F_OK) != 0) usleep(10000);
        } else if (!strcmp(c, "wait")) {
            now_ns(); /* on the virtual clock, time waits for this thread (processes started together run together) */
            printf("ready\n");
            char line[64];
            if (!fgets(line, sizeof line, stdin)) return 0;
        } else if (!strcmp(c, "at")) {
            struct at_job *j = calloc(1, sizeof *j);
            j->when = now_ns() + (int64_t)atoi(tok[1]) * 1000000;
            snprintf(j->path, sizeof j->path, "%s", tok[2]);
            snprintf(j->text, sizeof j->text, "%s", tok[3] ? tok[3] : "");
            pthread_t t;
            pthread_create(&t, NULL, at_main, j);
            pthread_detach(t);
        } else if (!strcmp(c, "sleep")) {
            sleep_us((int64_t)atoi(tok[1]) * 1000);
        } else if (!strcmp(c, "kill")) {
            raise(SIGKILL);
        } else if (!strcmp(c, "exit")) {
            _exit(0);
        } else if (!strcmp(c, "fork")) {
            int j = i + 1;
            while (j < argc && strcmp(argv[j], "endfork")) j++;
            pid_t pid = fork();
            if (pid == 0) {
                printf("child %d\n", (int)getpid());
                i = i; /* child runs the commands up to endfork */
                continue;
            }
            int st;
            waitpid(pid, &st, 0);
            printf("forkdone %d\n", WIFEXITED(st) ? WEXITSTATUS(st) : -1);
            i = j;
        } else if (!strcmp(c, "endfork")) {
            fflush(stdout);
            _exit(0);
        } else if (!strcmp(c, "launch")) {
            int n = atoi(tok[1]);
            int64_t t0 = now_ns();
            int bad = 0;
            for (int k = 0; k < n; k++) if (launch(tok[3] ? tok[3] : "k", strtoull(tok[2], 0, 10)) != CUDA_SUCCESS) bad++;
            api.cuCtxSynchronize();
            printf("launch %d %d %lld\n", n, bad, (long long)(now_ns() - t0));
        } else if (!strcmp(c, "forgetat") || !strcmp(c, "forgemem")) {
            /* the container's region, mapped as the tenant can (CUDA_DEVICE_MEMORY_SHARED_CACHE names it) */
            const char *path = getenv("CUDA_DEVICE_MEMORY_SHARED_CACHE");
            int fd = path ? open(path, O_RDWR) : -1;
            void *m = fd < 0 ? MAP_FAILED : mmap(NULL, sizeof(struct hamid_region), PROT_READ | PROT_WRITE,
                                                 MAP_SHARED, fd, 0);
            if (fd >= 0) close(fd);
            if (m == MAP_FAILED) { printf("%s failed\n", c); return 3; }
            if (!strcmp(c, "forgetat")) {
                g_forge = m; /* rewound before every launch from now on */
            } else { /* no memory limit, nothing held: the container's total, every slot */
                struct hamid_region *r = m;
                __atomic_store_n(&r->devices[0].limit_bytes, 0, __ATOMIC_RELAXED);
                __atomic_store_n(&r->devices[0].used_bytes, 0, __ATOMIC_RELAXED);
                for (uint32_t i = 0; i < r->proc_high_water && i < HAMID_MAX_PROCS; i++) r->procs[i].used[0] = 0;
                munmap(m, sizeof *r);
            }
            printf("%s ok\n", c);
        } else if (!strcmp(c, "run")) {
            double secs = atof(tok[1]);
            uint64_t us = strtoull(tok[2], 0, 10);
            int64_t t0 = now_ns(), end = t0 + (int64_t)(secs * 1e9);
            long n = 0;
            int64_t longest = 0; /* the longest single launch call: how long the limiter held one back */
            for (int64_t t = t0; t < end; n++) {
                launch(tok[3] ? tok[3] : "k", us);
                int64_t t2 = now_ns();
                if (t2 - t > longest) longest = t2 - t;
                t = t2;
            }
            api.cuCtxSynchronize();
            printf("run %ld %lld %lld\n", n, (long long)(now_ns() - t0), (long long)longest);
        } else if (!strcmp(c, "pace")) {
            /* pace:<secs>:<us>:<gap_us>: a light but active stretch: one kernel, then gap_us of host time */
            int64_t end = now_ns() + (int64_t)(atof(tok[1]) * 1e9);
            uint64_t us = strtoull(tok[2], 0, 10);
            long n = 0;
            while (now_ns() < end) {
                launch(tok[4] ? tok[4] : "k", us);
                sleep_us(atoi(tok[3]));
                n++;
            }
            api.cuCtxSynchronize();
            printf("pace %ld\n", n);
        } else if (!strcmp(c, "persist")) {
            /* persist:<secs>:<us_lo>:<us_hi>: one kernel shape (function 77, one grid) whose work, passed as its
               argument, runs through 16 sizes from us_lo to us_hi in a scrambled order (a persistent GEMM of
               dynamic-shape inference); prints "persist <launches> <ns> <work_us>" */
            int64_t t0 = now_ns(), end = t0 + (int64_t)(atof(tok[1]) * 1e9);
            uint64_t lo = strtoull(tok[2], 0, 10), hi = strtoull(tok[3], 0, 10), work = 0;
            long k = 0;
            for (int64_t t = t0; t < end; k++) {
                uint32_t us = (uint32_t)(lo + (hi - lo) * (uint64_t)((k * 7) % 16) / 15);
                void *args[] = {&us};
                api.cuLaunchKernel((CUfunction)(uintptr_t)77, 64, 1, 1, 128, 1, 1, 0, NULL, args, NULL);
                work += us;
                t = now_ns();
            }
            api.cuCtxSynchronize();
            printf("persist %ld %lld %llu\n", k, (long long)(now_ns() - t0), (unsigned long long)work);
        } else if (!strcmp(c, "collide")) {
            /* collide:<shapes>:<us>:<secs>: that many shapes of one kernel (grid sizes) whose keys share their
               low 12 bits, launched in turn; prints like run */
            int want = atoi(tok[1]);
            uint64_t us = strtoull(tok[2], 0, 10);
            unsigned gx[1024];
            int n = 0;
            uint64_t low = shape_key(us, 1) & 4095;
            for (unsigned g = 1; n < want && n < 1024; g++)
                if ((shape_key(us, g) & 4095) == low) gx[n++] = g;
            int64_t t0 = now_ns(), end = t0 + (int64_t)(atof(tok[3]) * 1e9), longest = 0;
            long k = 0;
            for (int64_t t = t0; t < end; k++) {
                api.cuLaunchKernel((CUfunction)(uintptr_t)us, gx[k % n], 1, 1, 1, 1, 1, 0, NULL, NULL, NULL);
                int64_t t2 = now_ns();
                if (t2 - t > longest) longest = t2 - t;
                t = t2;
            }
            api.cuCtxSynchronize();
            printf("run %ld %lld %lld\n", k, (long long)(now_ns() - t0), (long long)longest);
        } else if (!strcmp(c, "stall")) {
            double secs = atof(tok[1]);
            g_stall_ctx = ctx;
            pthread_t a, b;
            pthread_create(&b, NULL, stall_b, &secs);
            pthread_create(&a, NULL, stall_a, NULL);
            while (__atomic_load_n(&g_stall_done, __ATOMIC_ACQUIRE) < 2) sleep_us(1000);
            pthread_join(b, NULL);
            pthread_join(a, NULL);
            printf("stall %ld %lld\n", g_stall_n, (long long)g_stall_longest);
        } else if (!strcmp(c, "capture")) {
            int n = atoi(tok[1]);
            CUstream s;
            api.cuStreamCreate(&s, 0);
            int64_t t0 = now_ns();
            CUresult r = api.cuStreamBeginCapture_v2(s, 0);
            for (int k = 0; k < n; k++) api.cuLaunchKernel((CUfunction)(uintptr_t)strtoull(tok[2], 0, 10), 1, 1, 1, 1, 1, 1, 0, s, NULL, NULL);
            CUgraph g;
            CUresult r2 = api.cuStreamEndCapture(s, &g);
            printf("capture %d %d %lld\n", r, r2, (long long)(now_ns() - t0));
        } else if (!strcmp(c, "threads")) {
            int n = atoi(tok[1]);
            g_thread_iters = atoi(tok[2]);
            g_thread_size = parse_size(tok[3]);
            pthread_t th[64];
            for (int k = 0; k < n; k++) pthread_create(&th[k], NULL, thread_main, ctx);
            for (int k = 0; k < n; k++) pthread_join(th[k], NULL);
            printf("threads done\n");
        } else if (!strcmp(c, "release")) {
            printf("release %d\n", api.cuDevicePrimaryCtxRelease_v2(0));
        } else if (!strcmp(c, "reset")) {
            printf("reset %d\n", api.cuDevicePrimaryCtxReset_v2(0));
        } else if (!strcmp(c, "procaddr")) {
            /* procaddr:<name>:<version>:<flags> -> rc, owner of the answer */
            void *h = dlopen("libcuda.so.1", RTLD_NOW);
            __typeof__(&cuGetProcAddress_v2) gpa = dlsym(h, "cuGetProcAddress_v2");
            void *p = NULL;
            CUdriverProcAddressQueryResult st = 99;
            CUresult r = gpa(tok[1], &p, atoi(tok[2]), tok[3] ? strtoull(tok[3], 0, 10) : 0, &st);
            printf("procaddr %s %s %d %d %s\n", tok[1], tok[2], r, (int)st, owner(p));
        } else if (!strcmp(c, "dlsymowner")) {
            /* dlsymowner:<lib>:<name> */
            void *h = dlopen(tok[1], RTLD_NOW);
            void *p = h ? dlsym(h, tok[2]) : NULL;
            printf("dlsymowner %s %s\n", tok[2], owner(p));
        } else if (!strcmp(c, "callfake")) {
            /* dlopen the unrelated library and call its cu-prefixed functions */
            void *h = dlopen(tok[1], RTLD_NOW);
            int (*a)(void) = h ? dlsym(h, "cudnnCreate") : NULL;
            int (*b)(void) = h ? dlsym(h, "cublasCreate_v2") : NULL;
            int (*d)(void) = h ? dlsym(h, "curl_easy_init") : NULL;
            int (*e)(void) = h ? dlsym(h, "cuMemAlloc_v2") : NULL; /* same name as a driver call, not the driver's */
            printf("callfake %d %d %d %d\n", a ? a() : -1, b ? b() : -1, d ? d() : -1, e ? e() : -1);
        } else if (!strcmp(c, "next")) {
            void *h = dlopen(tok[1], RTLD_NOW | RTLD_GLOBAL);
            int (*probe_via_next)(void) = h ? dlsym(h, "probe_via_next") : NULL;
            printf("next %d\n", probe_via_next ? probe_via_next() : -1);
        } else if (!strcmp(c, "lockdie")) {
            /* take the region's lock and die holding it */
            int fd = open(getenv("CUDA_DEVICE_MEMORY_SHARED_CACHE"), O_RDWR);
            struct hamid_region *r = mmap(NULL, sizeof *r, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
            pthread_mutex_lock((pthread_mutex_t *)(void *)r->lock_storage);
            printf("locked\n");
            fflush(stdout);
            _exit(0);
        } else {
            printf("error unknown %s\n", c);
            return 2;
        }
    }
    return 0;
}
