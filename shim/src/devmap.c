/*
 * devmap.c: which region device slot a CUDA ordinal or an NVML handle is.
 * It owns the mapping CUDA ordinal -> container device index, made by
 * matching device UUIDs against the limits file's, else NVML's (so an application that sets
 * CUDA_VISIBLE_DEVICES inside the container still charges the right device,
 * hami-core.md §5 "device-index hazard"), with the identity mapping when NVML
 * is absent; and the "current device" lookup used on the allocation and
 * launch paths (no driver call at all when the process sees one device);
 * and the NVML handle of a CUDA ordinal.
 */
#include "shim.h"

#include <stdio.h>
#include <string.h>

static int g_map[HAMID_MAX_DEVICES];
static int g_count = -1;              /* CUDA devices seen, -1 = not mapped yet */
static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;

static void uuid_string(const CUuuid *u, char *out, size_t n)
{
    const unsigned char *b = (const unsigned char *)u->bytes;
    snprintf(out, n, "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", b[0], b[1], b[2],
             b[3], b[4], b[5], b[6], b[7], b[8], b[9], b[10], b[11], b[12], b[13], b[14], b[15]);
}

static void build_map_locked(void)
{
    ensure_cuda();
    int n = 0;
    if (!g_cu.cuDeviceGetCount || g_cu.cuDeviceGetCount(&n) != CUDA_SUCCESS) return; /* try again later */
    if (n > HAMID_MAX_DEVICES) n = HAMID_MAX_DEVICES;
    char nv_uuid[HAMID_MAX_DEVICES][HAMID_UUID_LEN];
    unsigned int nv_count = 0;
    memset(nv_uuid, 0, sizeof nv_uuid);
    if (nvml_ready() && g_nv.nvmlDeviceGetCount_v2 && g_nv.nvmlDeviceGetCount_v2(&nv_count) == NVML_SUCCESS) {
        if (nv_count > HAMID_MAX_DEVICES) nv_count = HAMID_MAX_DEVICES;
        for (unsigned int i = 0; i < nv_count; i++) {
            nvmlDevice_t h;
            if (g_nv.nvmlDeviceGetHandleByIndex_v2(i, &h) == NVML_SUCCESS)
                g_nv.nvmlDeviceGetUUID(h, nv_uuid[i], HAMID_UUID_LEN);
        }
    } else {
        nv_count = 0;
    }
    region_ready();
    for (int c = 0; c < n; c++) {
        char u[HAMID_UUID_LEN] = "";
        CUuuid cu;
        CUresult r = CUDA_ERROR_NOT_FOUND;
        if (g_cu.cuDeviceGetUuid_v2) r = g_cu.cuDeviceGetUuid_v2(&cu, c);
        if (r != CUDA_SUCCESS && g_cu.cuDeviceGetUuid) r = g_cu.cuDeviceGetUuid(&cu, c);
        if (r == CUDA_SUCCESS) uuid_string(&cu, u, sizeof u);
        int idx = c, named = 0;
        /* The daemon's limits file names each device's UUID: that decides. */
        for (uint32_t i = 0; u[0] && g_cfg.from_file && i < g_cfg.file_devices; i++)
            if (strcmp(u, g_cfg.file_uuid[i]) == 0) { idx = (int)i; named = 1; break; }
        for (unsigned int i = 0; u[0] && !named && i < nv_count; i++)
            if (strcmp(u, nv_uuid[i]) == 0) { idx = (int)i; break; }
        g_map[c] = idx;
        if (g_region && u[0]) {
            struct hamid_device *d = &g_region->devices[idx];
            if (!(__atomic_load_n(&d->flags, __ATOMIC_ACQUIRE) & HAMID_DEVICE_FLAG_UUID)) {
                snprintf(d->uuid, sizeof d->uuid, "%s", u);
                __atomic_fetch_or(&d->flags, HAMID_DEVICE_FLAG_UUID, __ATOMIC_RELEASE);
            }
            d->cuda_ordinal_hint = (uint32_t)c;
        }
        if (g_region) {
            uint32_t want = (uint32_t)idx + 1, have = __atomic_load_n(&g_region->device_count, __ATOMIC_RELAXED);
            while (have < want && !__atomic_compare_exchange_n(&g_region->device_count, &have, want, 0,
                                                               __ATOMIC_RELAXED, __ATOMIC_RELAXED)) {
            }
        }
        LOG_DEBUG("CUDA device %d (%s) is container device %d", c, u, idx);
    }
    __atomic_store_n(&g_count, n, __ATOMIC_RELEASE);
}

static int ensure_map(void)
{
    int n = __atomic_load_n(&g_count, __ATOMIC_ACQUIRE);
    if (LIKELY(n >= 0)) return n;
    pthread_mutex_lock(&g_mu);
    if (g_count < 0) build_map_locked();
    n = g_count;
    pthread_mutex_unlock(&g_mu);
    return n;
}

HIDDEN int dev_region_index(CUdevice ord)
{
    if (ord < 0 || ord >= HAMID_MAX_DEVICES) return -1;
    int n = ensure_map();
    if (n < 0) return ord; /* driver not ready: identity */
    if (ord >= n) return -1;
    return g_map[ord];
}

HIDDEN int dev_single_device(void)
{
    return ensure_map() == 1;
}

HIDDEN int dev_current_ordinal(void)
{
    if (ensure_map() == 1) return 0;
    CUdevice d;
    if (!g_cu.cuCtxGetDevice || g_cu.cuCtxGetDevice(&d) != CUDA_SUCCESS) return -1;
    return d;
}

HIDDEN int dev_region_index_for_nvml(nvmlDevice_t h)
{
    char u[HAMID_UUID_LEN] = "";
    if (!region_ready()) return -1;
    nvml_resolve();
    if (g_nv.nvmlDeviceGetUUID && g_nv.nvmlDeviceGetUUID(h, u, sizeof u) == NVML_SUCCESS && u[0]) {
        for (int d = 0; d < HAMID_MAX_DEVICES; d++) {
            struct hamid_device *dv = &g_region->devices[d];
            if ((__atomic_load_n(&dv->flags, __ATOMIC_ACQUIRE) & HAMID_DEVICE_FLAG_UUID) && strcmp(dv->uuid, u) == 0)
                return d;
        }
    }
    unsigned int idx;
    if (g_nv.nvmlDeviceGetIndex && g_nv.nvmlDeviceGetIndex(h, &idx) == NVML_SUCCESS && idx < HAMID_MAX_DEVICES)
        return (int)idx;
    return -1;
}

HIDDEN int dev_nvml_handle(CUdevice ord, nvmlDevice_t *h)
{
    int rdev = dev_region_index(ord);
    if (rdev < 0 || !nvml_ready() || !g_nv.nvmlDeviceGetHandleByIndex_v2) return -1;
    return g_nv.nvmlDeviceGetHandleByIndex_v2((unsigned)rdev, h) == NVML_SUCCESS ? 0 : -1;
}

HIDDEN void devmap_after_fork_child(void)
{
    pthread_mutex_init(&g_mu, NULL);
}
