"""PyTorch workloads for the shim's H100 benchmark, one per process (the shim
reads its limits once per process). Prints one JSON line. Modes:

  memlimit                   mem_get_info, then a 3 GiB and a 5 GiB allocation
  tryalloc <MiB> [<MiB>...]  mem_get_info, then each allocation in turn (each freed before the next)
  hold <MiB>                 a cuBLAS matmul plus <MiB> of tensors, 'ready <pid>', wait for stdin
  matmul <seconds>           8192^3 bf16 matmul throughput (TFLOP/s)
  shares <seconds> <start>   rates of: a large matmul, a large elementwise kernel,
                             a CUDA graph of 100 small elementwise kernels
                             ('shapes', many alternating kernel shapes, runs only through 'one')
  one <workload> <seconds> <start_epoch_ns>  one of those, started at a given wall time
"""

import json
import sys
import time

import torch

GiB = 1 << 30


def sync():
    torch.cuda.synchronize()


def memlimit():
    free, total = torch.cuda.mem_get_info()
    out = {"free": free, "total": total, "backend": torch.cuda.get_allocator_backend()}
    for gib in (3, 5):
        try:
            t = torch.empty(gib * GiB, dtype=torch.uint8, device="cuda")
            t.fill_(1)
            sync()
            out[f"alloc_{gib}g"] = "ok"
            del t
            torch.cuda.empty_cache()
        except torch.OutOfMemoryError:
            out[f"alloc_{gib}g"] = "oom"
        except RuntimeError as e:  # noqa: PERF203
            out[f"alloc_{gib}g"] = "error: " + str(e)[:100]
    return out


def tryalloc(sizes_mib):
    free, total = torch.cuda.mem_get_info()
    out = {"free": free, "total": total, "allocs": {}}
    for mib in sizes_mib:
        try:
            t = torch.empty(mib << 20, dtype=torch.uint8, device="cuda")
            t.fill_(1)
            sync()
            out["allocs"][str(mib)] = "ok"
            del t
            torch.cuda.empty_cache()
        except torch.OutOfMemoryError:
            out["allocs"][str(mib)] = "oom"
    return out


# Many alternating kernel shapes: 320 matmuls (M = 64, 128, ..., 20480 rows of bf16 against one
# 2048 x 2048 weight) in a fixed shuffled order, each followed by a ReLU of its output. Every M is
# its own grid for the matmul and for the ReLU, so the shim's cost table sees about 640 shapes
# (function, grid, block) alternating, small and large mixed. One step is the next 32 of them
# (a chunk of the shuffled cycle, so a run that stops mid-cycle is not biased towards one size).
SHAPES_M = [64 * (i + 1) for i in range(320)]
SHAPES_CHUNK = 32
# For bench/gpu/shapes_diag.py: 'shapes_mm' is the same loop without the ReLUs (320 shapes of one kind);
# 'shape_one' is one shape of the loop (M = 10240, the middle) with its ReLU, 32 times a step.


def make(workload):
    if workload == "matmul":
        a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
        b = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)

        def step():
            torch.mm(a, b)
        return step, 2 * 8192**3
    if workload == "elementwise":
        x = torch.ones(32 * 1024 * 1024, device="cuda")

        def step():
            x.mul_(1.0000001)
        return step, 1
    if workload == "graph_small":
        x = torch.ones(1024 * 1024, device="cuda")
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            for _ in range(3):
                x.mul_(1.0000001)
        torch.cuda.current_stream().wait_stream(s)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            for _ in range(100):
                x.mul_(1.0000001)

        def step():
            g.replay()
        return step, 1
    if workload in ("shapes", "shapes_mm", "shape_one"):
        import random
        order = SHAPES_M[:] if workload != "shape_one" else [SHAPES_M[len(SHAPES_M) // 2 - 1]] * len(SHAPES_M)
        random.Random(18).shuffle(order)
        relu = workload != "shapes_mm"
        a = torch.randn(max(order), 2048, device="cuda", dtype=torch.bfloat16)
        w = torch.randn(2048, 2048, device="cuda", dtype=torch.bfloat16)
        out = torch.empty(max(order), 2048, device="cuda", dtype=torch.bfloat16)
        pos = [0]

        def step():
            i = pos[0]
            for m in order[i:i + SHAPES_CHUNK]:
                o = out[:m]
                torch.mm(a[:m], w, out=o)
                if relu:
                    o.relu_()
            pos[0] = (i + SHAPES_CHUNK) % len(order)
        return step, 1
    raise SystemExit(f"unknown workload {workload}")


def rate(step, seconds):
    sync()
    t0 = time.perf_counter()
    end = t0 + seconds
    n = 0
    while True:
        for _ in range(4):
            step()
        n += 4
        if time.perf_counter() >= end:
            break
    sync()
    return n / (time.perf_counter() - t0)


WINDOWS = {}
STEPS = [0]  # steps run_one ran, warm-ups included


def run_one(workload, seconds, start_ns=0):
    inner, _ = make(workload)

    def step():
        STEPS[0] += 1
        inner()
    if workload.startswith("shape"):
        for _ in range(len(SHAPES_M) // SHAPES_CHUNK):  # every shape once (cuBLAS heuristics, lazy loading)
            step()
    rate(step, 0.6)  # warm-up (and lets the limiter learn kernel costs)
    while start_ns and time.time_ns() < start_ns:
        time.sleep(0.001)
    t0 = time.time()
    r = rate(step, seconds)
    WINDOWS[workload] = [t0, time.time()]
    return r


def main():
    mode = sys.argv[1]
    torch.cuda.init()
    if mode == "memlimit":
        print(json.dumps(memlimit()))
    elif mode == "tryalloc":
        print(json.dumps(tryalloc([int(x) for x in sys.argv[2:]])))
    elif mode == "hold":
        a = torch.randn(4096, 4096, device="cuda")
        (a @ a).sum().item()
        keep = torch.empty(int(sys.argv[2]) << 20, dtype=torch.uint8, device="cuda")
        keep.fill_(1)
        sync()
        print(f"ready {__import__('os').getpid()}", flush=True)
        sys.stdin.readline()
        del keep
    elif mode == "matmul":
        step, flop = make("matmul")
        rate(step, 0.5)
        r = rate(step, float(sys.argv[2]))
        print(json.dumps({"tflops": r * flop / 1e12}))
    elif mode == "shares":
        secs = float(sys.argv[2])
        res = {w: run_one(w, secs) for w in ("matmul", "elementwise", "graph_small")}
        print(json.dumps({**res, "_windows": WINDOWS}))
    elif mode == "one":
        r = run_one(sys.argv[2], float(sys.argv[3]), int(sys.argv[4]))
        print(json.dumps({sys.argv[2]: r, "_windows": WINDOWS, "_steps_total": STEPS[0]}))


if __name__ == "__main__":
    main()
