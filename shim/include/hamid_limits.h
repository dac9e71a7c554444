/*
 * hamid_limits.h: the container's limits file, written by the hamid daemon
 * (hamid/shimlimits, through cffi on this same header), owned by root and
 * mounted read-only into the container at HAMID_LIMITS_PATH. When it is there
 * the shim takes every limit from it and none from the environment, so no
 * process of the container can lift, change or switch off a limit it sets;
 * when it is absent (plain LD_PRELOAD, no daemon) the shim reads HAMi-core's
 * variables. A file that exists but is not exactly right refuses CUDA
 * initialisation (shim/src/limits.c says what "right" means).
 *
 * This header is the single source of truth for the format. The block between
 * HAMID_CDEF_BEGIN and HAMID_CDEF_END is fed verbatim to cffi's cdef, so it
 * holds only plain integer #defines and plain C structs.
 *
 * ABI rules (as hamid_region.h): magic, abi_version and struct_size come first
 * and never move; the file is exactly sizeof(struct hamid_limits) bytes and a
 * reader accepts only the magic, an abi_version it knows and its own size. New
 * fields are only carved out of the reserved arrays (sizes never change) and
 * abi_version is bumped when they are; 0 always means "not set" / "none".
 * ABI 2: sm_policy, devices[].hold_pids (a reader still accepts ABI 1 files,
 * which meant force and have no hold list).
 * ABI 3: devices[].share_milli (live, like hold_pids; 0 in older files).
 * ABI 4: devices[].others_active (live; was pad_dev, 0 in older files).
 * All integers are little-endian as the writer's machine stores them (the
 * daemon and the container share the host).
 */
#ifndef HAMID_LIMITS_H
#define HAMID_LIMITS_H

#include <stdint.h>

/* The fixed path inside the container. A production shim never reads another
   one (no environment variable chooses it); a test build may define it. */
#ifndef HAMID_LIMITS_PATH
#define HAMID_LIMITS_PATH "/usr/local/vgpu/hamid.limits"
#endif

/* Where an MPS container's GPU pipe directory is mounted. With
   HAMID_LIMITS_FLAG_MPS the shim points CUDA_MPS_PIPE_DIRECTORY here whatever
   the environment says, and refuses CUDA when no control daemon listens. */
#ifndef HAMID_MPS_PIPE_DIR
#define HAMID_MPS_PIPE_DIR "/run/hamid-mps"
#endif

/* HAMID_CDEF_BEGIN */
#define HAMID_LIMITS_MAGIC 0x48414d49444c4d31
#define HAMID_LIMITS_ABI_VERSION 4
#define HAMID_LIMITS_ABI_MIN 1
#define HAMID_LIMITS_POLICY_DEFAULT 0
#define HAMID_LIMITS_POLICY_FORCE 1
#define HAMID_LIMITS_POLICY_DISABLE 2
#define HAMID_LIMITS_MAX_DEVICES 16
#define HAMID_LIMITS_MAX_SLOTS 16
#define HAMID_LIMITS_MAX_HOLD 16
#define HAMID_LIMITS_UUID_LEN 96
#define HAMID_LIMITS_PATH_LEN 1024
#define HAMID_LIMITS_FLAG_PRIORITY 1
/* An MPS client share (one device): the shim sets CUDA_MPS_ACTIVE_THREAD_PERCENTAGE
   from devices[0].sm_percent (0: 100) and CUDA_MPS_PINNED_DEVICE_MEM_LIMIT from
   each device's memory_bytes before the driver initialises, forces
   CUDA_MPS_PIPE_DIRECTORY to HAMID_MPS_PIPE_DIR, and runs no compute limiter of its own
   (MPS partitions the SMs). A shim that predates it refuses the file (unknown flag). */
#define HAMID_LIMITS_FLAG_MPS 2
/* devices[].others_active: 0 = the daemon saw no other container on this GPU launch kernels within
   HAMID_LIMITS_ACTIVE_WINDOW_S seconds, 1 = it did (policy default: limit now) */
