/*
 * resolve.c: how programs reach the shim and how the shim reaches the real
 * driver. It owns: resolving the real libcuda.so.1 / libnvidia-ml.so.1 entry
 * points, the table of intercepted names, the exported dlsym() override, and
 * the cuGetProcAddress / cuGetProcAddress_v2 wrappers.
 *
 * Rules it keeps (HAMi-core's dlsym and cuGetProcAddress hooks taught them):
 *  - a wrapper is handed out only for a name in the table AND only when the
 *    address being replaced is the real driver's, so cudnn*, cublas*, curl*
 *    and anything else that starts with "cu" go through untouched;
 *  - cuGetProcAddress asks the real driver first, with the caller's version
 *    and flags, and swaps in the wrapper of exactly the variant the driver
 *    chose (identity of the real address); everything else is returned as
 *    the driver answered;
 *  - dlsym(RTLD_NEXT, ...) is a tail call, so the caller's identity (which
 *    RTLD_NEXT depends on) is preserved;
 *  - nothing here calls into the driver from dlsym, so loading the shim into
 *    a program that never uses CUDA costs nothing.
 */
#define _GNU_SOURCE
#include "shim.h"

#include <dlfcn.h>
#include <string.h>

HIDDEN struct real_cuda g_cu;
HIDDEN struct real_nvml g_nv;
HIDDEN int g_cuda_ready;

typedef void *(*dlsym_fn)(void *, const char *);
static dlsym_fn g_real_dlsym;

static dlsym_fn real_dlsym(void)
{
    dlsym_fn f = __atomic_load_n(&g_real_dlsym, __ATOMIC_ACQUIRE);
    if (LIKELY(f)) return f;
    static const char *versions[] = {"GLIBC_2.34", "GLIBC_2.2.5", "GLIBC_2.17", "GLIBC_2.0", NULL};
    for (int i = 0; versions[i] && !f; i++) f = (dlsym_fn)dlvsym(RTLD_NEXT, "dlsym", versions[i]);
    __atomic_store_n(&g_real_dlsym, f, __ATOMIC_RELEASE);
    return f;
}

/* ---- the table of intercepted names ---- */

/* Wrappers, defined in mem.c, limiter.c, nvml.c and below. */
#define W(name) extern __typeof__(*g_cu.name) name;
W(cuMemAlloc_v2) W(cuMemAllocPitch_v2) W(cuMemAllocManaged) W(cuMemFree_v2)
W(cuMemAllocAsync) W(cuMemAllocAsync_ptsz) W(cuMemAllocFromPoolAsync) W(cuMemAllocFromPoolAsync_ptsz)
W(cuMemFreeAsync) W(cuMemFreeAsync_ptsz) W(cuMemCreate) W(cuMemRelease)
W(cuArrayCreate_v2) W(cuArray3DCreate_v2) W(cuArrayDestroy) W(cuMipmappedArrayCreate) W(cuMipmappedArrayDestroy)
W(cuMemGetInfo_v2) W(cuDeviceTotalMem_v2)
W(cuDevicePrimaryCtxRetain) W(cuDevicePrimaryCtxRelease_v2) W(cuDevicePrimaryCtxReset_v2)
W(cuCtxCreate_v2) W(cuCtxCreate_v3) W(cuCtxCreate_v4) W(cuCtxDestroy_v2)
W(cuLaunchKernel) W(cuLaunchKernel_ptsz) W(cuLaunchKernelEx) W(cuLaunchKernelEx_ptsz)
W(cuLaunchCooperativeKernel) W(cuLaunchCooperativeKernel_ptsz) W(cuGraphLaunch) W(cuGraphLaunch_ptsz)
W(cuStreamBeginCapture_v2) W(cuStreamBeginCapture_ptsz) W(cuStreamBeginCapture_v2_ptsz)
W(cuStreamBeginCaptureToGraph) W(cuStreamBeginCaptureToGraph_ptsz) W(cuStreamEndCapture) W(cuStreamEndCapture_ptsz)
W(cuGetProcAddress) W(cuGetProcAddress_v2) W(cuInit)
#undef W
extern __typeof__(*g_nv.nvmlDeviceGetMemoryInfo) nvmlDeviceGetMemoryInfo;
extern __typeof__(*g_nv.nvmlDeviceGetMemoryInfo_v2) nvmlDeviceGetMemoryInfo_v2;

