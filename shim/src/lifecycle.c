/*
 * lifecycle.c: process-level events of the shim. It owns the fork handler
 * (a child is a new process: it gets its own slot on first use, none of the
 * parent's allocations, events or context counts) and nothing else. Loading
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
