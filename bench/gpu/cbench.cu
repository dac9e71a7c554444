// cbench.cu: the C/CUDA half of the shim's H100 benchmark (bench/gpu/run.sh
// builds it with nvcc on the GPU machine). Modes:
//   alloc_rate <seconds> <MiB> <start_epoch_ns>  cudaMalloc+cudaFree loop; prints "alloc_rate <n> <ns>"
//   launch_cost <n> <reps>                        batches of n empty-kernel launches; prints "launch_ns <best ns per launch>"
//   hold <malloc MiB> <vmm MiB> <pool MiB> <async MiB> <array MiB>
//        allocates through cudaMalloc, VMM (cuMemCreate+cuMemMap), an explicit pool
//        (cudaMallocFromPoolAsync), the default pool (cudaMallocAsync) and a CUDA array,
//        prints "ready <pid>", waits for a line on stdin, frees everything.
//   ctx_cycle <rounds> <MiB>  each round: a context of its own (cuCtxCreate), cuMemAlloc of <MiB> in it,
//        cuCtxDestroy without freeing; prints "round <i> <CUresult of the alloc>", then "meminfo <free> <total>"
//        from the primary context
//   ctx_hold <MiB>  a context of its own (cuCtxCreate: cuCtxCreate_v4 when built with CUDA 13) beside the
//        primary one, cuMemAlloc of <MiB> in it, prints "ready <pid>", waits for a line on stdin, destroys it
#include <cuda.h>
#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define CK(x) do { cudaError_t e_ = (x); if (e_ != cudaSuccess) { printf("error %s: %s\n", #x, cudaGetErrorString(e_)); exit(1); } } while (0)
#define CKD(x) do { CUresult e_ = (x); if (e_ != CUDA_SUCCESS) { printf("error %s: %d\n", #x, (int)e_); exit(1); } } while (0)

static long long now_ns(int clk) { struct timespec t; clock_gettime(clk, &t); return t.tv_sec * 1000000000LL + t.tv_nsec; }

__global__ void empty_kernel() {}

/* A context of the program's own, made current: cuCtxCreate is cuCtxCreate_v4 from CUDA 13 on. */
static CUcontext own_context(CUdevice dev)
{
    CUcontext c;
#if CUDA_VERSION >= 13000
    CKD(cuCtxCreate(&c, NULL, 0, dev));
#else
    CKD(cuCtxCreate(&c, 0, dev));
#endif
    return c;
}