struct hook {
    const char *name;   /* exported name, as dlsym sees it */
    const char *base;   /* name as cuGetProcAddress is asked for it; NULL: never by that route */
    int min_version;    /* first CUDA version whose ABI for `base` is this variant */
    int ptsz;           /* per-thread default stream variant */
    int nvml;           /* lives in libnvidia-ml */
    void **real;
    void *wrap;
};

#define H(n, b, v, p) {#n, b, v, p, 0, (void **)&g_cu.n, (void *)n}
static const struct hook g_hooks[] = {
    H(cuGetProcAddress, "cuGetProcAddress", 11030, 0),
    H(cuGetProcAddress_v2, "cuGetProcAddress", 12000, 0),
    H(cuInit, "cuInit", 2000, 0),
    H(cuMemAlloc_v2, "cuMemAlloc", 3020, 0),
    H(cuMemAllocPitch_v2, "cuMemAllocPitch", 3020, 0),
    H(cuMemAllocManaged, "cuMemAllocManaged", 6000, 0),
    H(cuMemFree_v2, "cuMemFree", 3020, 0),
    H(cuMemAllocAsync, "cuMemAllocAsync", 11020, 0),
    H(cuMemAllocAsync_ptsz, "cuMemAllocAsync", 11020, 1),
    H(cuMemAllocFromPoolAsync, "cuMemAllocFromPoolAsync", 11020, 0),
    H(cuMemAllocFromPoolAsync_ptsz, "cuMemAllocFromPoolAsync", 11020, 1),
    H(cuMemFreeAsync, "cuMemFreeAsync", 11020, 0),
    H(cuMemFreeAsync_ptsz, "cuMemFreeAsync", 11020, 1),
    H(cuMemCreate, "cuMemCreate", 10020, 0),
    H(cuMemRelease, "cuMemRelease", 10020, 0),
    H(cuArrayCreate_v2, "cuArrayCreate", 3020, 0),
    H(cuArray3DCreate_v2, "cuArray3DCreate", 3020, 0),
    H(cuArrayDestroy, "cuArrayDestroy", 2000, 0),
    H(cuMipmappedArrayCreate, "cuMipmappedArrayCreate", 5000, 0),
    H(cuMipmappedArrayDestroy, "cuMipmappedArrayDestroy", 5000, 0),
    H(cuMemGetInfo_v2, "cuMemGetInfo", 3020, 0),
    H(cuDeviceTotalMem_v2, "cuDeviceTotalMem", 3020, 0),
    H(cuDevicePrimaryCtxRetain, "cuDevicePrimaryCtxRetain", 7000, 0),
    H(cuDevicePrimaryCtxRelease_v2, "cuDevicePrimaryCtxRelease", 11000, 0),
    H(cuDevicePrimaryCtxReset_v2, "cuDevicePrimaryCtxReset", 11000, 0),
    H(cuCtxCreate_v2, "cuCtxCreate", 3020, 0),
    H(cuCtxCreate_v3, "cuCtxCreate", 11040, 0),
    H(cuCtxCreate_v4, "cuCtxCreate", 12050, 0),
    H(cuCtxDestroy_v2, "cuCtxDestroy", 4000, 0),
    H(cuLaunchKernel, "cuLaunchKernel", 4000, 0),
    H(cuLaunchKernel_ptsz, "cuLaunchKernel", 7000, 1),
    H(cuLaunchKernelEx, "cuLaunchKernelEx", 11060, 0),
    H(cuLaunchKernelEx_ptsz, "cuLaunchKernelEx", 11060, 1),
    H(cuLaunchCooperativeKernel, "cuLaunchCooperativeKernel", 9000, 0),
    H(cuLaunchCooperativeKernel_ptsz, "cuLaunchCooperativeKernel", 9000, 1),
    H(cuGraphLaunch, "cuGraphLaunch", 10000, 0),
    H(cuGraphLaunch_ptsz, "cuGraphLaunch", 10000, 1),
    H(cuStreamBeginCapture_v2, "cuStreamBeginCapture", 10010, 0),
    H(cuStreamBeginCapture_v2_ptsz, "cuStreamBeginCapture", 10010, 1),
    H(cuStreamBeginCapture_ptsz, NULL, 0, 1),
    H(cuStreamBeginCaptureToGraph, "cuStreamBeginCaptureToGraph", 12030, 0),
    H(cuStreamBeginCaptureToGraph_ptsz, "cuStreamBeginCaptureToGraph", 12030, 1),
    H(cuStreamEndCapture, "cuStreamEndCapture", 10000, 0),
    H(cuStreamEndCapture_ptsz, "cuStreamEndCapture", 10000, 1),
    {"nvmlDeviceGetMemoryInfo", NULL, 0, 0, 1, (void **)&g_nv.nvmlDeviceGetMemoryInfo, (void *)nvmlDeviceGetMemoryInfo},
    {"nvmlDeviceGetMemoryInfo_v2", NULL, 0, 0, 1, (void **)&g_nv.nvmlDeviceGetMemoryInfo_v2, (void *)nvmlDeviceGetMemoryInfo_v2},
};
#undef H
#define NHOOKS (sizeof g_hooks / sizeof g_hooks[0])

