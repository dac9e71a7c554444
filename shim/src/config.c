/*
 * config.c: the shim's configuration and logging. It owns reading the
 * environment once (HAMi-core's variable names plus hamid's own), parsing
 * memory sizes in HAMi-core's units, the log sink, and the clocks. It must
 * not call the driver.
 */
#include "shim.h"

#include <ctype.h>
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

HIDDEN int g_log_level = 2;
HIDDEN struct shim_config g_cfg;

HIDDEN void shim_log(int level, const char *fmt, ...)
{
    static const char *names[] = {"", "ERROR", "WARN", "INFO", "DEBUG"};
    char buf[1024];
    int n = snprintf(buf, sizeof buf, "[hamid-shim %d %s] ", (int)getpid(),
                     names[level < 0 ? 0 : level > 4 ? 4 : level]);
    va_list ap;
    va_start(ap, fmt);
    if (n > 0 && (size_t)n < sizeof buf) n += vsnprintf(buf + n, sizeof buf - (size_t)n, fmt, ap);
    va_end(ap);
    if (n < 0) return;
    if ((size_t)n >= sizeof buf - 1) n = (int)sizeof buf - 2;
    buf[n++] = '\n';
    ssize_t w = write(2, buf, (size_t)n);
    (void)w;
}

HIDDEN uint64_t mono_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

HIDDEN uint64_t real_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/*
 * HAMi-core units: "<n>[k|m|g]" with binary multiples, no suffix = bytes.
 * We also take t, an optional "i" and an optional "b" ("4Gi", "4GiB", "512mb").
 * Returns 0 on success, -1 on anything malformed or overflowing.
 */
HIDDEN int parse_mem_size(const char *s, uint64_t *out)
{
    if (!s) return -1;
    while (isspace((unsigned char)*s)) s++;
    if (!isdigit((unsigned char)*s)) return -1;
    errno = 0;
    char *end;
    unsigned long long v = strtoull(s, &end, 0);
    if (errno || end == s) return -1;
    unsigned shift = 0;
    switch (*end) {
    case 'k': case 'K': shift = 10; end++; break;
    case 'm': case 'M': shift = 20; end++; break;
    case 'g': case 'G': shift = 30; end++; break;
    case 't': case 'T': shift = 40; end++; break;
    default: break;
    }
    if (shift && (*end == 'i' || *end == 'I')) end++;
    if (*end == 'b' || *end == 'B') end++;
    while (isspace((unsigned char)*end)) end++;
    if (*end) return -1;
    if (shift && v > (~0ull >> shift)) return -1;
    *out = (uint64_t)v << shift;
    return 0;
}

static int parse_percent(const char *name, const char *s, uint32_t *out)
{
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    while (isspace((unsigned char)*end)) end++;
    if (errno || end == s || *end || v < 0) {
        LOG_ERR("%s=%s is not a percentage (0..100); ignored", name, s);
        return -1;
    }
    *out = (v >= 100 || v == 0) ? 0 : (uint32_t)v; /* 0 and >=100 mean: no limit */
    return 0;
}

/*
 * "a-b[,c-d...]": parts of the period, in percent (0 <= a < b <= 100), sorted
 * and disjoint. Returns the number of slots, or -1 (logged) when malformed.
 */
static int parse_slots(const char *name, const char *s, int64_t period, int64_t out[][2])
{
    int n = 0, prev_end = 0;
    const char *p = s;
    while (*p) {
        char *e1, *e2;
        long a = strtol(p, &e1, 10);
        if (e1 == p || *e1 != '-') goto bad;
        long b = strtol(e1 + 1, &e2, 10);
        if (e2 == e1 + 1 || (*e2 && *e2 != ',')) goto bad;
        if (a < prev_end || b <= a || b > 100 || n >= HAMID_MAX_SLOTS) goto bad;
        out[n][0] = period * a / 100;
        out[n][1] = period * b / 100;
        n++;
        prev_end = (int)b;
        p = *e2 ? e2 + 1 : e2;
    }
    if (n) return n;
bad:
    LOG_ERR("%s=%s: expected sorted, disjoint percent ranges like 0-30,50-70 (at most %d); ignored", name, s,
            HAMID_MAX_SLOTS);
    return -1;
}

