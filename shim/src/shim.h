/*
 * shim.h: declarations shared by the shim's own C files (never installed).
 * It owns the table of real driver/NVML entry points, the process-wide
 * configuration read from the environment, and the prototypes each module
 * exports to the others. Nothing here is visible outside libvgpu.so.
 */
#ifndef HAMID_SHIM_H
#define HAMID_SHIM_H

#include <stdint.h>
#include <stddef.h>
#include <pthread.h>
#include "hamid_cuda.h"
#include "hamid_region.h"

#define HIDDEN __attribute__((visibility("hidden")))
#define EXPORT __attribute__((visibility("default")))
#define LIKELY(x) __builtin_expect(!!(x), 1)
#define UNLIKELY(x) __builtin_expect(!!(x), 0)

#ifndef HAMID_SHIM_VERSION
#define HAMID_SHIM_VERSION "0.0.0"
#endif

/* ---- logging (log.c) ---- */
extern HIDDEN int g_log_level; /* 0 quiet .. 4 debug */
HIDDEN void shim_log(int level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
#define LOG_ERR(...) do { if (g_log_level >= 1) shim_log(1, __VA_ARGS__); } while (0)
#define LOG_WARN(...) do { if (g_log_level >= 2) shim_log(2, __VA_ARGS__); } while (0)
#define LOG_INFO(...) do { if (g_log_level >= 3) shim_log(3, __VA_ARGS__); } while (0)
#define LOG_DEBUG(...) do { if (g_log_level >= 4) shim_log(4, __VA_ARGS__); } while (0)

/* ---- configuration (config.c) ---- */
#define HAMID_MAX_SLOTS 16
#define HAMID_POLICY_DEFAULT 0
#define HAMID_POLICY_FORCE 1
#define HAMID_POLICY_DISABLE 2
struct shim_config {
    uint64_t mem_limit[HAMID_MAX_DEVICES]; /* bytes, 0 = none */
    uint32_t sm_limit[HAMID_MAX_DEVICES];  /* percent, 0 = none */
    int any_sm_limit;
    int sm_observe_only;                   /* HAMID_SM_LIMIT_MODE=observe */
    int nvml_reconcile;                    /* HAMID_NVML_RECONCILE (default 1) */
    uint64_t context_bytes_override;       /* HAMID_CONTEXT_SIZE, 0 = measure */
    int64_t sm_ahead_ns;                   /* how far ahead launches may queue */
    /* Time slots (HAMID_SM_SLOTS[_i]): when set for a device, the container's
     * kernels run only inside these parts of every period, which the daemon
     * gives out so that containers on one GPU never overlap. Offsets in ns
     * within the period, sorted, disjoint. */
    int64_t sm_period_ns;                  /* HAMID_SM_PERIOD_US, default 100 ms */
    int sm_nslots[HAMID_MAX_DEVICES];
    int64_t sm_slot[HAMID_MAX_DEVICES][HAMID_MAX_SLOTS][2];
    char region_path[4096];
    /* The daemon's limits file (limits.c): when it was there, every limit
     * above came from it and none from the environment. */
    int from_file;
    uint32_t file_devices;                 /* devices the file lists */
    char file_uuid[HAMID_MAX_DEVICES][HAMID_UUID_LEN];
    int has_priority;
    int32_t priority;
    /* GPU_CORE_UTILIZATION_POLICY, HAMi's meaning: default limits only while
     * another container runs kernels on the GPU, force always, disable never
     * (then any_sm_limit is 0). */
    int sm_policy;                         /* HAMID_POLICY_* */
    /* Task priority, HAMi's meaning (0 high, 1 low, unset low): a container of the daemon's (limits file)
     * whose priority is not high takes the launch path's slow side, where launches wait while a
     * higher-priority container's process (the file's live hold_pids) runs kernels. */
    int hold_capable;
    /* The file's live part (ABI >= 2: hold_pids; ABI >= 3: share_milli) is re-read by the monitor. */
    int live_file;
    int live_others; /* ABI >= 4: the live part says whether another container launched kernels recently */
    /* Fail closed: a limit that cannot be parsed, or a limits file that is
     * there but not right, refuses CUDA (shim_refused()). */
    int refused;
    char refused_msg[1024];
    /* An MPS client share (HAMID_LIMITS_FLAG_MPS, file only): mps.c hands the
     * limits to the driver through its MPS variables; no time-slice limiter. */
    int mps;
    uint32_t mps_thread_percent;           /* 1..100 */
};
extern HIDDEN struct shim_config g_cfg;
HIDDEN void config_load(void);
HIDDEN int shim_refused(void);            /* 1: CUDA must be refused (the reason is on stderr, once) */
HIDDEN void shim_refuse(const char *why); /* refuse from now on (e.g. the limits' region cannot be opened) */
HIDDEN int parse_mem_size(const char *s, uint64_t *out);
struct hamid_limits;
HIDDEN int limits_read(struct hamid_limits *out, char *err, size_t errlen); /* 0 absent, 1 read, -1 refused */
HIDDEN const char *limits_path(void);
HIDDEN void mps_before_init(void);        /* mps.c: an MPS share's driver variables, set before the real cuInit */
/* clock.c: the shim's only clocks and sleeps (a test build takes them from the stand-in driver) */
HIDDEN uint64_t mono_ns(void);
HIDDEN uint64_t real_ns(void);
HIDDEN void sleep_until_ns(uint64_t t); /* until mono_ns() reads t */
HIDDEN void sleep_for_ns(uint64_t d);

/* ---- real entry points (resolve.c) ---- */
struct real_cuda {
    CUresult (*cuInit)(unsigned int);
    CUresult (*cuGetProcAddress)(const char *, void **, int, cuuint64_t);
    CUresult (*cuGetProcAddress_v2)(const char *, void **, int, cuuint64_t, CUdriverProcAddressQueryResult *);
    CUresult (*cuDeviceGetCount)(int *);
    CUresult (*cuDeviceGetUuid)(CUuuid *, CUdevice);
    CUresult (*cuDeviceGetUuid_v2)(CUuuid *, CUdevice);
    CUresult (*cuCtxGetDevice)(CUdevice *);
    CUresult (*cuCtxGetCurrent)(CUcontext *);
    CUresult (*cuStreamGetDevice)(CUstream, CUdevice *);
    CUresult (*cuStreamIsCapturing)(CUstream, CUstreamCaptureStatus *);
    CUresult (*cuStreamIsCapturing_ptsz)(CUstream, CUstreamCaptureStatus *);
    CUresult (*cuThreadExchangeStreamCaptureMode)(CUstreamCaptureMode *);
    CUresult (*cuEventCreate)(CUevent *, unsigned int);
    CUresult (*cuEventRecord)(CUevent, CUstream);
    CUresult (*cuEventQuery)(CUevent);
    CUresult (*cuEventElapsedTime)(float *, CUevent, CUevent);
    CUresult (*cuEventDestroy_v2)(CUevent);
    CUresult (*cuArrayGetMemoryRequirements)(CUDA_ARRAY_MEMORY_REQUIREMENTS *, CUarray, CUdevice);
    CUresult (*cuMipmappedArrayGetMemoryRequirements)(CUDA_ARRAY_MEMORY_REQUIREMENTS *, CUmipmappedArray, CUdevice);
    /* intercepted */
    CUresult (*cuMemAlloc_v2)(CUdeviceptr *, size_t);
    CUresult (*cuMemAllocPitch_v2)(CUdeviceptr *, size_t *, size_t, size_t, unsigned int);
    CUresult (*cuMemAllocManaged)(CUdeviceptr *, size_t, unsigned int);
    CUresult (*cuMemFree_v2)(CUdeviceptr);
    CUresult (*cuMemAllocAsync)(CUdeviceptr *, size_t, CUstream);
    CUresult (*cuMemAllocAsync_ptsz)(CUdeviceptr *, size_t, CUstream);
    CUresult (*cuMemAllocFromPoolAsync)(CUdeviceptr *, size_t, CUmemoryPool, CUstream);
    CUresult (*cuMemAllocFromPoolAsync_ptsz)(CUdeviceptr *, size_t, CUmemoryPool, CUstream);
    CUresult (*cuMemFreeAsync)(CUdeviceptr, CUstream);
    CUresult (*cuMemFreeAsync_ptsz)(CUdeviceptr, CUstream);
    CUresult (*cuMemCreate)(CUmemGenericAllocationHandle *, size_t, const CUmemAllocationProp *, unsigned long long);
    CUresult (*cuMemRelease)(CUmemGenericAllocationHandle);
    CUresult (*cuArrayCreate_v2)(CUarray *, const CUDA_ARRAY_DESCRIPTOR *);
    CUresult (*cuArray3DCreate_v2)(CUarray *, const CUDA_ARRAY3D_DESCRIPTOR *);
    CUresult (*cuArrayDestroy)(CUarray);
    CUresult (*cuMipmappedArrayCreate)(CUmipmappedArray *, const CUDA_ARRAY3D_DESCRIPTOR *, unsigned int);
    CUresult (*cuMipmappedArrayDestroy)(CUmipmappedArray);
    CUresult (*cuMemGetInfo_v2)(size_t *, size_t *);
    CUresult (*cuDeviceTotalMem_v2)(size_t *, CUdevice);
    CUresult (*cuDevicePrimaryCtxRetain)(CUcontext *, CUdevice);
    CUresult (*cuDevicePrimaryCtxRelease_v2)(CUdevice);
    CUresult (*cuDevicePrimaryCtxReset_v2)(CUdevice);
    CUresult (*cuCtxCreate_v2)(CUcontext *, unsigned int, CUdevice);
    CUresult (*cuCtxCreate_v3)(CUcontext *, CUexecAffinityParam *, int, unsigned int, CUdevice);
    CUresult (*cuCtxCreate_v4)(CUcontext *, CUctxCreateParams *, unsigned int, CUdevice);
    CUresult (*cuCtxDestroy_v2)(CUcontext);
    CUresult (*cuLaunchKernel)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, CUstream, void **, void **);
    CUresult (*cuLaunchKernel_ptsz)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, CUstream, void **, void **);
    CUresult (*cuLaunchKernelEx)(const CUlaunchConfig *, CUfunction, void **, void **);
    CUresult (*cuLaunchKernelEx_ptsz)(const CUlaunchConfig *, CUfunction, void **, void **);
    CUresult (*cuLaunchCooperativeKernel)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, CUstream, void **);
    CUresult (*cuLaunchCooperativeKernel_ptsz)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, CUstream, void **);
    CUresult (*cuGraphLaunch)(CUgraphExec, CUstream);
    CUresult (*cuGraphLaunch_ptsz)(CUgraphExec, CUstream);
    CUresult (*cuStreamBeginCapture_v2)(CUstream, int);
    CUresult (*cuStreamBeginCapture_ptsz)(CUstream, int);
    CUresult (*cuStreamBeginCapture_v2_ptsz)(CUstream, int);
    CUresult (*cuStreamBeginCaptureToGraph)(CUstream, CUgraph, const CUgraphNode *, const void *, size_t, int);
    CUresult (*cuStreamBeginCaptureToGraph_ptsz)(CUstream, CUgraph, const CUgraphNode *, const void *, size_t, int);
    CUresult (*cuStreamEndCapture)(CUstream, CUgraph *);
    CUresult (*cuStreamEndCapture_ptsz)(CUstream, CUgraph *);
};

