"""One MPS tenant for bench/gpu/mps_partition_bench.py: a workload measured in scheduled windows.

Owns one process's work and its timing, nothing else. It loads its workload, warms up, prints
``{"ready": <pid>}``, then reads one JSON line from stdin: the windows it is active in, as
``[[start_epoch_ns, end_epoch_ns], ...]``. Between windows it sleeps (its context stays, idle).
In each window it issues steps until the window's end with at most IN_FLIGHT steps queued (an
event per step), so a window ends when its last step does and never spills into the next one.
Prints one JSON line: ``{"rates": [steps/s per window], "pid": ...}``.

Workloads: ``matmul`` and ``shapes`` (bench/gpu/torch_work.py: an 8192^3 bf16 GEMM; dynamic-shape
inference, 320 matmul+ReLU shapes) and ``spin``: a kernel that only does arithmetic in registers
(no memory traffic), filling whatever SMs the tenant is given; as a partner it occupies its SMs
without touching memory bandwidth or L2, which separates an SM partition's leaks from the memory
system's.
"""

from __future__ import annotations

import collections
import json
import os
import sys
import time

IN_FLIGHT = 4  # steps queued at most: a window's end is at most 4 steps late (tens of ms)


def torch_workload(name: str):
    import torch

    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import torch_work

    torch.cuda.init()
    step, _ = torch_work.make(name)
    if name == "shapes":  # every shape once (cuBLAS heuristics, lazy loading)
        for _ in range(len(torch_work.SHAPES_M) // torch_work.SHAPES_CHUNK):
            step()

    def event():
        e = torch.cuda.Event()
        e.record()
        return e
    return step, event, torch.cuda.synchronize


SPIN_SRC = r"""
extern "C" __global__ void spin(float *sink, int iters) {
    float a = threadIdx.x * 1e-3f, b = 1.0001f, c = 0.9999f, d = blockIdx.x * 1e-3f;
    for (int i = 0; i < iters; i++) {
        a = a * b + c; d = d * c + b; b = b * d + a; c = c * a + d;
    }
    if (a + b + c + d == 12345.678f) sink[0] = a;  /* never true: keeps the loop, writes nothing */
}
"""


def spin_workload():
    import cupy as cp

    k = cp.RawKernel(SPIN_SRC, "spin")
    sink = cp.zeros(1, dtype=cp.float32)
    blocks = cp.cuda.Device().attributes["MultiProcessorCount"] * 8

    def step():
        k((blocks,), (256,), (sink, cp.int32(20000)))

    def event():
        e = cp.cuda.Event()
        e.record()
        return e
    return step, event, cp.cuda.Device().synchronize


def window(step, event, sync, end_ns: int) -> float:
    q: collections.deque = collections.deque()
    t0 = time.perf_counter()
    n = 0
    while time.time_ns() < end_ns:
        step()
        q.append(event())
        n += 1
        if len(q) >= IN_FLIGHT:
            q.popleft().synchronize()
    sync()
    return n / (time.perf_counter() - t0)


def main():
    name = sys.argv[1]
    step, event, sync = spin_workload() if name == "spin" else torch_workload(name)
    end = time.monotonic() + 0.6  # warm-up
    while time.monotonic() < end:
        step()
        sync()
    print(json.dumps({"ready": os.getpid()}), flush=True)
    windows = json.loads(sys.stdin.readline())
    rates = []
    for start_ns, end_ns in windows:
        while time.time_ns() < start_ns:
            time.sleep(min(0.01, max(0.0, (start_ns - time.time_ns()) / 1e9)))
        rates.append(window(step, event, sync, end_ns))
    print(json.dumps({"rates": rates, "pid": os.getpid()}), flush=True)


if __name__ == "__main__":
    main()
