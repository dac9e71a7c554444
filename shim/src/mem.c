/*
 * mem.c: the memory limit. It owns the process-local table of live
 * allocations (pointer, VMM handle or array -> device, bytes) and the
 * wrappers of every allocator and free the driver has: cuMemAlloc, pitch,
 * managed, cuMemAllocAsync, pool allocations, VMM cuMemCreate/cuMemRelease,
 * arrays and mipmapped arrays, plus the overhead of the primary context and
 * of contexts the program makes (cuCtxCreate), what a context takes with it
 * when it goes (primary release or reset, cuCtxDestroy), and the views
 * cuMemGetInfo / cuDeviceTotalMem.
 *
 * Order of operations, always: reserve in the region (atomic admission) ->
 * real allocation -> record; on failure the reservation is returned. Frees
 * take the record out first, call the driver, and put it back only if the
 * driver refused; untracked pointers are passed to the driver untouched and
 * its CUresult is returned as is.
 */
#include "shim.h"

#include <stdlib.h>
#include <string.h>
#include <unistd.h>

enum { K_EMPTY = 0, K_PTR = 1, K_VMM = 2, K_ARRAY = 3, K_MIPMAP = 4, K_CTX = 5, K_TOMB = 0xff };

struct rec {
    uint64_t key;
    uint64_t bytes;
    CUcontext ctx; /* the context it was made in; NULL: none in particular (VMM handles) */
    uint8_t kind;
    int8_t rdev;
};

static struct {
    pthread_mutex_t mu;
    struct rec *slots;
    size_t cap, used; /* used counts live + tombstones */
} g_tab = {PTHREAD_MUTEX_INITIALIZER, NULL, 0, 0};

static size_t hash_key(uint64_t k, uint8_t kind)
{
    k ^= (uint64_t)kind << 59;
    k ^= k >> 33;
    k *= 0xff51afd7ed558ccdull;
    k ^= k >> 33;
    return (size_t)k;
}

static void tab_grow_locked(void)
{
    size_t ncap = g_tab.cap ? g_tab.cap * 2 : 1024;
    struct rec *n = calloc(ncap, sizeof *n);
    if (!n) return;
    size_t live = 0;
    for (size_t i = 0; i < g_tab.cap; i++) {
        struct rec *r = &g_tab.slots[i];
        if (r->kind == K_EMPTY || r->kind == K_TOMB) continue;
        size_t j = hash_key(r->key, r->kind) & (ncap - 1);
        while (n[j].kind != K_EMPTY) j = (j + 1) & (ncap - 1);
        n[j] = *r;
        live++;
    }
    free(g_tab.slots);
    g_tab.slots = n;
    g_tab.cap = ncap;
    g_tab.used = live;
}

/*
 * Stores a record; 0 stored, -1 no room (growing failed and the table is
 * full). The probe visits each slot at most once, so a table that cannot
 * grow never makes it loop.
 */
static int tab_put(uint8_t kind, uint64_t key, int rdev, uint64_t bytes, CUcontext ctx)
{
    int rc = -1;
    pthread_mutex_lock(&g_tab.mu);
    if ((g_tab.used + 1) * 10 >= g_tab.cap * 7) tab_grow_locked(); /* may fail: then the table as it is */
    if (g_tab.cap) {
        size_t m = g_tab.cap - 1, j = hash_key(key, kind) & m, tomb = (size_t)-1, empty = (size_t)-1;
        for (size_t n = 0; n < g_tab.cap; n++, j = (j + 1) & m) {
            struct rec *r = &g_tab.slots[j];
            if (r->kind == K_EMPTY) { empty = j; break; }
            if (r->kind == K_TOMB) { if (tomb == (size_t)-1) tomb = j; }
            else if (r->kind == kind && r->key == key) { /* driver reused a key we missed freeing */
                r->bytes += bytes; /* keep both charges so the next free returns all of it */
                pthread_mutex_unlock(&g_tab.mu);
                return 0;
            }
        }
        if (tomb != (size_t)-1) j = tomb;
        else if (empty != (size_t)-1) { j = empty; g_tab.used++; }
        else j = (size_t)-1;
        if (j != (size_t)-1) {
            g_tab.slots[j] = (struct rec){key, bytes, ctx, kind, (int8_t)rdev};
            rc = 0;
        }
    }
    pthread_mutex_unlock(&g_tab.mu);
    return rc;
}

/* Removes the record; returns 1 and its device/bytes/context when found. */
static int tab_take(uint8_t kind, uint64_t key, int *rdev, uint64_t *bytes, CUcontext *ctx)
{
    int found = 0;
    pthread_mutex_lock(&g_tab.mu);
    if (g_tab.cap) {
        size_t m = g_tab.cap - 1, j = hash_key(key, kind) & m;
        for (;;) {
            struct rec *r = &g_tab.slots[j];
            if (r->kind == K_EMPTY) break;
            if (r->kind == kind && r->key == key) {
                *rdev = r->rdev;
                *bytes = r->bytes;
                *ctx = r->ctx;
                r->kind = K_TOMB;
                found = 1;
                break;
            }
            j = (j + 1) & m;
        }
    }
    pthread_mutex_unlock(&g_tab.mu);
    return found;
}

