/*
 * config.c: the shim's configuration and logging. It owns reading the
 * configuration once: from the daemon's limits file when it is there (then
 * no environment variable changes a limit), else from the environment
 * (HAMi-core's variable names plus hamid's own); parsing memory sizes in
 * HAMi-core's units (base 10 only); failing closed (a value that cannot be
 * parsed, or a limits file that is not right, refuses CUDA: shim_refused());
 * and the log sink. It must not call the driver.
 */
#include "shim.h"
#include "hamid_limits.h"

#include <ctype.h>
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
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

/*
 * HAMi-core units: "<n>[k|m|g]" with binary multiples, no suffix = bytes.
 * We also take t, an optional "i" and an optional "b" ("4Gi", "4GiB", "512mb").
 * Digits are base 10 only ("010g" is 10 GiB, "0x10" is malformed).
 * Returns 0 on success, -1 on anything malformed or overflowing.
 */
HIDDEN int parse_mem_size(const char *s, uint64_t *out)
{
    if (!s) return -1;
    while (isspace((unsigned char)*s)) s++;
    if (!isdigit((unsigned char)*s)) return -1;
    errno = 0;
    char *end;
    unsigned long long v = strtoull(s, &end, 10);
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

/* A plain base-10 integer in [lo, hi], surrounding blanks allowed. */
static int parse_int(const char *s, long long lo, long long hi, long long *out)
{
    while (isspace((unsigned char)*s)) s++;
    if (!isdigit((unsigned char)*s) && !(*s == '-' && isdigit((unsigned char)s[1]))) return -1;
    char *end;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    while (isspace((unsigned char)*end)) end++;
    if (errno || end == s || *end || v < lo || v > hi) return -1;
    *out = v;
    return 0;
}

/* Refusals are collected while the configuration is read; the first one is the message. */
static void refuse(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void refuse(const char *fmt, ...)
{
    if (g_cfg.refused) return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(g_cfg.refused_msg, sizeof g_cfg.refused_msg, fmt, ap);
    va_end(ap);
    g_cfg.refused = 1;
}

static void parse_percent(const char *name, const char *s, uint32_t *out)
{
    long long v;
    if (parse_int(s, 0, 100, &v) != 0) {
        refuse("%s=%s is not a percentage: expected a base-10 integer 0..100 (0 and 100: no limit)", name, s);
        return;
    }
    *out = (v >= 100 || v == 0) ? 0 : (uint32_t)v; /* 0 and 100 mean: no limit */
}

/*
 * "a-b[,c-d...]": parts of the period, in percent (0 <= a < b <= 100), sorted
 * and disjoint. Returns the number of slots, or -1 (refused) when malformed.
 */
static int parse_slots(const char *name, const char *s, int64_t period, int64_t out[][2])
{
    int n = 0, prev_end = 0;
    const char *p = s;
    while (*p) {
        char *e1, *e2;
        if (!isdigit((unsigned char)*p)) goto bad;
        long a = strtol(p, &e1, 10);
        if (e1 == p || *e1 != '-' || !isdigit((unsigned char)e1[1])) goto bad;
        long b = strtol(e1 + 1, &e2, 10);
        if (e2 == e1 + 1 || (*e2 && (*e2 != ',' || !e2[1]))) goto bad;
        if (a < prev_end || b <= a || b > 100 || n >= HAMID_MAX_SLOTS) goto bad;
        out[n][0] = period * a / 100;
        out[n][1] = period * b / 100;
        n++;
        prev_end = (int)b;
        p = *e2 ? e2 + 1 : e2;
    }
    if (n) return n;
bad:
    refuse("%s=%s: expected sorted, disjoint percent ranges like 0-30,50-70 (at most %d)", name, s, HAMID_MAX_SLOTS);
    return -1;
}

static void finish_sm(void)
{
    g_cfg.any_sm_limit = 0;
    for (int i = 0; i < HAMID_MAX_DEVICES; i++)
        if (g_cfg.sm_limit[i]) g_cfg.any_sm_limit = 1;
}

/* The daemon's file: the only source of limits when it is there. */
static void config_from_file(const struct hamid_limits *l)
{
    g_cfg.from_file = 1;
    g_cfg.file_devices = l->device_count;
    g_cfg.sm_period_ns = (int64_t)l->sm_period_us * 1000;
    g_cfg.sm_observe_only = l->sm_mode == HAMID_LIMITS_SM_OBSERVE;
    for (uint32_t i = 0; i < l->device_count; i++) {
        const struct hamid_limits_device *d = &l->devices[i];
        g_cfg.mem_limit[i] = d->memory_bytes;
        g_cfg.sm_limit[i] = d->sm_percent;
        snprintf(g_cfg.file_uuid[i], sizeof g_cfg.file_uuid[i], "%s", d->uuid);
        g_cfg.sm_nslots[i] = (int)d->nslots;
        for (uint32_t s = 0; s < d->nslots; s++) {
            g_cfg.sm_slot[i][s][0] = g_cfg.sm_period_ns * d->slots[s][0] / 100;
            g_cfg.sm_slot[i][s][1] = g_cfg.sm_period_ns * d->slots[s][1] / 100;
        }
    }
    g_cfg.has_priority = !!(l->flags & HAMID_LIMITS_FLAG_PRIORITY);
    g_cfg.priority = l->priority;
    snprintf(g_cfg.region_path, sizeof g_cfg.region_path, "%s", l->region_path);
    g_cfg.hold_capable = l->abi_version >= 2 && !(g_cfg.has_priority && g_cfg.priority <= 0);
    g_cfg.live_file = l->abi_version >= 2;
    g_cfg.live_others = l->abi_version >= 4;
    /* ABI 1 files predate the policy: they always limited (force) */
    g_cfg.sm_policy = l->abi_version < 2 ? HAMID_POLICY_FORCE : (int)l->sm_policy;
    if (l->flags & HAMID_LIMITS_FLAG_MPS) {
        /* MPS partitions the SMs: the share is the client's active thread percentage, not time slices. */
        g_cfg.mps = 1;
        g_cfg.mps_thread_percent = l->devices[0].sm_percent ? l->devices[0].sm_percent : 100;
        g_cfg.sm_limit[0] = 0;
        g_cfg.sm_nslots[0] = 0;
    }
    finish_sm();
    if (g_cfg.sm_policy == HAMID_POLICY_DISABLE) g_cfg.any_sm_limit = 0;
    /* Nothing a process of the container sets may weaken what the file says. */
    static const char *ignored[] = {"CUDA_DEVICE_MEMORY_LIMIT", "CUDA_DEVICE_SM_LIMIT", "HAMID_SM_SLOTS",
                                    "HAMID_SM_LIMIT_MODE", "GPU_CORE_UTILIZATION_POLICY", "HAMID_SM_PERIOD_US",
                                    "HAMID_SM_AHEAD_US", "HAMID_CONTEXT_SIZE", "HAMID_NVML_RECONCILE",
                                    "CUDA_DEVICE_MEMORY_SHARED_CACHE", "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE",
                                    "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT", NULL};
    for (int i = 0; ignored[i]; i++)
        if (getenv(ignored[i])) LOG_INFO("%s ignored: the limits come from %s", ignored[i], limits_path());
}

/* Plain LD_PRELOAD, no daemon: HAMi-core's variables (and hamid's own), every one parsed strictly. */
static void config_from_env(void)
{
    const char *v;
    uint64_t global = 0;
    if ((v = getenv("CUDA_DEVICE_MEMORY_LIMIT")) && *v && parse_mem_size(v, &global) != 0)
        refuse("CUDA_DEVICE_MEMORY_LIMIT=%s: expected <n>[k|m|g|t] in base 10 (binary units, no suffix = bytes)", v);
    uint32_t sm_global = 0;
    if ((v = getenv("CUDA_DEVICE_SM_LIMIT")) && *v) parse_percent("CUDA_DEVICE_SM_LIMIT", v, &sm_global);
    for (int i = 0; i < HAMID_MAX_DEVICES; i++) {
        char name[64];
        g_cfg.mem_limit[i] = global;
        snprintf(name, sizeof name, "CUDA_DEVICE_MEMORY_LIMIT_%d", i);
        if ((v = getenv(name)) && *v && parse_mem_size(v, &g_cfg.mem_limit[i]) != 0)
            refuse("%s=%s: expected <n>[k|m|g|t] in base 10 (binary units, no suffix = bytes)", name, v);
        g_cfg.sm_limit[i] = sm_global;
        snprintf(name, sizeof name, "CUDA_DEVICE_SM_LIMIT_%d", i);
        if ((v = getenv(name)) && *v) parse_percent(name, v, &g_cfg.sm_limit[i]);
    }
    finish_sm();
    v = getenv("HAMID_SM_LIMIT_MODE");
    if (v && *v && strcmp(v, "observe") != 0 && strcmp(v, "enforce") != 0)
        refuse("HAMID_SM_LIMIT_MODE=%s: expected enforce or observe", v);
    g_cfg.sm_observe_only = v && strcmp(v, "observe") == 0;
    /* HAMi-core's default (unset): default */
    v = getenv("GPU_CORE_UTILIZATION_POLICY");
    if (v && *v) {
        if (strcasecmp(v, "disable") == 0) g_cfg.sm_policy = HAMID_POLICY_DISABLE;
        else if (strcasecmp(v, "force") == 0) g_cfg.sm_policy = HAMID_POLICY_FORCE;
        else if (strcasecmp(v, "default") != 0)
            refuse("GPU_CORE_UTILIZATION_POLICY=%s: expected default, force or disable", v);
    }
    if (g_cfg.sm_policy == HAMID_POLICY_DISABLE) g_cfg.any_sm_limit = 0;

    long long x;
    v = getenv("HAMID_NVML_RECONCILE");
    if (v && *v && parse_int(v, 0, 1, &x) != 0) refuse("HAMID_NVML_RECONCILE=%s: expected 0 or 1", v);
    g_cfg.nvml_reconcile = !(v && *v && strcmp(v, "0") == 0);
    if ((v = getenv("HAMID_CONTEXT_SIZE")) && *v && parse_mem_size(v, &g_cfg.context_bytes_override) != 0)
        refuse("HAMID_CONTEXT_SIZE=%s: expected <n>[k|m|g] in base 10", v);
    if ((v = getenv("HAMID_SM_AHEAD_US")) && *v) {
        if (parse_int(v, 0, 1000000, &x) == 0) g_cfg.sm_ahead_ns = (int64_t)x * 1000;
        else refuse("HAMID_SM_AHEAD_US=%s: expected a base-10 integer 0..1000000", v);
    }
    if ((v = getenv("HAMID_SM_PERIOD_US")) && *v) {
        if (parse_int(v, 1000, 10000000, &x) == 0) g_cfg.sm_period_ns = (int64_t)x * 1000;
        else refuse("HAMID_SM_PERIOD_US=%s: expected a base-10 integer 1000..10000000", v);
    }
    const char *gslots = getenv("HAMID_SM_SLOTS");
    for (int i = 0; i < HAMID_MAX_DEVICES; i++) {
        char name[64];
        snprintf(name, sizeof name, "HAMID_SM_SLOTS_%d", i);
        const char *sv = getenv(name);
        const char *use = (sv && *sv) ? sv : ((gslots && *gslots) ? gslots : NULL);
        if (!use) continue;
        int n = parse_slots((sv && *sv) ? name : "HAMID_SM_SLOTS", use, g_cfg.sm_period_ns, g_cfg.sm_slot[i]);
        g_cfg.sm_nslots[i] = n > 0 && g_cfg.sm_limit[i] ? n : 0;
    }
    if ((v = getenv("CUDA_TASK_PRIORITY")) && *v) {
        if (parse_int(v, -2147483647LL - 1, 2147483647LL, &x) == 0) {
            g_cfg.has_priority = 1;
            g_cfg.priority = (int32_t)x;
        } else {
            refuse("CUDA_TASK_PRIORITY=%s: expected a base-10 integer", v);
        }
    }
    v = getenv("CUDA_DEVICE_MEMORY_SHARED_CACHE");
    snprintf(g_cfg.region_path, sizeof g_cfg.region_path, "%s", (v && *v) ? v : "/tmp/cudevshr.cache");
}

static void config_load_once(void)
{
    const char *v;
    /* HAMi-core's name first, hamid's own name wins. Not a limit: from the environment always. */
    if ((v = getenv("LIBCUDA_LOG_LEVEL"))) g_log_level = atoi(v);
    if ((v = getenv("HAMID_SHIM_LOG_LEVEL"))) g_log_level = atoi(v);

    memset(&g_cfg, 0, sizeof g_cfg);
    g_cfg.nvml_reconcile = 1;
    g_cfg.sm_ahead_ns = 4 * 1000 * 1000;     /* 4 ms of schedule may queue ahead */
    g_cfg.sm_period_ns = 100 * 1000 * 1000;  /* 100 ms: 1% of it is 1 ms, longer than most kernels' spill */
    static struct hamid_limits lim;
    char err[sizeof g_cfg.refused_msg];
    int r = limits_read(&lim, err, sizeof err);
    if (r > 0) config_from_file(&lim);
    else if (r < 0) refuse("%s", err);
    else config_from_env();
}

static int g_refusal_told;

HIDDEN void shim_refuse(const char *why)
{
    config_load();
    if (!__atomic_load_n(&g_cfg.refused, __ATOMIC_ACQUIRE)) {
        snprintf(g_cfg.refused_msg, sizeof g_cfg.refused_msg, "%s", why);
        __atomic_store_n(&g_cfg.refused, 1, __ATOMIC_RELEASE);
    }
}

HIDDEN int shim_refused(void)
{
    config_load();
    if (LIKELY(!__atomic_load_n(&g_cfg.refused, __ATOMIC_ACQUIRE))) return 0;
    if (!__atomic_exchange_n(&g_refusal_told, 1, __ATOMIC_ACQ_REL))
        shim_log(1, "CUDA refused: %s", g_cfg.refused_msg); /* said whatever the log level */
    return 1;
}

static pthread_once_t g_cfg_once = PTHREAD_ONCE_INIT;
static int g_cfg_loaded;

HIDDEN void config_load(void)
{
    if (LIKELY(__atomic_load_n(&g_cfg_loaded, __ATOMIC_ACQUIRE))) return;
    pthread_once(&g_cfg_once, config_load_once);
    __atomic_store_n(&g_cfg_loaded, 1, __ATOMIC_RELEASE);
}
