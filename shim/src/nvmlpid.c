/*
 * nvmlpid.c: which pid NVML lists this process by, and NVML's figure for it
 * (the truth for what the shim cannot see: context, loaded modules, driver
 * rounding; mem.c's reconcile).
 *
 * Inside a container that pid depends on the driver. Drivers that ignore pid
 * namespaces list every process by its host pid, so getpid() is not in the
 * list (nvidia-docker#1460); driver 580 on the H100 lists a process by its
 * pid in the caller's namespace (a process in a fresh pid namespace with its
 * own /proc saw itself as pid 1), and getpid() is found at once.
 *
 * Otherwise the pid is learnt when the process creates its first context on a
 * device (primary or its own, whichever comes first; a later one on the same
 * device would show no new pid for this process): the pids in NVML's list of that device before and after the
 * creation; the ones that appeared are the candidates. The container's own
 * processes cannot add to them (each holds the device's context lock in the
 * region while it does this), so only a process of another container that
 * created a context in the same instant can. Candidates are narrowed on the
 * next devices' creations and each time NVML's list is read: a pid gone from
 * the list, or owned by a sibling in the region, is not this process. One
 * left is the answer, kept in this process's region slot. Until then (or
 * without NVML) mem.c falls back to the context size measured at creation.
 */
#include "shim.h"

#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define MAX_CAND 16
#define MAX_LIST 65536
#define CTX_LOCK_WAIT_NS 3000000000ull /* a sibling's context creation: seconds at worst */

static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;
static int32_t g_nvml_pid; /* 0 = not known */
static uint32_t g_cand[MAX_CAND];
static int g_ncand = -1; /* -1: no creation seen yet */
static uint32_t g_seen_dev; /* devices this process already has a context on: bit per ordinal */

/* NVML's compute processes on a device; malloc'd, the caller frees. */
static nvmlProcessInfo_t *list_procs(CUdevice ord, unsigned *n)
{
    nvmlDevice_t h;
    if (dev_nvml_handle(ord, &h) != 0 || !g_nv.nvmlDeviceGetComputeRunningProcesses_v3) return NULL;
    unsigned cap = 64;
    for (int tries = 0; tries < 4; tries++) {
        nvmlProcessInfo_t *v = calloc(cap, sizeof *v);
        if (!v) return NULL;
        unsigned got = cap;
        nvmlReturn_t r = g_nv.nvmlDeviceGetComputeRunningProcesses_v3(h, &got, v);
        if (r == NVML_SUCCESS) {
            *n = got;
            return v;
        }
        free(v);
        if (r != NVML_ERROR_INSUFFICIENT_SIZE || got >= MAX_LIST) return NULL;
        cap = got + 16;
    }
    return NULL;
}

static int listed(const nvmlProcessInfo_t *v, unsigned n, uint32_t pid)
{
    for (unsigned i = 0; i < n; i++)
        if (v[i].pid == pid) return 1;
    return 0;
}

static void settle_locked(int32_t pid, const char *how)
{
    g_nvml_pid = pid;
    g_ncand = 1;
    g_cand[0] = (uint32_t)pid;
    acct_set_nvml_pid(pid);
    LOG_DEBUG("NVML lists this process as pid %d (%s)", (int)pid, how);
}

/* Keep the candidates that are listed (when a list is given) and not a sibling's. */
static void narrow_locked(const nvmlProcessInfo_t *v, unsigned n)
{
    int k = 0;
    for (int i = 0; i < g_ncand; i++)
        if ((!v || listed(v, n, g_cand[i])) && !region_nvml_pid_taken((int32_t)g_cand[i])) g_cand[k++] = g_cand[i];
    g_ncand = k;
    if (k == 1) settle_locked((int32_t)g_cand[0], "the one new NVML process left");
}

struct nvmlpid_ctx {
    int rdev;
    int locked;
    unsigned n;
    nvmlProcessInfo_t *before;
};