struct real_nvml {
    nvmlReturn_t (*nvmlInit_v2)(void);
    nvmlReturn_t (*nvmlDeviceGetCount_v2)(unsigned int *);
    nvmlReturn_t (*nvmlDeviceGetHandleByIndex_v2)(unsigned int, nvmlDevice_t *);
    nvmlReturn_t (*nvmlDeviceGetUUID)(nvmlDevice_t, char *, unsigned int);
    nvmlReturn_t (*nvmlDeviceGetIndex)(nvmlDevice_t, unsigned int *);
    nvmlReturn_t (*nvmlDeviceGetComputeRunningProcesses_v3)(nvmlDevice_t, unsigned int *, nvmlProcessInfo_t *);
    nvmlReturn_t (*nvmlDeviceGetMemoryInfo)(nvmlDevice_t, nvmlMemory_t *);
    nvmlReturn_t (*nvmlDeviceGetMemoryInfo_v2)(nvmlDevice_t, nvmlMemory_v2_t *);
    nvmlReturn_t (*nvmlDeviceGetProcessUtilization)(nvmlDevice_t, nvmlProcessUtilizationSample_t *, unsigned int *,
                                                    unsigned long long);
    nvmlReturn_t (*nvmlDeviceGetSamples)(nvmlDevice_t, nvmlSamplingType_t, unsigned long long, nvmlValueType_t *,
                                         unsigned int *, nvmlSample_t *);
};

