/*
 * hamid_region.h: the layout of the shared region, one file per container,
 * shared by every process of the container that loads the shim and read
 * (read-only) by the hamid daemon through cffi.
 *
 * This header is the single source of truth for that layout. The block
 * between HAMID_CDEF_BEGIN and HAMID_CDEF_END is fed verbatim to cffi's cdef
 * by hamid/shimregion, so it holds only plain integer #defines and plain C
 * structs (no preprocessor conditionals, no attributes).
 *
 * ABI rules: the magic, abi_version and struct_size come first and never
 * move. New fields are only ever carved out of the `reserved` arrays (each
 * struct keeps its size), and abi_version is bumped when they are. A reader
 * accepts any file whose magic matches, whose abi_version it knows and whose
 * struct_size is at least its own sizeof. A field added in ABI n reads as 0
 * in a file an older shim wrote, and 0 always means "not set".
 * ABI 2 (shim 0.2): hamid_proc.nvml_pid, hamid_device.ctx_lock_storage.
 *
 * Concurrency: every field that the shim changes is changed under the
 * region's robust, process-shared mutex (lock_storage) or with atomic
 * builtins; readers without the lock read single aligned 64-bit words, which
 * are never torn on the supported targets (x86-64, aarch64).
 */
#ifndef HAMID_REGION_H
#define HAMID_REGION_H

#include <stdint.h>

/* HAMID_CDEF_BEGIN */
#define HAMID_REGION_MAGIC 0x48414d4944524731
#define HAMID_REGION_ABI_VERSION 2
#define HAMID_MAX_DEVICES 16
#define HAMID_MAX_PROCS 1024
#define HAMID_UUID_LEN 96

/* Per device, container-wide. 512 bytes. */
struct hamid_device {
    uint64_t limit_bytes;       /* memory limit; 0 = none */
    uint64_t used_bytes;        /* container total, changed under the lock */
    uint64_t peak_used_bytes;   /* high-water mark of used_bytes */
    uint64_t oom_count;         /* allocations refused by the limit */
    uint32_t sm_limit;          /* compute limit in percent; 0 = none */
    uint32_t flags;             /* bit 0: uuid is set */
    uint32_t cuda_ordinal_hint; /* CUDA ordinal in the last process that mapped it */
    uint32_t pad0;
    int64_t tat_ns;             /* limiter schedule, CLOCK_MONOTONIC ns (atomic) */
    uint64_t gpu_time_ns;       /* GPU time charged by the limiter (atomic) */
    uint64_t throttle_ns;       /* time launches were held back (atomic) */
    uint64_t last_kernel_realtime_ns; /* wall clock of a recent limited launch */
    uint64_t context_bytes;     /* measured per-process context size, 0 = unknown */
    uint64_t launches;          /* limited launches seen (atomic) */
    char uuid[96];              /* "GPU-..." as NVML prints it */
    uint64_t ctx_lock_storage[8]; /* ABI 2: robust, process-shared mutex, held while a process of the
                                     container creates its first context on this device */
    uint64_t reserved[32];
};

/* Per process. 512 bytes. A slot never moves while its process lives. */
struct hamid_proc {
    int32_t pid;                /* 0 = free; claimed under the lock */
    uint32_t flags;
    uint64_t start_time;        /* /proc/<pid>/stat starttime, guards pid reuse */
    uint64_t used[16];          /* bytes per device, context included */
    uint64_t context[16];       /* the context/overhead part of used[] */
    int32_t nvml_pid;           /* ABI 2: the pid NVML, called here, lists it by; 0 = not known yet */
    uint32_t pad0;
    uint64_t reserved[29];
};

struct hamid_region {
    uint64_t magic;             /* HAMID_REGION_MAGIC once initialised */
    uint32_t abi_version;
    uint32_t struct_size;       /* sizeof(struct hamid_region) of the writer */
    uint32_t device_count;      /* device slots with a limit or a user */
    uint32_t max_procs;         /* HAMID_MAX_PROCS */
    uint32_t proc_high_water;   /* slots [0, proc_high_water) may be in use */
    uint32_t init_pid;
    uint64_t created_realtime_ns;
    uint64_t generation;        /* bumped whenever a dead process is reclaimed */
    uint64_t reclaimed_procs;   /* dead processes reclaimed so far */
    uint64_t lock_storage[8];   /* robust, process-shared pthread_mutex_t */
    uint64_t reserved_hdr[17];
    struct hamid_device devices[16];
    struct hamid_proc procs[1024];
    uint64_t reserved_tail[512];
};
/* HAMID_CDEF_END */

#define HAMID_PROC_FLAG_ACTIVE 1u
#define HAMID_DEVICE_FLAG_UUID 1u

#ifndef __cplusplus
_Static_assert(sizeof(struct hamid_device) == 512, "hamid_device must stay 512 bytes");
_Static_assert(sizeof(struct hamid_proc) == 512, "hamid_proc must stay 512 bytes");
_Static_assert(__builtin_offsetof(struct hamid_region, lock_storage) % 8 == 0, "lock alignment");
_Static_assert(__builtin_offsetof(struct hamid_region, devices) == 256, "header must stay 256 bytes");
#endif

#endif