HIDDEN void *nvmlpid_before_context(CUdevice ord)
{
    if (__atomic_load_n(&g_nvml_pid, __ATOMIC_ACQUIRE) || ord < 0 || ord >= 32 ||
        (__atomic_load_n(&g_seen_dev, __ATOMIC_ACQUIRE) & (1u << ord)) || !nvml_ready())
        return NULL;
    struct nvmlpid_ctx *c = calloc(1, sizeof *c);
    if (!c) return NULL;
    c->rdev = dev_region_index(ord);
    c->locked = region_ctx_lock(c->rdev, CTX_LOCK_WAIT_NS);
    c->before = list_procs(ord, &c->n);
    if (!c->before) {
        region_ctx_unlock(c->rdev, c->locked);
        free(c);
        return NULL;
    }
    return c;
}

HIDDEN void nvmlpid_after_context(void *token, CUdevice ord)
{
    struct nvmlpid_ctx *c = token;
    if (!c) return;
    unsigned n = 0;
    nvmlProcessInfo_t *after = list_procs(ord, &n);
    pthread_mutex_lock(&g_mu);
    uint32_t bit = 1u << ord, seen = __atomic_fetch_or(&g_seen_dev, bit, __ATOMIC_ACQ_REL) & bit;
    if (after && !g_nvml_pid && !seen) {
        uint32_t me = (uint32_t)getpid();
        if (listed(after, n, me)) {
            settle_locked((int32_t)me, "getpid() is in its list");
        } else {
            uint32_t fresh[MAX_CAND];
            int nf = 0;
            /* pid 0: a process the driver cannot name in this namespace */
            for (unsigned i = 0; i < n && nf < MAX_CAND; i++)
                if (after[i].pid && !listed(c->before, c->n, after[i].pid)) fresh[nf++] = after[i].pid;
            if (g_ncand < 0) { /* the first device: every new process is a candidate */
                memcpy(g_cand, fresh, sizeof(uint32_t) * (size_t)nf);
                g_ncand = nf;
            } else { /* a later device: this process is new here too */
                int k = 0;
                for (int i = 0; i < g_ncand; i++)
                    for (int j = 0; j < nf; j++)
                        if (g_cand[i] == fresh[j]) { g_cand[k++] = g_cand[i]; break; }
                g_ncand = k;
            }
            narrow_locked(NULL, 0);
            if (!g_nvml_pid)
                LOG_DEBUG("NVML pid not known yet: %d candidates after a context on device %d", g_ncand, (int)ord);
        }
    }
    pthread_mutex_unlock(&g_mu);
    free(after);
}

HIDDEN void nvmlpid_end(void *token)
{
    struct nvmlpid_ctx *c = token;
    if (!c) return;
    region_ctx_unlock(c->rdev, c->locked);
    free(c->before);
    free(c);
}

HIDDEN int nvmlpid_usage(CUdevice ord, uint64_t *used)
{
    if (!nvml_ready()) return -1;
    unsigned n = 0;
    nvmlProcessInfo_t *v = list_procs(ord, &n);
    if (!v) return -1;
    pthread_mutex_lock(&g_mu);
    if (!g_nvml_pid && listed(v, n, (uint32_t)getpid())) settle_locked((int32_t)getpid(), "getpid() is listed");
    if (!g_nvml_pid && g_ncand > 1) narrow_locked(v, n);
    int32_t me = g_nvml_pid;
    pthread_mutex_unlock(&g_mu);
    int found = -1;
    for (unsigned i = 0; me && i < n; i++)
        if (v[i].pid == (uint32_t)me && v[i].usedGpuMemory != ~0ull) {
            *used = v[i].usedGpuMemory;
            found = 0;
        }
    free(v);
    return found;
}

HIDDEN void nvmlpid_after_fork_child(void)
{
    pthread_mutex_init(&g_mu, NULL);
    g_nvml_pid = 0;
    g_ncand = -1;
    g_seen_dev = 0;
}

HIDDEN int32_t nvmlpid_self(void) { return __atomic_load_n(&g_nvml_pid, __ATOMIC_ACQUIRE); }