extern HIDDEN struct real_cuda g_cu;
extern HIDDEN struct real_nvml g_nv;
extern HIDDEN int g_cuda_ready;     /* real CUDA table resolved */
HIDDEN void cuda_resolve(void);     /* idempotent, thread-safe */
HIDDEN void nvml_resolve(void);     /* idempotent, thread-safe; may leave g_nv empty */
HIDDEN int nvml_ready(void);        /* NVML resolved and nvmlInit succeeded */
static inline void ensure_cuda(void) {
    if (UNLIKELY(!__atomic_load_n(&g_cuda_ready, __ATOMIC_ACQUIRE))) cuda_resolve();
}

/* ---- region and accounting (region.c) ---- */
extern HIDDEN struct hamid_region *g_region;
HIDDEN void acct_init(void);              /* idempotent: config, region, slot */
HIDDEN int region_ready(void);
HIDDEN int acct_reserve(int rdev, uint64_t bytes, int force); /* 0 ok, -1 over limit */
HIDDEN uint64_t acct_limit(int rdev); /* the container's memory limit on the device, 0 none */
HIDDEN void acct_release(int rdev, uint64_t bytes);
HIDDEN void acct_set_context(int rdev, uint64_t bytes);       /* replace this process's overhead */
HIDDEN int region_reclaim_dead(void);     /* returns number reclaimed */
HIDDEN uint64_t acct_proc_used(int rdev); /* this process's used[] */
HIDDEN uint64_t acct_proc_context(int rdev);
HIDDEN void region_after_fork_child(void);
HIDDEN void acct_set_nvml_pid(int32_t pid);       /* record this process's NVML pid in its slot */
HIDDEN int region_nvml_pid_taken(int32_t pid);    /* another live slot has this NVML pid */
HIDDEN int region_nvml_pid_ours(int32_t pid);     /* this container's: a live slot has this NVML pid */
HIDDEN int region_ctx_lock(int rdev, uint64_t timeout_ns); /* 0 taken; -1 not (timeout, no shared region) */
HIDDEN void region_ctx_unlock(int rdev, int locked);

