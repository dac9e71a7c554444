/*
 * region.c: the container's shared region (layout in include/hamid_region.h).
 * It owns opening/creating and initialising the region file, the robust
 * process-shared lock, this process's slot (claimed lazily, released at exit,
 * re-claimed in a forked child), atomic admission against the per-device
 * limit, and reclaiming the usage of processes that died without releasing.
 *
 * Invariants:
 *  - devices[d].used_bytes == sum over live slots of procs[p].used[d], kept
 *    under the lock; if a process dies holding the lock, the next locker gets
 *    EOWNERDEAD and recomputes every total from the slots before going on;
 *  - a slot never moves; reclaiming clears it in place;
 *  - no counter is ever decremented below zero.
 * It also owns the per-device context locks, held while a process of the
 * container creates its first context on a device (so nvmlpid.c can tell its
 * own new NVML entry from a sibling's), and each slot's nvml_pid.
 * It must not call the CUDA driver.
 */
#define _GNU_SOURCE
#include "shim.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

HIDDEN struct hamid_region *g_region;
static int g_slot = -1;
static pid_t g_slot_pid;
/* This process's own tally of what it holds per device (the region's slot says the same, but the region is the
   container's to write): a process that wrote its container's total or its slot down to nothing, or the limit
   up, is still refused at the limit for what it holds itself (issue 37). */
static uint64_t g_own_used[HAMID_MAX_DEVICES];
static uint64_t g_own_ctx[HAMID_MAX_DEVICES]; /* of which its context's overhead (the slot's context[]) */
static int g_private;          /* region is process-private (file unusable) */
static pthread_once_t g_region_once = PTHREAD_ONCE_INIT;
static int g_region_ready;

_Static_assert(sizeof(pthread_mutex_t) <= sizeof(((struct hamid_region *)0)->lock_storage), "mutex fits");
_Static_assert(sizeof(pthread_mutex_t) <= sizeof(((struct hamid_device *)0)->ctx_lock_storage), "mutex fits");

static pthread_mutex_t *rmutex(void) { return (pthread_mutex_t *)(void *)g_region->lock_storage; }

static uint64_t ld(const uint64_t *p) { return __atomic_load_n(p, __ATOMIC_RELAXED); }
static void st(uint64_t *p, uint64_t v) { __atomic_store_n(p, v, __ATOMIC_RELAXED); }
static uint64_t sub_clamp(uint64_t a, uint64_t b) { return a > b ? a - b : 0; }

static void recompute_totals_locked(void)
{
    struct hamid_region *r = g_region;
    uint32_t hw = r->proc_high_water > HAMID_MAX_PROCS ? HAMID_MAX_PROCS : r->proc_high_water;
    for (int d = 0; d < HAMID_MAX_DEVICES; d++) {
        uint64_t sum = 0;
        for (uint32_t p = 0; p < hw; p++)
            if (r->procs[p].pid > 0) sum += ld(&r->procs[p].used[d]);
        st(&r->devices[d].used_bytes, sum);
    }
}

static int region_lock(void)
{
    int rc = pthread_mutex_lock(rmutex());
    if (rc == 0) return 0;
    if (rc == EOWNERDEAD) {
        LOG_WARN("a process died holding the region lock; recomputing totals from the slots");
        recompute_totals_locked();
        pthread_mutex_consistent(rmutex());
        return 0;
    }
    LOG_ERR("region lock failed (%d); continuing without it", rc);
    return -1;
}

static void region_unlock(int locked)
{
    if (locked == 0) pthread_mutex_unlock(rmutex());
}

static uint64_t proc_start_time(pid_t pid)
{
    char path[64], buf[1024];
    snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return 0;
    ssize_t n = read(fd, buf, sizeof buf - 1);
    close(fd);
    if (n <= 0) return 0;
    buf[n] = 0;
    char *p = strrchr(buf, ')');
    if (!p) return 0;
    /* after ") " come fields 3 (state) .. ; starttime is field 22 */
    p++;
    for (int field = 2; field < 21 && *p; p++)
        if (*p == ' ') field++;
    return strtoull(p, NULL, 10);
}

