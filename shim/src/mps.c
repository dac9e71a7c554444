/*
 * mps.c: an MPS client share's limits, handed to the CUDA driver. It owns
 * setting CUDA_MPS_ACTIVE_THREAD_PERCENTAGE, CUDA_MPS_PINNED_DEVICE_MEM_LIMIT
 * and CUDA_MPS_PIPE_DIRECTORY in the process's environment from the daemon's
 * limits file (HAMID_LIMITS_FLAG_MPS), overwriting whatever the workload put
 * there, right before the real cuInit: the driver reads them when it
 * connects to the MPS control daemon, so a process that sets
 * CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=100 itself, or one `docker exec`'d with no
 * variables, still gets its share. It also refuses CUDA when no control
 * daemon listens at the mounted pipe directory: the driver would otherwise
 * run the process without MPS, outside every partition.
 * It must not read limits from the environment or call the driver.
 */
#define _GNU_SOURCE
#include "shim.h"
#include "hamid_limits.h"

#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>

HIDDEN void mps_before_init(void)
{
    char buf[64 + HAMID_MAX_DEVICES * 32];
    snprintf(buf, sizeof buf, "%u", g_cfg.mps_thread_percent);
    setenv("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", buf, 1);
    size_t n = 0;
    buf[0] = 0;
    for (uint32_t i = 0; i < g_cfg.file_devices && i < HAMID_MAX_DEVICES; i++) {
        if (!g_cfg.mem_limit[i]) continue;
        /* MiB, rounded down: the driver takes <ordinal>=<n>M; the shim's own limit stays exact in bytes */
        n += (size_t)snprintf(buf + n, sizeof buf - n, "%s%u=%lluM", n ? "," : "", i,
                              (unsigned long long)(g_cfg.mem_limit[i] >> 20));
        if (n >= sizeof buf) break;
    }
    if (n) setenv("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT", buf, 1);
    else unsetenv("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT");
    setenv("CUDA_MPS_PIPE_DIRECTORY", HAMID_MPS_PIPE_DIR, 1);
    struct stat sb;
    if (stat(HAMID_MPS_PIPE_DIR "/control", &sb) != 0 || !S_ISSOCK(sb.st_mode)) {
        char why[256];
        snprintf(why, sizeof why, "this container is an MPS share but no MPS control daemon listens at %s/control "
                 "(hamid restarts it; retry)", HAMID_MPS_PIPE_DIR);
        shim_refuse(why);
    }
}