/* The newest CUDA version whose ABI choices the fallback table knows. */
#define KNOWN_MAX_CUDA_VERSION 13999

static const struct hook *hook_by_name(const char *name)
{
    for (size_t i = 0; i < NHOOKS; i++)
        if (strcmp(g_hooks[i].name, name) == 0) return &g_hooks[i];
    return NULL;
}

/* Non-intercepted entry points the shim itself uses. */
struct plain { const char *name; void **slot; };
#define P(n) {#n, (void **)&g_cu.n}
static const struct plain g_plain[] = {
    P(cuDeviceGetCount), P(cuDeviceGetUuid), P(cuDeviceGetUuid_v2), P(cuCtxGetDevice), P(cuCtxGetCurrent),
    P(cuStreamGetDevice), P(cuStreamIsCapturing), P(cuStreamIsCapturing_ptsz),
    P(cuThreadExchangeStreamCaptureMode), P(cuEventCreate), P(cuEventRecord), P(cuEventQuery),
    P(cuEventElapsedTime), P(cuEventDestroy_v2), P(cuArrayGetMemoryRequirements),
    P(cuMipmappedArrayGetMemoryRequirements),
};
#undef P

static pthread_once_t g_cuda_once = PTHREAD_ONCE_INIT;

static void cuda_resolve_once(void)
{
    config_load();
    dlsym_fn ds = real_dlsym();
    void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NODELETE);
    if (!h || !ds) {
        LOG_ERR("cannot load the real libcuda.so.1 (%s); CUDA calls will fail", h ? "no dlsym" : dlerror());
        __atomic_store_n(&g_cuda_ready, 1, __ATOMIC_RELEASE);
        return;
    }
    for (size_t i = 0; i < NHOOKS; i++)
        if (!g_hooks[i].nvml) *g_hooks[i].real = ds(h, g_hooks[i].name);
    for (size_t i = 0; i < sizeof g_plain / sizeof g_plain[0]; i++) *g_plain[i].slot = ds(h, g_plain[i].name);
    if (!g_cu.cuEventElapsedTime) g_cu.cuEventElapsedTime = (__typeof__(g_cu.cuEventElapsedTime))ds(h, "cuEventElapsedTime_v2");
    LOG_DEBUG("resolved the real driver (shim %s)", HAMID_SHIM_VERSION);
    __atomic_store_n(&g_cuda_ready, 1, __ATOMIC_RELEASE);
}