/* ---- devices (devmap.c) ---- */
HIDDEN int dev_region_index(CUdevice cuda_ordinal);   /* -1 when out of range */
HIDDEN int dev_current_ordinal(void);                 /* -1 on failure */
HIDDEN int dev_single_device(void);                   /* 1 when the process sees exactly one */
HIDDEN int dev_region_index_for_nvml(nvmlDevice_t h); /* -1 when unknown */
HIDDEN int dev_nvml_handle(CUdevice ord, nvmlDevice_t *h); /* 0 ok, -1 no NVML or no such device */
HIDDEN void devmap_after_fork_child(void);

/* ---- memory (mem.c) ---- */
HIDDEN void mem_after_fork_child(void);
HIDDEN void mem_maybe_reconcile(int rdev, CUdevice ord);

/* ---- the pid NVML lists this process by (nvmlpid.c) ---- */
HIDDEN void *nvmlpid_before_context(CUdevice ord);  /* takes the device's context lock; NULL: nothing to learn */
HIDDEN void nvmlpid_after_context(void *token, CUdevice ord); /* the context exists now */
HIDDEN void nvmlpid_end(void *token);               /* releases the lock, frees the token */
HIDDEN int nvmlpid_usage(CUdevice ord, uint64_t *used); /* NVML's figure for this process; -1 unknown */
HIDDEN int32_t nvmlpid_self(void);                  /* the pid NVML lists this process by; 0 unknown */
HIDDEN void nvmlpid_after_fork_child(void);

/* ---- limiter (limiter.c) ---- */
HIDDEN void limiter_after_fork_child(void);
HIDDEN void limiter_monitor_poll(void);  /* one round of the monitor (tests call it directly) */
HIDDEN int limiter_contended(int rdev);
HIDDEN uint32_t limiter_k_gap(int rdev);
HIDDEN uint32_t limiter_k_all(int rdev);
HIDDEN uint32_t limiter_share(int rdev);

/* ---- hook table (resolve.c) ---- */
HIDDEN void *hook_for_real(const char *name, void *real_fn, int cuda_version, cuuint64_t flags);

#endif