static void config_load_once(void)
{
    const char *v;
    /* HAMi-core's name first, hamid's own name wins. */
    if ((v = getenv("LIBCUDA_LOG_LEVEL"))) g_log_level = atoi(v);
    if ((v = getenv("HAMID_SHIM_LOG_LEVEL"))) g_log_level = atoi(v);

    memset(&g_cfg, 0, sizeof g_cfg);
    uint64_t global = 0;
    if ((v = getenv("CUDA_DEVICE_MEMORY_LIMIT")) && *v) {
        if (parse_mem_size(v, &global) != 0) {
            LOG_ERR("CUDA_DEVICE_MEMORY_LIMIT=%s: expected <n>[k|m|g|t] (binary units, no suffix = bytes); ignored", v);
            global = 0;
        }
    }
    uint32_t sm_global = 0;
    if ((v = getenv("CUDA_DEVICE_SM_LIMIT")) && *v) parse_percent("CUDA_DEVICE_SM_LIMIT", v, &sm_global);
    for (int i = 0; i < HAMID_MAX_DEVICES; i++) {
        char name[64];
        g_cfg.mem_limit[i] = global;
        snprintf(name, sizeof name, "CUDA_DEVICE_MEMORY_LIMIT_%d", i);
        if ((v = getenv(name)) && *v) {
            uint64_t x;
            if (parse_mem_size(v, &x) == 0) g_cfg.mem_limit[i] = x;
            else LOG_ERR("%s=%s: expected <n>[k|m|g|t] (binary units, no suffix = bytes); ignored", name, v);
        }
        g_cfg.sm_limit[i] = sm_global;
        snprintf(name, sizeof name, "CUDA_DEVICE_SM_LIMIT_%d", i);
        if ((v = getenv(name)) && *v) {
            uint32_t x;
            if (parse_percent(name, v, &x) == 0) g_cfg.sm_limit[i] = x;
        }
        if (g_cfg.sm_limit[i]) g_cfg.any_sm_limit = 1;
    }
    v = getenv("HAMID_SM_LIMIT_MODE");
    g_cfg.sm_observe_only = v && strcmp(v, "observe") == 0;
    v = getenv("GPU_CORE_UTILIZATION_POLICY");
    if (v && (strcmp(v, "disable") == 0 || strcmp(v, "DISABLE") == 0)) g_cfg.any_sm_limit = 0;

    v = getenv("HAMID_NVML_RECONCILE");
    g_cfg.nvml_reconcile = !(v && strcmp(v, "0") == 0);
    if ((v = getenv("HAMID_CONTEXT_SIZE")) && *v) {
        if (parse_mem_size(v, &g_cfg.context_bytes_override) != 0) {
            LOG_ERR("HAMID_CONTEXT_SIZE=%s: expected <n>[k|m|g]; ignored", v);
            g_cfg.context_bytes_override = 0;
        }
    }
    g_cfg.sm_ahead_ns = 4 * 1000 * 1000; /* 4 ms of schedule may queue ahead */
    if ((v = getenv("HAMID_SM_AHEAD_US")) && *v) g_cfg.sm_ahead_ns = (int64_t)atol(v) * 1000;

    g_cfg.sm_period_ns = 100 * 1000 * 1000; /* 100 ms: 1% of it is 1 ms, longer than most kernels' spill */
    if ((v = getenv("HAMID_SM_PERIOD_US")) && *v) {
        long us = atol(v);
        if (us >= 1000 && us <= 10000000) g_cfg.sm_period_ns = (int64_t)us * 1000;
        else LOG_ERR("HAMID_SM_PERIOD_US=%s: expected 1000..10000000; using 100000", v);
    }
    const char *gslots = getenv("HAMID_SM_SLOTS");
    for (int i = 0; i < HAMID_MAX_DEVICES; i++) {
        char name[64];
        snprintf(name, sizeof name, "HAMID_SM_SLOTS_%d", i);
        const char *sv = getenv(name);
        const char *use = (sv && *sv) ? sv : ((gslots && *gslots) ? gslots : NULL);
        if (!use || !g_cfg.sm_limit[i]) continue;
        int n = parse_slots((sv && *sv) ? name : "HAMID_SM_SLOTS", use, g_cfg.sm_period_ns, g_cfg.sm_slot[i]);
        g_cfg.sm_nslots[i] = n > 0 ? n : 0;
    }

    v = getenv("CUDA_DEVICE_MEMORY_SHARED_CACHE");
    snprintf(g_cfg.region_path, sizeof g_cfg.region_path, "%s", (v && *v) ? v : "/tmp/cudevshr.cache");
}

static pthread_once_t g_cfg_once = PTHREAD_ONCE_INIT;
static int g_cfg_loaded;

HIDDEN void config_load(void)
{
    if (LIKELY(__atomic_load_n(&g_cfg_loaded, __ATOMIC_ACQUIRE))) return;
    pthread_once(&g_cfg_once, config_load_once);
    __atomic_store_n(&g_cfg_loaded, 1, __ATOMIC_RELEASE);
}