HIDDEN void cuda_resolve(void)
{
    pthread_once(&g_cuda_once, cuda_resolve_once);
}

static pthread_once_t g_nvml_once = PTHREAD_ONCE_INIT;
static pthread_once_t g_nvml_init_once = PTHREAD_ONCE_INIT;
static int g_nvml_ok;

static void nvml_resolve_once(void)
{
    config_load();
    dlsym_fn ds = real_dlsym();
    void *h = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_NODELETE);
    if (!h || !ds) {
        LOG_DEBUG("no libnvidia-ml.so.1: NVML features off");
        return;
    }
#define N(n) g_nv.n = (__typeof__(g_nv.n))ds(h, #n)
    N(nvmlInit_v2); N(nvmlDeviceGetCount_v2); N(nvmlDeviceGetHandleByIndex_v2); N(nvmlDeviceGetUUID);
    N(nvmlDeviceGetIndex); N(nvmlDeviceGetComputeRunningProcesses_v3); N(nvmlDeviceGetMemoryInfo);
    N(nvmlDeviceGetMemoryInfo_v2); N(nvmlDeviceGetProcessUtilization); N(nvmlDeviceGetSamples);
#undef N
}

HIDDEN void nvml_resolve(void)
{
    pthread_once(&g_nvml_once, nvml_resolve_once);
}

static void nvml_init_once(void)
{
    nvml_resolve();
    if (g_nv.nvmlInit_v2 && g_nv.nvmlInit_v2() == NVML_SUCCESS) g_nvml_ok = 1;
}

HIDDEN int nvml_ready(void)
{
    pthread_once(&g_nvml_init_once, nvml_init_once);
    return g_nvml_ok;
}

/*
 * Given the address the real driver handed out for `name` (via
 * cuGetProcAddress), return our wrapper of that exact variant, or the real
 * address when we do not intercept it.
 */
HIDDEN void *hook_for_real(const char *name, void *real_fn, int cuda_version, cuuint64_t flags)
{
    if (!name || !real_fn || name[0] != 'c' || name[1] != 'u') return real_fn;
    for (size_t i = 0; i < NHOOKS; i++)
        if (!g_hooks[i].nvml && *g_hooks[i].real == real_fn) return g_hooks[i].wrap;
    /*
     * The driver answered with an address we did not resolve by name. Only
     * when the name is ours and the version is one whose ABI we know do we
     * choose the variant ourselves (the wrapper calls the exported variant
     * of the same ABI); otherwise the driver's answer stands.
     */
    if (cuda_version <= 0 || cuda_version > KNOWN_MAX_CUDA_VERSION) return real_fn;
    int want_ptsz = (flags & CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM) ? 1 : 0;
    const struct hook *best = NULL;
    for (size_t i = 0; i < NHOOKS; i++) {
        const struct hook *h = &g_hooks[i];
        if (!h->base || h->ptsz != want_ptsz || h->min_version > cuda_version) continue;
        if (strcmp(h->base, name) != 0) continue;
        if (!best || h->min_version > best->min_version) best = h;
    }
    if (best && *best->real) {
        LOG_DEBUG("cuGetProcAddress(%s, %d): unknown driver address, using %s", name, cuda_version, best->name);
        return best->wrap;
    }
    return real_fn;
}

static int from_driver_library(void *addr, int nvml)
{
    Dl_info info;
    if (!dladdr(addr, &info) || !info.dli_fname) return 0;
    const char *base = strrchr(info.dli_fname, '/');
    base = base ? base + 1 : info.dli_fname;
    const char *want = nvml ? "libnvidia-ml.so" : "libcuda.so";
    return strncmp(base, want, strlen(want)) == 0;
}