/*
 * A context is gone and the driver freed what was made in it: drops the
 * records of `ctx`, and with rdev >= 0 also those of no context in particular
 * on that device (a primary context's end takes VMM handles too), and
 * returns the bytes per device in sums[].
 */
static void tab_drop_context(CUcontext ctx, int rdev, uint64_t sums[HAMID_MAX_DEVICES])
{
    memset(sums, 0, sizeof(uint64_t) * HAMID_MAX_DEVICES);
    pthread_mutex_lock(&g_tab.mu);
    for (size_t i = 0; i < g_tab.cap; i++) {
        struct rec *r = &g_tab.slots[i];
        if (r->kind == K_EMPTY || r->kind == K_TOMB || r->rdev < 0 || r->rdev >= HAMID_MAX_DEVICES) continue;
        if ((ctx && r->ctx == ctx) || (rdev >= 0 && r->rdev == rdev && (!r->ctx || !ctx))) {
            sums[(int)r->rdev] += r->bytes;
            r->kind = K_TOMB;
        }
    }
    pthread_mutex_unlock(&g_tab.mu);
}

static void release_dropped(const uint64_t sums[HAMID_MAX_DEVICES])
{
    for (int d = 0; d < HAMID_MAX_DEVICES; d++)
        if (sums[d]) acct_release(d, sums[d]);
}

static CUcontext current_ctx(void)
{
    CUcontext c = NULL;
    if (g_cu.cuCtxGetCurrent && g_cu.cuCtxGetCurrent(&c) != CUDA_SUCCESS) c = NULL;
    return c;
}

/* ---- sizes ---- */

#define MIB (1024ull * 1024ull)
#define SIZE_OVERFLOW UINT64_MAX /* an estimate that does not fit 64 bits: never admitted under a limit */

/* What the driver really takes: 2 MiB pages for large blocks, 512 B granules for small ones. Overflow-checked. */
static uint64_t charge_size(uint64_t bytes)
{
    uint64_t a = bytes >= MIB ? 2 * MIB : 512;
    if (!bytes) bytes = 1;
    if (bytes > SIZE_OVERFLOW - (a - 1)) return SIZE_OVERFLOW;
    return (bytes + a - 1) / a * a;
}

/* a * b * ..., SIZE_OVERFLOW when it does not fit. */
static uint64_t mul_sat(uint64_t a, uint64_t b)
{
    uint64_t r;
    return __builtin_mul_overflow(a, b, &r) ? SIZE_OVERFLOW : r;
}

static uint64_t add_sat(uint64_t a, uint64_t b)
{
    uint64_t r;
    return __builtin_add_overflow(a, b, &r) ? SIZE_OVERFLOW : r;
}

static uint64_t dim(uint64_t v) { return v ? v : 1; }

static unsigned format_bytes(int fmt)
{
    switch (fmt) {
    case 0x01: case 0x08: return 1;              /* (un)signed int8 */
    case 0x02: case 0x09: case 0x10: return 2;   /* (un)signed int16, half */
    case 0x03: case 0x0a: case 0x20: return 4;   /* (un)signed int32, float */
    default: return 4;
    }
}

/* ---- helpers ---- */

struct where { int ord, rdev; };

static int locate_current(struct where *w)
{
    acct_init();
    w->ord = dev_current_ordinal();
    if (w->ord < 0) return -1;
    w->rdev = dev_region_index(w->ord);
    return w->rdev < 0 ? -1 : 0;
}

static int locate_stream(CUstream s, struct where *w)
{
    acct_init();
    if (!dev_single_device() && g_cu.cuStreamGetDevice && s && s != CU_STREAM_LEGACY && s != CU_STREAM_PER_THREAD) {
        CUdevice d;
        if (g_cu.cuStreamGetDevice(s, &d) == CUDA_SUCCESS) {
            w->ord = d;
            w->rdev = dev_region_index(d);
            return w->rdev < 0 ? -1 : 0;
        }
    }
    return locate_current(w);
}

extern HIDDEN int limiter_stream_capturing(CUstream s, int ptsz);

#define REAL(fn) do { ensure_cuda(); if (UNLIKELY(!g_cu.fn)) return CUDA_ERROR_NOT_FOUND; } while (0)

/* ---- NVML helpers for the context overhead ---- */

static int nvml_device_used(CUdevice ord, uint64_t *used)
{
    nvmlDevice_t h;
    nvmlMemory_t m;
    if (dev_nvml_handle(ord, &h) != 0 || !g_nv.nvmlDeviceGetMemoryInfo) return -1;
    if (g_nv.nvmlDeviceGetMemoryInfo(h, &m) != NVML_SUCCESS) return -1;
    *used = m.used;
    return 0;
}

static uint64_t g_last_reconcile[HAMID_MAX_DEVICES];

/*
 * Where NVML's per-process figure for this process can be read (nvmlpid.c
 * finds it, in a pid namespace too), it is the truth for everything the shim
 * cannot see (context, loaded modules, driver rounding): the difference to
 * the tracked allocations becomes this process's overhead. At most every
 * 200 ms per device.
 */
