/*
 * fake_nvml.c: TEST STAND-IN ONLY, built by tests/shim as
 * libnvidia-ml.so.1. Not NVIDIA's NVML: it reports the "host" view of the
 * fake GPU that fake_cuda.c simulates (device memory, per-process usage),
 * with the real NVML names, signatures and struct layouts, so the tests can
 * compare the shim's container view against the host's.
 */
#define _GNU_SOURCE
#include <stdio.h>
#include <string.h>

#include "fake_state.h"
#include "hamid_cuda.h"

#define API __attribute__((visibility("default")))

/* A process that is gone frees its memory, as the real driver does. */
static void reap(struct fake_state *s)
{
    fake_lock(s);
    for (int i = 0; i < FAKE_MAX_PROC; i++) {
        if (s->procs[i].pid > 0 && !fake_pid_alive(s->procs[i].pid)) {
            s->dev[s->procs[i].dev].used -= s->procs[i].used;
            s->procs[i].pid = 0;
            s->procs[i].used = 0;
        }
    }
    fake_unlock(s);
}

static int idx_of(nvmlDevice_t h) { return (int)((uintptr_t)h - 0x100); }

API nvmlReturn_t nvmlInit_v2(void) { fake_state_get(); return NVML_SUCCESS; }
API nvmlReturn_t nvmlInit(void) { return nvmlInit_v2(); }
API nvmlReturn_t nvmlShutdown(void) { return NVML_SUCCESS; }
API const char *nvmlErrorString(nvmlReturn_t r) { (void)r; return "fake nvml error"; }
API nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *n) { *n = fake_state_get()->ndev; return NVML_SUCCESS; }
API nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int i, nvmlDevice_t *h)
{
    if (i >= fake_state_get()->ndev) return NVML_ERROR_INVALID_ARGUMENT;
    *h = (nvmlDevice_t)(uintptr_t)(0x100 + i);
    return NVML_SUCCESS;
}
API nvmlReturn_t nvmlDeviceGetIndex(nvmlDevice_t h, unsigned int *i) { *i = (unsigned)idx_of(h); return NVML_SUCCESS; }
API nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t h, char *buf, unsigned int len)
{
    snprintf(buf, len, "GPU-fa4e0000-0000-0000-0000-0000000000%02x", idx_of(h));
    return NVML_SUCCESS;
}
API nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t h, nvmlMemory_t *m)
{
    struct fake_state *s = fake_state_get();
    reap(s);
    int i = idx_of(h);
    m->total = s->dev[i].total;
    m->used = s->dev[i].used;
    m->free = m->total - m->used;
    return NVML_SUCCESS;
}
API nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t h, nvmlMemory_v2_t *m)
{
    nvmlMemory_t v1;
    nvmlDeviceGetMemoryInfo(h, &v1);
    m->total = v1.total;
    m->reserved = 0;
    m->used = v1.used;
    m->free = v1.free;
    return NVML_SUCCESS;
}
API nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v3(nvmlDevice_t h, unsigned int *n, nvmlProcessInfo_t *infos)
{
    struct fake_state *s = fake_state_get();
    reap(s);
    unsigned int want = 0, cap = *n;
    int i = idx_of(h);
    for (int k = 0; k < FAKE_MAX_PROC; k++)
        if (s->procs[k].pid > 0 && (int)s->procs[k].dev == i && s->procs[k].used) {
            if (want < cap) {
                infos[want].pid = (unsigned)s->procs[k].pid;
                infos[want].usedGpuMemory = s->procs[k].used;
                infos[want].gpuInstanceId = infos[want].computeInstanceId = 0xffffffffu;
            }
            want++;
        }
    *n = want;
    return want > cap ? NVML_ERROR_INSUFFICIENT_SIZE : NVML_SUCCESS;
}
