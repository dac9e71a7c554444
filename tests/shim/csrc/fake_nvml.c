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

/*
 * Per-process utilization samples. FAKE_NVML_UTIL names a file of lines
 * "<pid> <smUtil> [<age ms>]" or "self" (the caller, see below): every call returns one sample per line, stamped
 * now (minus its age, as NVML keeps seconds of samples), the file re-read each
 * call so a test can change who is busy while a process runs; as NVML, only
 * samples newer than lastSeenTimeStamp. Unset: NOT_SUPPORTED (3), as NVML
 * answers where it has no per-process accounting.
 */
#include <stdlib.h>
static int64_t sample_period_ns(void)
{
    const char *pm = getenv("FAKE_NVML_SAMPLE_MS");
    return (pm && *pm ? atoll(pm) : 100) * 1000000ll;
}

/* The device's busy percent over the sample period that ended last. */
static double busy_share_now(nvmlDevice_t h)
{
    struct fake_state *s = fake_state_get();
    int64_t P = sample_period_ns(), end = fake_now() / P * P;
    fake_lock(s);
    double v = (double)fake_busy_in_locked(s, idx_of(h), end - P, end) * 100.0 / (double)P;
    fake_unlock(s);
    return v;
}

API nvmlReturn_t nvmlDeviceGetProcessUtilization(nvmlDevice_t h, nvmlProcessUtilizationSample_t *out,
                                                 unsigned int *count, unsigned long long last)
{
    (void)h;
    const char *p = getenv("FAKE_NVML_UTIL");
    if (!p) return 3;
    FILE *f = fopen(p, "r");
    if (!f) return 3;
    unsigned int n = 0, pid, sm;
    unsigned long long now = (unsigned long long)fake_real_now() / 1000;
    char line[128];
    while (fgets(line, sizeof line, f)) {
        unsigned int age_ms = 0;
        if (!strncmp(line, "self", 4) && (line[4] == '\n' || !line[4])) {
            /* the calling process, as the driver reports it: its share of the last sample period from the
               fake GPU's timeline (the test's only tenant), and no sample at all for a period it was idle */
            pid = (unsigned)fake_host_pid();
            sm = (unsigned)(busy_share_now(h) + 0.5);
            if (!sm) continue;
        } else if (sscanf(line, "%u %u %u", &pid, &sm, &age_ms) < 2) continue;
        unsigned long long stamp = now - (unsigned long long)age_ms * 1000ull;
        if (stamp <= last) continue;
        if (n >= *count) {
            fclose(f);
            return NVML_ERROR_INSUFFICIENT_SIZE;
        }
        memset(&out[n], 0, sizeof out[n]);
        out[n].pid = pid;
        out[n].timeStamp = stamp;
        out[n].smUtil = sm;
        n++;
    }
    fclose(f);
    *count = n;
    return n ? NVML_SUCCESS : NVML_ERROR_NOT_FOUND;
}

/*
 * Device samples (nvmlDeviceGetSamples), GPU utilization only: one sample per
 * FAKE_NVML_SAMPLE_MS (default 100) period, the share of it in which the fake
 * GPU ran a kernel (from the launches' timeline), idle periods included,
 * stamped at the period's end (wall-clock us); as NVML, only samples newer
 * than lastSeenTimeStamp, and only the last 2 s. FAKE_NVML_NO_SAMPLES=1:
 * NOT_SUPPORTED.
 */
API nvmlReturn_t nvmlDeviceGetSamples(nvmlDevice_t h, nvmlSamplingType_t type, unsigned long long last,
                                      nvmlValueType_t *vt, unsigned int *count, nvmlSample_t *out)
{
    const char *no = getenv("FAKE_NVML_NO_SAMPLES");
    if (no && *no == '1') return 3;
    if (type != NVML_GPU_UTILIZATION_SAMPLES) return 3;
    int64_t P = sample_period_ns();
    struct fake_state *s = fake_state_get();
    int d = idx_of(h);
    int64_t mono = fake_now(), real_us = fake_real_now() / 1000;
    unsigned int n = 0;
    fake_lock(s);
    for (int64_t end = (mono - 2000000000ll) / P * P + P; end <= mono; end += P) {
        unsigned long long stamp = (unsigned long long)(real_us - (mono - end) / 1000);
        if (stamp <= last) continue;
        if (n >= *count) {
            fake_unlock(s);
            return NVML_ERROR_INSUFFICIENT_SIZE;
        }
        out[n].timeStamp = stamp;
        out[n].sampleValue.uiVal = (unsigned int)(fake_busy_in_locked(s, d, end - P, end) * 100 / P);
        n++;
    }
    fake_unlock(s);
    *vt = NVML_VALUE_TYPE_UNSIGNED_INT;
    *count = n;
    return n ? NVML_SUCCESS : NVML_ERROR_NOT_FOUND;
}