/* Without NVML's per-process figure: the smallest context size any process of
 * the container measured is the best estimate (a measurement can only be
 * inflated by other processes allocating at the same moment). */
static void context_from_region(int rdev)
{
    if (!g_region || g_cfg.context_bytes_override) return;
    uint64_t best = __atomic_load_n(&g_region->devices[rdev].context_bytes, __ATOMIC_RELAXED);
    if (best && best < acct_proc_context(rdev)) acct_set_context(rdev, best);
}

static void reconcile(int rdev, CUdevice ord, int force)
{
    if (g_cfg.context_bytes_override || rdev < 0) return;
    if (!g_cfg.nvml_reconcile) {
        context_from_region(rdev);
        return;
    }
    uint64_t now = mono_ns(), last = __atomic_load_n(&g_last_reconcile[rdev], __ATOMIC_RELAXED);
    if (!force && last && now - last < 200000000ull) return;
    if (!__atomic_compare_exchange_n(&g_last_reconcile[rdev], &last, now, 0, __ATOMIC_RELAXED, __ATOMIC_RELAXED) &&
        !force)
        return;
    uint64_t nv;
    if (nvmlpid_usage(ord, &nv) != 0) {
        context_from_region(rdev);
        return;
    }
    uint64_t u = acct_proc_used(rdev), cx = acct_proc_context(rdev);
    uint64_t tracked = u > cx ? u - cx : 0;
    if (nv >= tracked && nv - tracked < (16ull << 30)) acct_set_context(rdev, nv - tracked);
}

HIDDEN void mem_maybe_reconcile(int rdev, CUdevice ord) { reconcile(rdev, ord, 0); }

#define LARGE_ALLOC (256ull << 20)

/* Admission; before refusing, bring this process's overhead up to date once. */
static int reserve(const struct where *w, uint64_t bytes)
{
    if (acct_reserve(w->rdev, bytes, 0) == 0) return 0;
    reconcile(w->rdev, w->ord, 1);
    return acct_reserve(w->rdev, bytes, 0);
}

/*
 * The driver's real size is known only once it allocated: every byte of it
 * is admitted. An excess over the estimate goes through admission like any
 * allocation (-1: it does not fit, the estimate is returned and the caller
 * frees the allocation and refuses); a shortfall is given back.
 */
static int settle(const struct where *w, uint64_t guess, uint64_t real)
{
    /* no reconcile here: NVML already shows the whole allocation, its record does not exist yet */
    if (real > guess && acct_reserve(w->rdev, real - guess, 0) != 0) {
        acct_release(w->rdev, guess);
        LOG_INFO("device %d: the driver took %llu B where %llu B were estimated; over the limit, refused", w->rdev,
                 (unsigned long long)real, (unsigned long long)guess);
        return -1;
    }
    if (real < guess) acct_release(w->rdev, guess - real);
    return 0;
}

/* ---- allocators ---- */

/* ctx: the context whose end frees it; NULL for VMM handles and pool blocks (the device's end only) */
/* An allocation the shim cannot record could never be returned: it is undone and refused. */
static void undo_alloc(uint8_t kind, uint64_t key)
{
    switch (kind) {
    case K_PTR: if (g_cu.cuMemFree_v2) g_cu.cuMemFree_v2(key); break;
    case K_VMM: if (g_cu.cuMemRelease) g_cu.cuMemRelease(key); break;
    case K_ARRAY: if (g_cu.cuArrayDestroy) g_cu.cuArrayDestroy((CUarray)(uintptr_t)key); break;
    case K_MIPMAP: if (g_cu.cuMipmappedArrayDestroy) g_cu.cuMipmappedArrayDestroy((CUmipmappedArray)(uintptr_t)key); break;
    default: break;
    }
}