static void *dlsym_filter(const char *name, void *r)
{
    const struct hook *h = hook_by_name(name);
    if (!h || r == h->wrap) return r;
    if (!from_driver_library(r, h->nvml)) return r; /* someone else's function of that name */
    return h->wrap;
}

/* Every lookup but RTLD_NEXT: the real answer, with driver functions swapped for wrappers. */
HIDDEN void *hamid_dlsym_impl(void *handle, const char *name)
{
    dlsym_fn real = real_dlsym();
    void *r = real(handle, name);
    if (r && ((name[0] == 'c' && name[1] == 'u') || (name[0] == 'n' && name[1] == 'v')))
        return dlsym_filter(name, r);
    return r;
}

HIDDEN void *hamid_real_dlsym_addr(void) { return (void *)real_dlsym(); }

/*
 * The exported dlsym. RTLD_NEXT is resolved relative to the *calling* object
 * (glibc looks at the return address), so for it we jump, not call, into the
 * real dlsym: the caller's return address stays on the stack untouched. Done
 * in assembly so that no compiler setting can turn the jump into a call.
 */
#if defined(__x86_64__)
__asm__(".text\n"
        ".globl dlsym\n"
        ".type dlsym,@function\n"
        "dlsym:\n"
        "    cmpq $-1, %rdi\n"
        "    jne hamid_dlsym_impl\n"
        "    pushq %rdi\n"
        "    pushq %rsi\n"
        "    subq $8, %rsp\n"
        "    call hamid_real_dlsym_addr\n"
        "    addq $8, %rsp\n"
        "    popq %rsi\n"
        "    popq %rdi\n"
        "    jmp *%rax\n"
        ".size dlsym, .-dlsym\n");
#elif defined(__aarch64__)
__asm__(".text\n"
        ".globl dlsym\n"
        ".type dlsym,%function\n"
        "dlsym:\n"
        "    cmn x0, #1\n"
        "    b.ne hamid_dlsym_impl\n"
        "    stp x29, x30, [sp, #-32]!\n"
        "    stp x0, x1, [sp, #16]\n"
        "    bl hamid_real_dlsym_addr\n"
        "    mov x16, x0\n"
        "    ldp x0, x1, [sp, #16]\n"
        "    ldp x29, x30, [sp], #32\n"
        "    br x16\n"
        ".size dlsym, .-dlsym\n");
#else
EXPORT void *dlsym(void *handle, const char *name)
{
    if (handle == RTLD_NEXT) return real_dlsym()(handle, name); /* relies on the compiler's tail call */
    return hamid_dlsym_impl(handle, name);
}
#endif

EXPORT CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int cudaVersion, cuuint64_t flags,
                                    CUdriverProcAddressQueryResult *symbolStatus)
{
    ensure_cuda();
    if (!g_cu.cuGetProcAddress_v2) return CUDA_ERROR_NOT_FOUND;
    CUresult r = g_cu.cuGetProcAddress_v2(symbol, pfn, cudaVersion, flags, symbolStatus);
    if (r == CUDA_SUCCESS && pfn && *pfn) *pfn = hook_for_real(symbol, *pfn, cudaVersion, flags);
    return r;
}

EXPORT CUresult cuGetProcAddress(const char *symbol, void **pfn, int cudaVersion, cuuint64_t flags)
{
    ensure_cuda();
    if (!g_cu.cuGetProcAddress) return CUDA_ERROR_NOT_FOUND;
    CUresult r = g_cu.cuGetProcAddress(symbol, pfn, cudaVersion, flags);
    if (r == CUDA_SUCCESS && pfn && *pfn) *pfn = hook_for_real(symbol, *pfn, cudaVersion, flags);
    return r;
}

/* Lets `strings`/dlsym tell which shim a process runs. */
EXPORT const char hamid_shim_version[] = HAMID_SHIM_VERSION;