/* 1 if the process that owns the slot is gone (or its pid was reused). */
static int slot_dead(const struct hamid_proc *s)
{
    pid_t pid = s->pid;
    if (pid <= 0) return 0;
    if (kill(pid, 0) != 0 && errno == ESRCH) return 1;
    char path[64], buf[1024];
    snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return errno == ENOENT;
    ssize_t n = read(fd, buf, sizeof buf - 1);
    close(fd);
    if (n <= 0) return 0;
    buf[n] = 0;
    char *p = strrchr(buf, ')');
    if (!p || p[1] != ' ') return 0;
    char state = p[2];
    if (state == 'Z' || state == 'X' || state == 'x') return 1;
    if (s->start_time) {
        uint64_t now_start = proc_start_time(pid);
        if (now_start && now_start != s->start_time) return 1;
    }
    return 0;
}

static void clear_slot_locked(int i)
{
    struct hamid_region *r = g_region;
    struct hamid_proc *s = &r->procs[i];
    for (int d = 0; d < HAMID_MAX_DEVICES; d++) {
        uint64_t u = ld(&s->used[d]);
        st(&r->devices[d].used_bytes, sub_clamp(ld(&r->devices[d].used_bytes), u));
        st(&s->used[d], 0);
        st(&s->context[d], 0);
    }
    s->start_time = 0;
    s->flags = 0;
    __atomic_store_n(&s->nvml_pid, 0, __ATOMIC_RELAXED);
    __atomic_store_n(&s->pid, 0, __ATOMIC_RELEASE);
    while (r->proc_high_water > 0 && r->procs[r->proc_high_water - 1].pid == 0) r->proc_high_water--;
}

static int reclaim_dead_locked(void)
{
    struct hamid_region *r = g_region;
    int n = 0;
    uint32_t hw = r->proc_high_water > HAMID_MAX_PROCS ? HAMID_MAX_PROCS : r->proc_high_water;
    for (uint32_t i = 0; i < hw; i++) {
        if (r->procs[i].pid > 0 && (int)i != g_slot && slot_dead(&r->procs[i])) {
            LOG_INFO("reclaiming slot %u of dead process %d", i, r->procs[i].pid);
            clear_slot_locked((int)i);
            n++;
        }
    }
    if (n) {
        r->generation++;
        r->reclaimed_procs += (uint64_t)n;
    }
    return n;
}

static int live_slots_locked(void)
{
    int n = 0;
    for (uint32_t i = 0; i < g_region->proc_high_water && i < HAMID_MAX_PROCS; i++)
        if (g_region->procs[i].pid > 0) n++;
    return n;
}

static void init_robust(uint64_t *storage)
{
    pthread_mutexattr_t a;
    pthread_mutexattr_init(&a);
    pthread_mutexattr_setpshared(&a, PTHREAD_PROCESS_SHARED);
    pthread_mutexattr_setrobust(&a, PTHREAD_MUTEX_ROBUST);
    pthread_mutex_init((pthread_mutex_t *)(void *)storage, &a);
    pthread_mutexattr_destroy(&a);
}

static void init_fresh(struct hamid_region *r)
{
    memset(r, 0, sizeof *r);
    r->abi_version = HAMID_REGION_ABI_VERSION;
    r->struct_size = sizeof *r;
    r->max_procs = HAMID_MAX_PROCS;
    r->init_pid = (uint32_t)getpid();
    r->created_realtime_ns = real_ns();
    init_robust(r->lock_storage);
    for (int d = 0; d < HAMID_MAX_DEVICES; d++) init_robust(r->devices[d].ctx_lock_storage);
    for (int d = 0; d < HAMID_MAX_DEVICES; d++) {
        r->devices[d].limit_bytes = g_cfg.mem_limit[d];
        r->devices[d].sm_limit = g_cfg.sm_limit[d];
    }
    __atomic_store_n(&r->magic, (uint64_t)HAMID_REGION_MAGIC, __ATOMIC_RELEASE);
}