static CUresult after_alloc_in(CUresult r, uint8_t kind, uint64_t key, const struct where *w, uint64_t charged,
                               CUcontext ctx)
{
    if (r != CUDA_SUCCESS) {
        acct_release(w->rdev, charged);
        return r;
    }
    if (tab_put(kind, key, w->rdev, charged, ctx) != 0) {
        LOG_ERR("no memory for the allocation table; refusing an allocation of %llu B", (unsigned long long)charged);
        undo_alloc(kind, key);
        acct_release(w->rdev, charged);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    reconcile(w->rdev, w->ord, charged >= LARGE_ALLOC);
    return r;
}

static CUresult after_alloc(CUresult r, uint8_t kind, uint64_t key, const struct where *w, uint64_t charged)
{
    return after_alloc_in(r, kind, key, w, charged, kind == K_VMM || r != CUDA_SUCCESS ? NULL : current_ctx());
}

EXPORT CUresult cuMemAlloc_v2(CUdeviceptr *dptr, size_t bytesize)
{
    REAL(cuMemAlloc_v2);
    struct where w;
    if (!dptr || !bytesize || locate_current(&w) != 0) return g_cu.cuMemAlloc_v2(dptr, bytesize);
    uint64_t c = charge_size(bytesize);
    if (reserve(&w, c) != 0) return CUDA_ERROR_OUT_OF_MEMORY;
    CUresult r = g_cu.cuMemAlloc_v2(dptr, bytesize);
    return after_alloc(r, K_PTR, r == CUDA_SUCCESS ? *dptr : 0, &w, c);
}

EXPORT CUresult cuMemAllocManaged(CUdeviceptr *dptr, size_t bytesize, unsigned int flags)
{
    REAL(cuMemAllocManaged);
    struct where w;
    if (!dptr || !bytesize || locate_current(&w) != 0) return g_cu.cuMemAllocManaged(dptr, bytesize, flags);
    uint64_t c = charge_size(bytesize);
    if (reserve(&w, c) != 0) return CUDA_ERROR_OUT_OF_MEMORY;
    CUresult r = g_cu.cuMemAllocManaged(dptr, bytesize, flags);
    return after_alloc(r, K_PTR, r == CUDA_SUCCESS ? *dptr : 0, &w, c);
}

EXPORT CUresult cuMemAllocPitch_v2(CUdeviceptr *dptr, size_t *pitch, size_t width, size_t height, unsigned int esz)
{
    REAL(cuMemAllocPitch_v2);
    struct where w;
    if (!dptr || !pitch || !width || !height || locate_current(&w) != 0)
        return g_cu.cuMemAllocPitch_v2(dptr, pitch, width, height, esz);
    uint64_t row = width > SIZE_OVERFLOW - 511 ? SIZE_OVERFLOW : (width + 511) / 512 * 512;
    uint64_t guess = charge_size(mul_sat(row, height));
    if (reserve(&w, guess) != 0) return CUDA_ERROR_OUT_OF_MEMORY;
    CUresult r = g_cu.cuMemAllocPitch_v2(dptr, pitch, width, height, esz);
    if (r != CUDA_SUCCESS) return after_alloc(r, K_PTR, 0, &w, guess);
    uint64_t real = charge_size(mul_sat(*pitch, height));
    if (settle(&w, guess, real) != 0) { /* the driver's pitch took more than fits: undone */
        g_cu.cuMemFree_v2(*dptr);
        *dptr = 0;
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    return after_alloc(r, K_PTR, *dptr, &w, real);
}

static CUresult alloc_async(CUresult (*fn)(CUdeviceptr *, size_t, CUstream), CUresult (*pool_fn)(CUdeviceptr *, size_t, CUmemoryPool, CUstream),
                            CUmemoryPool pool, CUdeviceptr *dptr, size_t bytesize, CUstream s, int ptsz)
{
#define CALL() (fn ? fn(dptr, bytesize, s) : pool_fn(dptr, bytesize, pool, s))
    struct where w;
    if (!dptr || !bytesize || limiter_stream_capturing(s, ptsz) || locate_stream(s, &w) != 0) return CALL();
    uint64_t c = charge_size(bytesize);
    if (reserve(&w, c) != 0) return CUDA_ERROR_OUT_OF_MEMORY;
    CUresult r = CALL();
    return after_alloc_in(r, K_PTR, r == CUDA_SUCCESS ? *dptr : 0, &w, c, NULL);
#undef CALL
}

EXPORT CUresult cuMemAllocAsync(CUdeviceptr *dptr, size_t bytesize, CUstream s)
{
    REAL(cuMemAllocAsync);
    return alloc_async(g_cu.cuMemAllocAsync, NULL, NULL, dptr, bytesize, s, 0);
}

EXPORT CUresult cuMemAllocAsync_ptsz(CUdeviceptr *dptr, size_t bytesize, CUstream s)
{
    REAL(cuMemAllocAsync_ptsz);
    return alloc_async(g_cu.cuMemAllocAsync_ptsz, NULL, NULL, dptr, bytesize, s, 1);
}

EXPORT CUresult cuMemAllocFromPoolAsync(CUdeviceptr *dptr, size_t bytesize, CUmemoryPool pool, CUstream s)
{
    REAL(cuMemAllocFromPoolAsync);
    return alloc_async(NULL, g_cu.cuMemAllocFromPoolAsync, pool, dptr, bytesize, s, 0);
}

EXPORT CUresult cuMemAllocFromPoolAsync_ptsz(CUdeviceptr *dptr, size_t bytesize, CUmemoryPool pool, CUstream s)
{
    REAL(cuMemAllocFromPoolAsync_ptsz);
    return alloc_async(NULL, g_cu.cuMemAllocFromPoolAsync_ptsz, pool, dptr, bytesize, s, 1);
}

/* A free: take the record, call the driver, restore the record if it refused. */
static CUresult free_common(uint8_t kind, uint64_t key, CUresult r_fn(void *), void *arg)
{
    int rdev = -1;
    uint64_t bytes = 0;
    CUcontext ctx = NULL;
    int had = key ? tab_take(kind, key, &rdev, &bytes, &ctx) : 0;
    CUresult r = r_fn(arg);
    if (had) {
        if (r == CUDA_SUCCESS) acct_release(rdev, bytes);
        else if (tab_put(kind, key, rdev, bytes, ctx) != 0) /* still allocated, no room to remember it: stays charged */
            LOG_ERR("no memory for the allocation table; %llu B stay charged", (unsigned long long)bytes);
    }
    return r;
}

struct free_args { CUdeviceptr p; CUstream s; CUmemGenericAllocationHandle h; CUarray a; CUmipmappedArray m; };
static CUresult call_free(void *x) { return g_cu.cuMemFree_v2(((struct free_args *)x)->p); }
static CUresult call_free_async(void *x) { struct free_args *f = x; return g_cu.cuMemFreeAsync(f->p, f->s); }
static CUresult call_free_async_ptsz(void *x) { struct free_args *f = x; return g_cu.cuMemFreeAsync_ptsz(f->p, f->s); }
static CUresult call_release(void *x) { return g_cu.cuMemRelease(((struct free_args *)x)->h); }
static CUresult call_array_destroy(void *x) { return g_cu.cuArrayDestroy(((struct free_args *)x)->a); }
static CUresult call_mipmap_destroy(void *x) { return g_cu.cuMipmappedArrayDestroy(((struct free_args *)x)->m); }

EXPORT CUresult cuMemFree_v2(CUdeviceptr p)
{
    REAL(cuMemFree_v2);
    struct free_args a = {.p = p};
    return free_common(K_PTR, p, call_free, &a);
}

EXPORT CUresult cuMemFreeAsync(CUdeviceptr p, CUstream s)
{
    REAL(cuMemFreeAsync);
    struct free_args a = {.p = p, .s = s};
    if (limiter_stream_capturing(s, 0)) return g_cu.cuMemFreeAsync(p, s);
    return free_common(K_PTR, p, call_free_async, &a);
}

EXPORT CUresult cuMemFreeAsync_ptsz(CUdeviceptr p, CUstream s)
{
    REAL(cuMemFreeAsync_ptsz);
    struct free_args a = {.p = p, .s = s};
    if (limiter_stream_capturing(s, 1)) return g_cu.cuMemFreeAsync_ptsz(p, s);
    return free_common(K_PTR, p, call_free_async_ptsz, &a);
}

EXPORT CUresult cuMemCreate(CUmemGenericAllocationHandle *handle, size_t size, const CUmemAllocationProp *prop,
                            unsigned long long flags)
{
    REAL(cuMemCreate);
    if (!handle || !prop || !size || prop->location.type != CU_MEM_LOCATION_TYPE_DEVICE)
        return g_cu.cuMemCreate(handle, size, prop, flags);
    acct_init();
    struct where w = {prop->location.id, dev_region_index(prop->location.id)};
    if (w.rdev < 0) return g_cu.cuMemCreate(handle, size, prop, flags);
    if (reserve(&w, size) != 0) return CUDA_ERROR_OUT_OF_MEMORY;
    CUresult r = g_cu.cuMemCreate(handle, size, prop, flags);
    return after_alloc(r, K_VMM, r == CUDA_SUCCESS ? *handle : 0, &w, size);
}

EXPORT CUresult cuMemRelease(CUmemGenericAllocationHandle h)
{
    REAL(cuMemRelease);
    struct free_args a = {.h = h};
    return free_common(K_VMM, h, call_release, &a);
}

static CUresult array_common(CUarray *ph, const CUDA_ARRAY_DESCRIPTOR *d2, const CUDA_ARRAY3D_DESCRIPTOR *d3)
{
    struct where w;
    CUresult r;
#define CALL() (d2 ? g_cu.cuArrayCreate_v2(ph, d2) : g_cu.cuArray3DCreate_v2(ph, d3))
    if (!ph || (!d2 && !d3) || locate_current(&w) != 0) return CALL();
    uint64_t wd = d2 ? d2->Width : d3->Width, ht = d2 ? d2->Height : d3->Height, dp = d2 ? 1 : d3->Depth;
    unsigned ch = d2 ? d2->NumChannels : d3->NumChannels;
    int fmt = d2 ? d2->Format : d3->Format;
    uint64_t guess = charge_size(mul_sat(mul_sat(mul_sat(dim(wd), dim(ht)), dim(dp)), (uint64_t)format_bytes(fmt) * dim(ch)));
    if (reserve(&w, guess) != 0) return CUDA_ERROR_OUT_OF_MEMORY;
    r = CALL();
#undef CALL
    if (r != CUDA_SUCCESS) return after_alloc(r, K_ARRAY, 0, &w, guess);
    uint64_t real = guess;
    CUDA_ARRAY_MEMORY_REQUIREMENTS req;
    memset(&req, 0, sizeof req);
    if (g_cu.cuArrayGetMemoryRequirements && g_cu.cuArrayGetMemoryRequirements(&req, *ph, w.ord) == CUDA_SUCCESS &&
        req.size)
        real = charge_size(req.size);
    if (settle(&w, guess, real) != 0) {
        g_cu.cuArrayDestroy(*ph);
        *ph = NULL;
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    return after_alloc(r, K_ARRAY, (uint64_t)(uintptr_t)*ph, &w, real);
}

EXPORT CUresult cuArrayCreate_v2(CUarray *ph, const CUDA_ARRAY_DESCRIPTOR *d)
{
    REAL(cuArrayCreate_v2);
    return array_common(ph, d, NULL);
}

EXPORT CUresult cuArray3DCreate_v2(CUarray *ph, const CUDA_ARRAY3D_DESCRIPTOR *d)
{
    REAL(cuArray3DCreate_v2);
    return array_common(ph, NULL, d);
}

EXPORT CUresult cuArrayDestroy(CUarray a)
{
    REAL(cuArrayDestroy);
    struct free_args f = {.a = a};
    return free_common(K_ARRAY, (uint64_t)(uintptr_t)a, call_array_destroy, &f);
}

EXPORT CUresult cuMipmappedArrayCreate(CUmipmappedArray *ph, const CUDA_ARRAY3D_DESCRIPTOR *d, unsigned int levels)
{
    REAL(cuMipmappedArrayCreate);
    struct where w;
    if (!ph || !d || locate_current(&w) != 0) return g_cu.cuMipmappedArrayCreate(ph, d, levels);
    /* Every level of the chain, summed: a 1-D chain is nearly twice its base, a 2-D one 4/3, a 3-D one 8/7. */
    uint64_t elem = (uint64_t)format_bytes(d->Format) * dim(d->NumChannels), sum = 0;
    for (unsigned l = 0; l < (levels ? levels : 1) && l < 64; l++) {
        uint64_t lw = dim(d->Width >> l), lh = d->Height ? dim(d->Height >> l) : 1, ld = d->Depth ? dim(d->Depth >> l) : 1;
        sum = add_sat(sum, mul_sat(mul_sat(mul_sat(lw, lh), ld), elem));
    }
    uint64_t guess = charge_size(sum);
    if (reserve(&w, guess) != 0) return CUDA_ERROR_OUT_OF_MEMORY;
    CUresult r = g_cu.cuMipmappedArrayCreate(ph, d, levels);
    if (r != CUDA_SUCCESS) return after_alloc(r, K_MIPMAP, 0, &w, guess);
    uint64_t real = guess;
    CUDA_ARRAY_MEMORY_REQUIREMENTS req;
    memset(&req, 0, sizeof req);
    if (g_cu.cuMipmappedArrayGetMemoryRequirements &&
        g_cu.cuMipmappedArrayGetMemoryRequirements(&req, *ph, w.ord) == CUDA_SUCCESS && req.size)
        real = charge_size(req.size);
    if (settle(&w, guess, real) != 0) {
        g_cu.cuMipmappedArrayDestroy(*ph);
        *ph = NULL;
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    return after_alloc(r, K_MIPMAP, (uint64_t)(uintptr_t)*ph, &w, real);
}

EXPORT CUresult cuMipmappedArrayDestroy(CUmipmappedArray m)
{
    REAL(cuMipmappedArrayDestroy);
    struct free_args f = {.m = m};
    return free_common(K_MIPMAP, (uint64_t)(uintptr_t)m, call_mipmap_destroy, &f);
}

/* ---- views ---- */

EXPORT CUresult cuMemGetInfo_v2(size_t *free_b, size_t *total_b)
{
    REAL(cuMemGetInfo_v2);
    size_t f = 0, t = 0;
    CUresult r = g_cu.cuMemGetInfo_v2(&f, &t);
    if (r != CUDA_SUCCESS) return r;
    struct where w;
    if (locate_current(&w) == 0 && g_region) {
        uint64_t lim = acct_limit(w.rdev);
        if (lim) {
            uint64_t used = __atomic_load_n(&g_region->devices[w.rdev].used_bytes, __ATOMIC_RELAXED);
            uint64_t left = lim > used ? lim - used : 0;
            t = (size_t)(lim < t || !t ? lim : t);
            f = (size_t)(left < f ? left : f);
        }
    }
    if (free_b) *free_b = f;
    if (total_b) *total_b = t;
    return r;
}

EXPORT CUresult cuDeviceTotalMem_v2(size_t *bytes, CUdevice dev)
{
    REAL(cuDeviceTotalMem_v2);
    CUresult r = g_cu.cuDeviceTotalMem_v2(bytes, dev);
    if (r != CUDA_SUCCESS || !bytes) return r;
    acct_init();
    int rdev = dev_region_index(dev);
    if (rdev >= 0 && g_region) {
        uint64_t lim = acct_limit(rdev);
        if (lim && lim < *bytes) *bytes = (size_t)lim;
    }
    return r;
}

/* ---- contexts: their overhead counts ---- */

static int g_primary_refs[HAMID_MAX_DEVICES];
static CUcontext g_primary_ctx[HAMID_MAX_DEVICES]; /* the handle the driver gave for each device's */

/*
 * What a context just created on `dev` takes: NVML's device figure after
 * minus before (taken under the device's context lock when there was pid
 * learning to do, so no sibling's creation inflates it), kept in the region
 * as the container's smallest measurement; without a measurement, that
 * smallest one; HAMID_CONTEXT_SIZE overrides both. 0: unknown.
 */
static uint64_t context_size(CUdevice dev, int rdev, int have_before, uint64_t before)
{
    uint64_t ctx = g_cfg.context_bytes_override;
    uint64_t after;
    if (!ctx && have_before && nvml_device_used(dev, &after) == 0 && after > before && after - before < (4ull << 30)) {
        ctx = after - before;
        if (g_region) { /* keep the container's smallest measurement */
            uint64_t *slot = &g_region->devices[rdev].context_bytes, cur = __atomic_load_n(slot, __ATOMIC_RELAXED);
            while ((cur == 0 || ctx < cur) &&
                   !__atomic_compare_exchange_n(slot, &cur, ctx, 0, __ATOMIC_RELAXED, __ATOMIC_RELAXED)) {
            }
            cur = __atomic_load_n(slot, __ATOMIC_RELAXED);
            if (cur && cur < ctx) ctx = cur;
        }
    }
    if (!ctx && g_region) ctx = __atomic_load_n(&g_region->devices[rdev].context_bytes, __ATOMIC_RELAXED);
    return ctx;
}

static void context_created(CUdevice dev, int have_before, uint64_t before)
{
    int rdev = dev_region_index(dev);
    if (rdev < 0) return;
    acct_set_context(rdev, context_size(dev, rdev, have_before, before));
    mem_maybe_reconcile(rdev, dev);
}

EXPORT CUresult cuDevicePrimaryCtxRetain(CUcontext *pctx, CUdevice dev)
{
    REAL(cuDevicePrimaryCtxRetain);
    if (UNLIKELY(shim_refused())) return CUDA_ERROR_NOT_INITIALIZED;
    if (dev < 0 || dev >= HAMID_MAX_DEVICES) return g_cu.cuDevicePrimaryCtxRetain(pctx, dev);
    acct_init();
    int first = __atomic_load_n(&g_primary_refs[dev], __ATOMIC_ACQUIRE) == 0;
    uint64_t before = 0;
    void *learn = first ? nvmlpid_before_context(dev) : NULL;
    int have_before = first && !g_cfg.context_bytes_override && nvml_device_used(dev, &before) == 0;
    CUresult r = g_cu.cuDevicePrimaryCtxRetain(pctx, dev);
    if (r == CUDA_SUCCESS && pctx) __atomic_store_n(&g_primary_ctx[dev], *pctx, __ATOMIC_RELEASE);
    if (r == CUDA_SUCCESS && __atomic_fetch_add(&g_primary_refs[dev], 1, __ATOMIC_ACQ_REL) == 0) {
        nvmlpid_after_context(learn, dev);
        context_created(dev, have_before, before); /* still under the context lock: no sibling inflates it */
    }
    nvmlpid_end(learn);
    return r;
}

static void context_gone(CUdevice dev)
{
    int rdev = dev_region_index(dev);
    if (rdev < 0) return;
    uint64_t sums[HAMID_MAX_DEVICES];
    tab_drop_context(__atomic_load_n(&g_primary_ctx[dev], __ATOMIC_ACQUIRE), rdev, sums);
    release_dropped(sums); /* the driver freed them with the context */
    acct_set_context(rdev, 0);
}

EXPORT CUresult cuDevicePrimaryCtxRelease_v2(CUdevice dev)
{
    REAL(cuDevicePrimaryCtxRelease_v2);
    CUresult r = g_cu.cuDevicePrimaryCtxRelease_v2(dev);
    if (r == CUDA_SUCCESS && dev >= 0 && dev < HAMID_MAX_DEVICES) {
        int old = __atomic_load_n(&g_primary_refs[dev], __ATOMIC_ACQUIRE);
        while (old > 0 && !__atomic_compare_exchange_n(&g_primary_refs[dev], &old, old - 1, 0, __ATOMIC_ACQ_REL,
                                                       __ATOMIC_ACQUIRE)) {
        }
        if (old == 1) context_gone(dev);
    }
    return r;
}

EXPORT CUresult cuDevicePrimaryCtxReset_v2(CUdevice dev)
{
    REAL(cuDevicePrimaryCtxReset_v2);
    CUresult r = g_cu.cuDevicePrimaryCtxReset_v2(dev);
    if (r == CUDA_SUCCESS && dev >= 0 && dev < HAMID_MAX_DEVICES) {
        __atomic_store_n(&g_primary_refs[dev], 0, __ATOMIC_RELEASE);
        context_gone(dev);
    }
    return r;
}

/*
 * A context the program makes itself (cuCtxCreate, any ABI) costs what a
 * primary one does, and is charged as a record of its own (K_CTX, keyed and
 * owned by the context), so cuCtxDestroy returns it with the context's
 * allocations. Admission first, with the container's measured context size;
 * a creation that only turns out to be over the limit once measured is
 * undone (the context destroyed) and answered CUDA_ERROR_OUT_OF_MEMORY, as
 * the driver would answer a creation it has no memory for.
 */
struct ctx_make {
    struct where w;
    uint64_t reserved;
    int have_before;
    uint64_t before;
    void *learn;
};

static CUresult own_context_begin(CUdevice dev, struct ctx_make *m)
{
    memset(m, 0, sizeof *m);
    m->w.ord = dev;
    m->w.rdev = -1;
    if (UNLIKELY(shim_refused())) return CUDA_ERROR_NOT_INITIALIZED;
    if (dev < 0 || dev >= HAMID_MAX_DEVICES) return CUDA_SUCCESS;
    acct_init();
    m->w.rdev = dev_region_index(dev);
    if (m->w.rdev < 0) return CUDA_SUCCESS;
    uint64_t est = context_size(dev, m->w.rdev, 0, 0); /* nothing measured yet: the override or the region's */
    if (est && reserve(&m->w, est) != 0) return CUDA_ERROR_OUT_OF_MEMORY;
    m->reserved = est;
    m->learn = nvmlpid_before_context(dev);
    m->have_before = !g_cfg.context_bytes_override && nvml_device_used(dev, &m->before) == 0;
    return CUDA_SUCCESS;
}

static CUresult own_context_end(CUresult r, CUcontext *pctx, struct ctx_make *m)
{
    if (m->w.rdev < 0) return r;
    if (r != CUDA_SUCCESS || !pctx || !*pctx) {
        nvmlpid_end(m->learn);
        acct_release(m->w.rdev, m->reserved);
        return r;
    }
    nvmlpid_after_context(m->learn, m->w.ord);
    uint64_t size = context_size(m->w.ord, m->w.rdev, m->have_before, m->before);
    nvmlpid_end(m->learn);
    /* no reconcile here: NVML already shows the new context, its record does not exist yet */
    if (size > m->reserved && acct_reserve(m->w.rdev, size - m->reserved, 0) != 0) {
        acct_release(m->w.rdev, m->reserved);
        if (g_cu.cuCtxDestroy_v2) g_cu.cuCtxDestroy_v2(*pctx);
        *pctx = NULL;
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    if (size < m->reserved) acct_release(m->w.rdev, m->reserved - size);
    if (size && tab_put(K_CTX, (uint64_t)(uintptr_t)*pctx, m->w.rdev, size, *pctx) != 0) {
        acct_release(m->w.rdev, size); /* it could never be returned: undone */
        if (g_cu.cuCtxDestroy_v2) g_cu.cuCtxDestroy_v2(*pctx);
        *pctx = NULL;
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    mem_maybe_reconcile(m->w.rdev, m->w.ord);
    return r;
}

EXPORT CUresult cuCtxCreate_v2(CUcontext *pctx, unsigned int flags, CUdevice dev)
{
    REAL(cuCtxCreate_v2);
    struct ctx_make m;
    CUresult r = own_context_begin(dev, &m);
    if (r != CUDA_SUCCESS) return r;
    return own_context_end(g_cu.cuCtxCreate_v2(pctx, flags, dev), pctx, &m);
}

EXPORT CUresult cuCtxCreate_v3(CUcontext *pctx, CUexecAffinityParam *params, int n, unsigned int flags, CUdevice dev)
{
    REAL(cuCtxCreate_v3);
    struct ctx_make m;
    CUresult r = own_context_begin(dev, &m);
    if (r != CUDA_SUCCESS) return r;
    return own_context_end(g_cu.cuCtxCreate_v3(pctx, params, n, flags, dev), pctx, &m);
}

EXPORT CUresult cuCtxCreate_v4(CUcontext *pctx, CUctxCreateParams *params, unsigned int flags, CUdevice dev)
{
    REAL(cuCtxCreate_v4);
    struct ctx_make m;
    CUresult r = own_context_begin(dev, &m);
    if (r != CUDA_SUCCESS) return r;
    return own_context_end(g_cu.cuCtxCreate_v4(pctx, params, flags, dev), pctx, &m);
}

/* A context the program made itself: what was allocated in it goes with it. */
EXPORT CUresult cuCtxDestroy_v2(CUcontext ctx)
{
    REAL(cuCtxDestroy_v2);
    CUresult r = g_cu.cuCtxDestroy_v2(ctx);
    if (r == CUDA_SUCCESS && ctx) {
        uint64_t sums[HAMID_MAX_DEVICES];
        tab_drop_context(ctx, -1, sums);
        release_dropped(sums);
        /* its own overhead went too: NVML's figure says how much, now */
        for (CUdevice ord = 0; ord < HAMID_MAX_DEVICES; ord++) {
            int rdev = dev_region_index(ord);
            if (rdev >= 0 && acct_proc_used(rdev)) reconcile(rdev, ord, 1);
        }
    }
    return r;
}

HIDDEN void mem_after_fork_child(void)
{
    /* Nothing the parent allocated belongs to the child. */
    pthread_mutex_init(&g_tab.mu, NULL);
    free(g_tab.slots);
    g_tab.slots = NULL;
    g_tab.cap = g_tab.used = 0;
    memset(g_primary_refs, 0, sizeof g_primary_refs);
    memset(g_primary_ctx, 0, sizeof g_primary_ctx);
    memset(g_last_reconcile, 0, sizeof g_last_reconcile);
}