#define HAMID_LIMITS_ACTIVE_WINDOW_S 10
/* devices[].share_milli: 0 = none (the charge as the shim measures it), else
   HAMID_LIMITS_SHARE_MIN..HAMID_LIMITS_SHARE_MAX (1/1000; see hamid/shimlimits/live.py) */
#define HAMID_LIMITS_SHARE_MIN 250
#define HAMID_LIMITS_SHARE_MAX 4000
#define HAMID_LIMITS_SM_ENFORCE 0
#define HAMID_LIMITS_SM_OBSERVE 1

/* Per device, by CUDA ordinal inside the container (the i of
   CUDA_DEVICE_MEMORY_LIMIT_<i>). 256 bytes. */
struct hamid_limits_device {
    char uuid[96];              /* "GPU-..." as NVML prints it, NUL-terminated; "" = not named */
    uint64_t memory_bytes;      /* memory limit; 0 = none */
    uint32_t sm_percent;        /* compute limit, 1..99; 0 = none (MPS: the active thread percentage) */
    uint32_t nslots;            /* used entries of slots[]; 0 = no time slots */
    uint8_t slots[16][2];       /* [start, end) in percent of the period, sorted, disjoint, 0 <= start < end <= 100 */
    int32_t hold_pids[16];      /* HAMID_LIMITS_MAX_HOLD; ABI 2, live (the daemon rewrites it in place while the container runs): NVML
                                   pids of higher-priority containers' processes on this GPU; 0 = unused. While
                                   one of them runs kernels, this container's launches are held back. */
    uint32_t share_milli;       /* ABI 3, live (rewritten in place like hold_pids): while several containers
                                   time-share this GPU, the daemon's correction of this container's charge
                                   (1/1000: every kernel is charged its measured cost times share_milli/1000),
                                   learned from NVML's device-wide busy time against the sum of all the
                                   containers' accounting; 0 = none (alone, or nothing learned) */
    uint32_t others_active;     /* ABI 4, live: 1 while another container on this GPU launched kernels within
                                   HAMID_LIMITS_ACTIVE_WINDOW_S (the daemon's view: those containers' host pids
                                   in NVML's busy samples, their regions' launch stamps); 0 = not seen. Policy
                                   default limits while it is 1 (HAMi's recent_kernel rule) */
    uint64_t reserved[5];
};

struct hamid_limits {
    uint64_t magic;             /* HAMID_LIMITS_MAGIC */
    uint32_t abi_version;       /* HAMID_LIMITS_ABI_VERSION */
    uint32_t struct_size;       /* sizeof(struct hamid_limits) of the writer */
    uint32_t device_count;      /* devices[0 .. device_count) are the container's */
    uint32_t flags;             /* HAMID_LIMITS_FLAG_PRIORITY: priority is set; HAMID_LIMITS_FLAG_MPS: an MPS client */
    int32_t priority;           /* the task priority (CUDA_TASK_PRIORITY), when the flag says so */
    uint32_t sm_mode;           /* HAMID_LIMITS_SM_ENFORCE or HAMID_LIMITS_SM_OBSERVE */
    uint32_t sm_period_us;      /* the limiter's period (slots are parts of it), 1000..10000000 */
    uint32_t pad0;
    char region_path[1024];     /* the region file inside the container, absolute, NUL-terminated */
    uint32_t sm_policy;         /* ABI 2: GPU_CORE_UTILIZATION_POLICY, HAMID_LIMITS_POLICY_*; ABI 1 files: force */
    uint32_t pad1;
    uint64_t reserved_hdr[122];
    struct hamid_limits_device devices[16];
    uint64_t reserved_tail[256];
};
/* HAMID_CDEF_END */

#ifndef __cplusplus
_Static_assert(sizeof(struct hamid_limits_device) == 256, "hamid_limits_device must stay 256 bytes");
_Static_assert(__builtin_offsetof(struct hamid_limits, devices) == 2048, "the header must stay 2048 bytes");
_Static_assert(sizeof(struct hamid_limits) == 8192, "hamid_limits must stay 8192 bytes");
#endif

#endif