int main(int argc, char **argv)
{
    setvbuf(stdout, NULL, _IOLBF, 0);
    if (argc < 2) return 2;
    CK(cudaSetDevice(0));
    CK(cudaFree(0));
    if (!strcmp(argv[1], "alloc_rate")) {
        double secs = atof(argv[2]);
        size_t sz = (size_t)atol(argv[3]) << 20;
        long long start = atoll(argv[4]);
        void *p;
        for (int i = 0; i < 10; i++) { CK(cudaMalloc(&p, sz)); CK(cudaFree(p)); }
        while (now_ns(CLOCK_REALTIME) < start) usleep(100);
        long long t0 = now_ns(CLOCK_MONOTONIC), end = t0 + (long long)(secs * 1e9);
        long n = 0;
        while (now_ns(CLOCK_MONOTONIC) < end) { CK(cudaMalloc(&p, sz)); CK(cudaFree(p)); n++; }
        printf("alloc_rate %ld %lld\n", n, now_ns(CLOCK_MONOTONIC) - t0);
    } else if (!strcmp(argv[1], "launch_cost")) {
        /* CPU cost of a launch: time only the submission of a batch small enough
           never to fill the launch queue, drain between batches; best of reps. */
        int n = atoi(argv[2]), reps = atoi(argv[3]);
        for (int i = 0; i < 2000; i++) empty_kernel<<<1, 1>>>();
        CK(cudaDeviceSynchronize());
        double best = 1e30;
        for (int r = 0; r < reps; r++) {
            long long t0 = now_ns(CLOCK_MONOTONIC);
            for (int i = 0; i < n; i++) empty_kernel<<<1, 1>>>();
            long long t1 = now_ns(CLOCK_MONOTONIC);
            CK(cudaDeviceSynchronize());
            double per = (double)(t1 - t0) / n;
            if (per < best) best = per;
        }
        printf("launch_ns %.1f\n", best);
    } else if (!strcmp(argv[1], "ctx_cycle")) {
        int rounds = atoi(argv[2]);
        size_t sz = (size_t)atol(argv[3]) << 20;
        CUcontext primary, own;
        CUdevice dev;
        CKD(cuCtxGetCurrent(&primary));
        CKD(cuDeviceGet(&dev, 0));
        for (int i = 0; i < rounds; i++) {
            own = own_context(dev);
            CUdeviceptr p = 0;
            CUresult r = cuMemAlloc(&p, sz);
            printf("round %d %d\n", i, (int)r);
            CKD(cuCtxDestroy(own));
        }
        CKD(cuCtxSetCurrent(primary));
        size_t fr = 0, tot = 0;
        CK(cudaMemGetInfo(&fr, &tot));
        printf("meminfo %zu %zu\n", fr, tot);
    } else if (!strcmp(argv[1], "ctx_hold")) {
        size_t sz = (size_t)atol(argv[2]) << 20;
        CUdevice dev;
        CKD(cuDeviceGet(&dev, 0));
        CUcontext own = own_context(dev);
        CUdeviceptr p = 0;
        CKD(cuMemAlloc(&p, sz));
        CKD(cuMemsetD8(p, 1, sz));
        CKD(cuCtxSynchronize());
        printf("ready %d\n", (int)getpid());
        char line[64];
        if (!fgets(line, sizeof line, stdin)) {}
        CKD(cuCtxDestroy(own));
        printf("freed\n");
    } else if (!strcmp(argv[1], "hold")) {
        size_t m = (size_t)atol(argv[2]) << 20, v = (size_t)atol(argv[3]) << 20, pl = (size_t)atol(argv[4]) << 20,
               as = (size_t)atol(argv[5]) << 20, ar = (size_t)atol(argv[6]) << 20;
        void *pm = NULL, *pp = NULL, *pa = NULL;
        cudaStream_t s;
        CK(cudaStreamCreate(&s));
        if (m) CK(cudaMalloc(&pm, m));
        CUmemGenericAllocationHandle h = 0;
        CUdeviceptr va = 0;
        if (v) {
            CUmemAllocationProp prop;
            memset(&prop, 0, sizeof prop);
            prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
            prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
            prop.location.id = 0;
            size_t g = 0;
            CKD(cuMemGetAllocationGranularity(&g, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM));
            v = (v + g - 1) / g * g;
            CKD(cuMemCreate(&h, v, &prop, 0));
            CKD(cuMemAddressReserve(&va, v, 0, 0, 0));
            CKD(cuMemMap(va, v, 0, h, 0));
            CUmemAccessDesc acc;
            acc.location = prop.location;
            acc.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
            CKD(cuMemSetAccess(va, v, &acc, 1));
            CKD(cuMemsetD8(va, 1, v));
        }
        cudaMemPool_t pool;
        if (pl) {
            cudaMemPoolProps pp_props;
            memset(&pp_props, 0, sizeof pp_props);
            pp_props.allocType = cudaMemAllocationTypePinned;
            pp_props.location.type = cudaMemLocationTypeDevice;
            pp_props.location.id = 0;
            CK(cudaMemPoolCreate(&pool, &pp_props));
            CK(cudaMallocFromPoolAsync(&pp, pl, pool, s));
            CK(cudaMemsetAsync(pp, 1, pl, s));
        }
        if (as) { CK(cudaMallocAsync(&pa, as, s)); CK(cudaMemsetAsync(pa, 1, as, s)); }
        cudaArray_t arr = NULL;
        if (ar) {
            cudaChannelFormatDesc d = cudaCreateChannelDesc<float>();
            CK(cudaMallocArray(&arr, &d, 4096, ar / (4096 * 4)));
        }
        CK(cudaStreamSynchronize(s));
        printf("ready %d\n", (int)getpid());
        char line[64];
        if (!fgets(line, sizeof line, stdin)) {}
        if (arr) CK(cudaFreeArray(arr));
        if (pa) CK(cudaFreeAsync(pa, s));
        if (pp) CK(cudaFreeAsync(pp, s));
        CK(cudaStreamSynchronize(s));
        if (v) { CKD(cuMemUnmap(va, v)); CKD(cuMemRelease(h)); CKD(cuMemAddressFree(va, v)); }
        if (pm) CK(cudaFree(pm));
        printf("freed\n");
    }
    return 0;
}
