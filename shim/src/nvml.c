/*
 * nvml.c: the container's view through NVML, which is what nvidia-smi
 * inside the container shows. It owns the nvmlDeviceGetMemoryInfo and
 * nvmlDeviceGetMemoryInfo_v2 wrappers: on a device with a memory limit the
 * total is the limit, used is the container's usage from the region (after
 * reclaiming dead processes), free is what is left. Devices without a limit
 * are reported as the driver reports them. It never claims a process slot,
 * so an nvidia-smi run costs the region nothing.
 */
#include "shim.h"

static int container_view(nvmlDevice_t dev, uint64_t *limit, uint64_t *used)
{
    if (!region_ready() || !g_region) return 0;
    int rdev = dev_region_index_for_nvml(dev);
    if (rdev < 0) return 0;
    uint64_t lim = acct_limit(rdev);
    if (!lim) return 0;
    region_reclaim_dead();
    *limit = lim;
    *used = __atomic_load_n(&g_region->devices[rdev].used_bytes, __ATOMIC_RELAXED);
    return 1;
}

EXPORT nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t dev, nvmlMemory_t *mem)
{
    nvml_resolve();
    if (!g_nv.nvmlDeviceGetMemoryInfo) return 13; /* NVML_ERROR_FUNCTION_NOT_FOUND */
    nvmlReturn_t r = g_nv.nvmlDeviceGetMemoryInfo(dev, mem);
    uint64_t lim, used;
    if (r == NVML_SUCCESS && mem && container_view(dev, &lim, &used)) {
        mem->total = lim;
        mem->used = used;
        mem->free = lim > used ? lim - used : 0;
    }
    return r;
}

EXPORT nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t dev, nvmlMemory_v2_t *mem)
{
    nvml_resolve();
    if (!g_nv.nvmlDeviceGetMemoryInfo_v2) return 13;
    nvmlReturn_t r = g_nv.nvmlDeviceGetMemoryInfo_v2(dev, mem);
    uint64_t lim, used;
    if (r == NVML_SUCCESS && mem && container_view(dev, &lim, &used)) {
        mem->total = lim;
        mem->reserved = 0;
        mem->used = used;
        mem->free = lim > used ? lim - used : 0;
    }
    return r;
}