static struct hamid_region *map_private(void)
{
    void *p = mmap(NULL, sizeof(struct hamid_region), PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) return NULL;
    init_fresh(p);
    g_private = 1;
    return p;
}

/*
 * The region file is the container's alone: created 0600 (the daemon makes
 * its directory, 0700, owned by the container's user; root in the container
 * passes anyway), never through a symbolic link, and only a regular file is
 * used. A file an older shim left writable by group or others is tightened
 * when it is ours, else refused.
 */
static struct hamid_region *map_file(const char *path)
{
    int fd = open(path, O_RDWR | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
    if (fd >= 0) {
        fchmod(fd, 0600); /* whatever the umask */
    } else if (errno == EEXIST) {
        fd = open(path, O_RDWR | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
    }
    if (fd < 0) {
        LOG_WARN("cannot open region %s (%s)", path, errno == ELOOP ? "a symbolic link" : strerror(errno));
        return NULL;
    }
    struct stat sb0;
    if (fstat(fd, &sb0) != 0 || !S_ISREG(sb0.st_mode)) {
        LOG_WARN("region %s is not a regular file; not using it", path);
        close(fd);
        return NULL;
    }
    if (sb0.st_mode & (S_IWGRP | S_IWOTH)) {
        if (sb0.st_uid != geteuid() || fchmod(fd, sb0.st_mode & 0600) != 0) {
            LOG_WARN("region %s (mode %04o, uid %u) is writable by other users; not using it", path,
                     (unsigned)(sb0.st_mode & 07777), (unsigned)sb0.st_uid);
            close(fd);
            return NULL;
        }
    }
    struct hamid_region *r = NULL;
    if (flock(fd, LOCK_EX) != 0) goto out;
    struct stat sb;
    if (fstat(fd, &sb) != 0) goto unlock;
    if ((size_t)sb.st_size < sizeof *r && ftruncate(fd, (off_t)sizeof *r) != 0) {
        LOG_WARN("cannot size region %s (%s)", path, strerror(errno));
        goto unlock;
    }
    void *p = mmap(NULL, sizeof *r, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) goto unlock;
    r = p;
    if (__atomic_load_n(&r->magic, __ATOMIC_ACQUIRE) != (uint64_t)HAMID_REGION_MAGIC) {
        init_fresh(r);
    } else if (r->struct_size < sizeof *r) {
        LOG_ERR("region %s has struct_size %u < %zu (abi %u); not using it", path, r->struct_size, sizeof *r,
                r->abi_version);
        munmap(p, sizeof *r);
        r = NULL;
    } else if (r->abi_version < 2) {
        /* Written by an older shim (still running, perhaps): the fields it
           never touches are carved out of zeroed reserve; the context lock
           only needs initialising, under the flock that every opener takes. */
        for (int d = 0; d < HAMID_MAX_DEVICES; d++) init_robust(r->devices[d].ctx_lock_storage);
        __atomic_store_n(&r->abi_version, 2u, __ATOMIC_RELEASE);
    }
unlock:
    flock(fd, LOCK_UN);
out:
    close(fd);
    return r;
}

static void region_open_once(void)
{
    if (shim_refused()) return; /* CUDA is refused: nothing to account */
    struct hamid_region *r = map_file(g_cfg.region_path);
    if (!r && g_cfg.from_file) {
        /* Per-process limits would let every process of the container take the whole limit. */
        char why[sizeof g_cfg.region_path + 128];
        snprintf(why, sizeof why, "the region %s that %s names cannot be used", g_cfg.region_path, limits_path());
        shim_refuse(why);
        return;
    }
    if (!r) r = map_private();
    g_region = r;
    if (r) __atomic_store_n(&g_region_ready, 1, __ATOMIC_RELEASE);
}

HIDDEN int region_ready(void)
{
    if (LIKELY(__atomic_load_n(&g_region_ready, __ATOMIC_ACQUIRE))) return 1;
    pthread_once(&g_region_once, region_open_once);
    return g_region != NULL;
}

static void release_my_slot(void)
{
    if (!g_region || g_slot < 0 || g_slot_pid != getpid()) return;
    int locked = region_lock();
    if (g_region->procs[g_slot].pid == (int32_t)g_slot_pid) clear_slot_locked(g_slot);
    region_unlock(locked);
    g_slot = -1;
}

/* Adopt or publish limits: a container's processes share one view. */
static void sync_limits_locked(int alone)
{
    struct hamid_region *r = g_region;
    for (int d = 0; d < HAMID_MAX_DEVICES; d++) {
        struct hamid_device *dv = &r->devices[d];
        if (alone || g_cfg.from_file) { /* the daemon's file is the container's limit, whoever came first */
            dv->limit_bytes = g_cfg.mem_limit[d];
            dv->sm_limit = g_cfg.sm_limit[d];
        } else if (dv->limit_bytes != g_cfg.mem_limit[d] || dv->sm_limit != g_cfg.sm_limit[d]) {
            LOG_WARN("device %d: this process's limits (%llu B, %u%%) differ from the container's (%llu B, %u%%); "
                     "using the container's", d, (unsigned long long)g_cfg.mem_limit[d], g_cfg.sm_limit[d],
                     (unsigned long long)dv->limit_bytes, dv->sm_limit);
            g_cfg.mem_limit[d] = dv->limit_bytes;
            g_cfg.sm_limit[d] = dv->sm_limit;
        }
    }
    g_cfg.any_sm_limit = 0;
    for (int d = 0; d < HAMID_MAX_DEVICES; d++)
        if (g_cfg.sm_limit[d]) g_cfg.any_sm_limit = 1;
    if (g_cfg.sm_policy == HAMID_POLICY_DISABLE) g_cfg.any_sm_limit = 0; /* the limit is shown, never applied */
}

static int g_atexit_done;

static void register_slot(void)
{
    struct hamid_region *r = g_region;
    pid_t pid = getpid();
    uint64_t start = proc_start_time(pid);
    int locked = region_lock();
    reclaim_dead_locked();
    /* A slot holding our own pid belongs to the image we replaced by exec. */
    for (uint32_t i = 0; i < r->proc_high_water && i < HAMID_MAX_PROCS; i++)
        if (r->procs[i].pid == pid) clear_slot_locked((int)i);
    sync_limits_locked(live_slots_locked() == 0);
    int slot = -1;
    for (uint32_t i = 0; i < r->proc_high_water && i < HAMID_MAX_PROCS; i++)
        if (r->procs[i].pid == 0) { slot = (int)i; break; }
    if (slot < 0 && r->proc_high_water < HAMID_MAX_PROCS) slot = (int)r->proc_high_water++;
    if (slot >= 0) {
        struct hamid_proc *s = &r->procs[slot];
        memset(s->used, 0, sizeof s->used);
        memset(s->context, 0, sizeof s->context);
        memset(g_own_used, 0, sizeof g_own_used); /* a new process (fork, exec) holds nothing yet */
        memset(g_own_ctx, 0, sizeof g_own_ctx);
        s->start_time = start;
        s->nvml_pid = 0;
        s->flags = HAMID_PROC_FLAG_ACTIVE;
        __atomic_store_n(&s->pid, (int32_t)pid, __ATOMIC_RELEASE);
    } else {
        LOG_ERR("region full (%d processes); this process is counted in the device totals only", HAMID_MAX_PROCS);
    }
    region_unlock(locked);
    g_slot = slot;
    g_slot_pid = pid;
    if (!__atomic_exchange_n(&g_atexit_done, 1, __ATOMIC_ACQ_REL)) atexit(release_my_slot);
}

static pthread_mutex_t g_reg_mu = PTHREAD_MUTEX_INITIALIZER;

static void ensure_slot(void)
{
    if (LIKELY(g_slot_pid == getpid())) return;
    pthread_mutex_lock(&g_reg_mu);
    if (g_slot_pid != getpid()) register_slot();
    pthread_mutex_unlock(&g_reg_mu);
}

HIDDEN void acct_init(void)
{
    if (region_ready()) ensure_slot();
}

HIDDEN void region_after_fork_child(void)
{
    /* The child is a new process: it claims its own slot on first use. */
    g_slot = -1;
    g_slot_pid = 0;
    pthread_mutex_init(&g_reg_mu, NULL);
}

static void bump_device_count_locked(int rdev)
{
    if ((uint32_t)rdev + 1 > g_region->device_count) g_region->device_count = (uint32_t)rdev + 1;
}

HIDDEN uint64_t acct_limit(int rdev)
{
    /* the daemon's file (root-owned, read once) over the region's copy, which the container can write */
    if (g_cfg.from_file) return g_cfg.mem_limit[rdev];
    return g_region ? g_region->devices[rdev].limit_bytes : 0;
}

/* What the container holds on the device, as far as this process can trust it: the region's total, and never
   less than what this process holds itself. */
static uint64_t used_locked(const struct hamid_device *d, int rdev)
{
    uint64_t used = ld(&d->used_bytes);
    return used > g_own_used[rdev] ? used : g_own_used[rdev];
}

HIDDEN int acct_reserve(int rdev, uint64_t bytes, int force)
{
    if (rdev < 0 || rdev >= HAMID_MAX_DEVICES) return shim_refused() ? -1 : 0;
    acct_init();
    if (UNLIKELY(!g_region || shim_refused())) return shim_refused() ? -1 : 0;
    struct hamid_device *d = &g_region->devices[rdev];
    int locked = region_lock();
    uint64_t lim = acct_limit(rdev), used = used_locked(d, rdev);
    if (bytes > UINT64_MAX - used) { /* an estimate that overflowed: nothing that size exists */
        region_unlock(locked);
        return -1;
    }
    if (!force && lim && (bytes > lim || used + bytes > lim)) {
        if (reclaim_dead_locked() == 0 || (used = used_locked(d, rdev)) + bytes > lim) {
            d->oom_count++;
            region_unlock(locked);
            LOG_INFO("device %d: refusing %llu B (%llu of %llu B in use)", rdev, (unsigned long long)bytes,
                     (unsigned long long)used, (unsigned long long)lim);
            return -1;
        }
    }
    used += bytes;
    st(&d->used_bytes, used);
    g_own_used[rdev] += bytes;
    if (used > d->peak_used_bytes) d->peak_used_bytes = used;
    if (g_slot >= 0) {
        uint64_t *u = &g_region->procs[g_slot].used[rdev];
        st(u, ld(u) + bytes);
    }
    bump_device_count_locked(rdev);
    region_unlock(locked);
    return 0;
}

HIDDEN void acct_release(int rdev, uint64_t bytes)
{
    if (rdev < 0 || rdev >= HAMID_MAX_DEVICES || !bytes) return;
    acct_init();
    if (!g_region) return;
    struct hamid_device *d = &g_region->devices[rdev];
    int locked = region_lock();
    uint64_t take = bytes;
    if (g_slot >= 0) {
        uint64_t *u = &g_region->procs[g_slot].used[rdev];
        if (take > ld(u)) take = ld(u);
        st(u, ld(u) - take);
    }
    st(&d->used_bytes, sub_clamp(ld(&d->used_bytes), take));
    g_own_used[rdev] = sub_clamp(g_own_used[rdev], bytes);
    region_unlock(locked);
}

HIDDEN void acct_set_context(int rdev, uint64_t bytes)
{
    if (rdev < 0 || rdev >= HAMID_MAX_DEVICES) return;
    acct_init();
    if (!g_region || g_slot < 0) return;
    struct hamid_device *d = &g_region->devices[rdev];
    struct hamid_proc *s = &g_region->procs[g_slot];
    int locked = region_lock();
    uint64_t old = g_own_ctx[rdev];
    g_own_ctx[rdev] = bytes;
    st(&s->context[rdev], bytes);
    if (bytes >= old) {
        st(&s->used[rdev], ld(&s->used[rdev]) + (bytes - old));
        st(&d->used_bytes, ld(&d->used_bytes) + (bytes - old));
        g_own_used[rdev] += bytes - old;
    } else {
        uint64_t diff = old - bytes;
        g_own_used[rdev] = sub_clamp(g_own_used[rdev], diff);
        if (diff > ld(&s->used[rdev])) diff = ld(&s->used[rdev]);
        st(&s->used[rdev], ld(&s->used[rdev]) - diff);
        st(&d->used_bytes, sub_clamp(ld(&d->used_bytes), diff));
    }
    if (ld(&d->used_bytes) > d->peak_used_bytes) d->peak_used_bytes = ld(&d->used_bytes);
    bump_device_count_locked(rdev);
    region_unlock(locked);
}

/* This process's own numbers come from its own tallies: its slot in the region shows them to the daemon and
   to the container's other processes, but the container can write it. */
HIDDEN uint64_t acct_proc_used(int rdev)
{
    if (!g_region || g_slot < 0 || rdev < 0 || rdev >= HAMID_MAX_DEVICES) return 0;
    return g_own_used[rdev];
}

HIDDEN uint64_t acct_proc_context(int rdev)
{
    if (!g_region || g_slot < 0 || rdev < 0 || rdev >= HAMID_MAX_DEVICES) return 0;
    return g_own_ctx[rdev];
}

HIDDEN int region_reclaim_dead(void)
{
    if (!region_ready() || g_private) return 0;
    int locked = region_lock();
    int n = reclaim_dead_locked();
    region_unlock(locked);
    return n;
}

/* ---- NVML's pids and the context lock (nvmlpid.c) ---- */

HIDDEN void acct_set_nvml_pid(int32_t pid)
{
    acct_init();
    if (g_region && g_slot >= 0) __atomic_store_n(&g_region->procs[g_slot].nvml_pid, pid, __ATOMIC_RELAXED);
}

HIDDEN int region_nvml_pid_taken(int32_t pid)
{
    if (!g_region || g_private || pid <= 0) return 0;
    uint32_t hw = __atomic_load_n(&g_region->proc_high_water, __ATOMIC_RELAXED);
    if (hw > HAMID_MAX_PROCS) hw = HAMID_MAX_PROCS;
    for (uint32_t i = 0; i < hw; i++)
        if ((int)i != g_slot && __atomic_load_n(&g_region->procs[i].pid, __ATOMIC_ACQUIRE) > 0 &&
            __atomic_load_n(&g_region->procs[i].nvml_pid, __ATOMIC_RELAXED) == pid)
            return 1;
    return 0;
}

HIDDEN int region_nvml_pid_ours(int32_t pid)
{
    if (pid <= 0) return 0;
    if (pid == (int32_t)getpid()) return 1;
    if (!g_region || g_private) return 0;
    uint32_t hw = __atomic_load_n(&g_region->proc_high_water, __ATOMIC_RELAXED);
    if (hw > HAMID_MAX_PROCS) hw = HAMID_MAX_PROCS;
    for (uint32_t i = 0; i < hw; i++)
        if (__atomic_load_n(&g_region->procs[i].pid, __ATOMIC_ACQUIRE) > 0 &&
            __atomic_load_n(&g_region->procs[i].nvml_pid, __ATOMIC_RELAXED) == pid)
            return 1;
    return 0;
}

HIDDEN int region_ctx_lock(int rdev, uint64_t timeout_ns)
{
    if (!region_ready() || g_private || rdev < 0 || rdev >= HAMID_MAX_DEVICES) return -1;
    pthread_mutex_t *m = (pthread_mutex_t *)(void *)g_region->devices[rdev].ctx_lock_storage;
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    uint64_t t = (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec + timeout_ns;
    ts.tv_sec = (time_t)(t / 1000000000ull);
    ts.tv_nsec = (long)(t % 1000000000ull);
    int rc = pthread_mutex_timedlock(m, &ts);
    if (rc == EOWNERDEAD) { /* it guards no data: just take it over */
        pthread_mutex_consistent(m);
        rc = 0;
    }
    if (rc) LOG_DEBUG("context lock not taken (%d)", rc);
    return rc ? -1 : 0;
}

HIDDEN void region_ctx_unlock(int rdev, int locked)
{
    if (locked == 0) pthread_mutex_unlock((pthread_mutex_t *)(void *)g_region->devices[rdev].ctx_lock_storage);
}
