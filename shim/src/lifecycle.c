/*
 * lifecycle.c: process-level events of the shim. It owns the fork handler
 * (a child is a new process: it gets its own slot on first use, none of the
 * parent's allocations, events or context counts) and the cuInit wrapper,
 * where a shim that must refuse CUDA (shim_refused(): a limit it cannot
 * parse, a limits file it must not trust) says so, and where an MPS share's
 * limits reach the driver (mps.c) before it initialises. Loading
 * the shim does no other work: everything else starts lazily on the first
 * intercepted call, so programs that never use CUDA pay nothing.
 */
#include "shim.h"

static void after_fork_child(void)
{
    region_after_fork_child();
    mem_after_fork_child();
    devmap_after_fork_child();
    limiter_after_fork_child();
    nvmlpid_after_fork_child();
}

__attribute__((constructor)) static void shim_loaded(void)
{
    pthread_atfork(NULL, NULL, after_fork_child);
}

/* CUDA initialisation: refused (CUDA_ERROR_NOT_INITIALIZED, the reason on stderr) when the limits cannot be known. */
EXPORT CUresult cuInit(unsigned int flags)
{
    ensure_cuda();
    if (g_cfg.from_file) acct_init(); /* the container's region must be usable: else refused here */
    if (g_cfg.mps) mps_before_init(); /* may refuse: no control daemon to hold the partition */
    if (UNLIKELY(shim_refused())) return CUDA_ERROR_NOT_INITIALIZED;
    if (UNLIKELY(!g_cu.cuInit)) return CUDA_ERROR_NOT_FOUND;
    return g_cu.cuInit(flags);
}
