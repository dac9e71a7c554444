"""Workloads for the compute-limit benchmark (bench/gpu/limits_bench.py), one
per process (the shim reads its limits once per process). Each runs a warm-up,
waits for a common start time, runs for a given number of seconds and prints
one JSON line: its rate (units/s), its pid, its measurement window (wall
clock) and, when the shim's region is set, the GPU time the shim accounted in
that window (read from the region file: hamid_region.h, device 0).

  python3 limits_work.py <class> <seconds> <start_epoch_ns | - | late>

With "-" it prints "READY <pid>" once warmed up and reads the start time (epoch
ns) from its stdin: the bench starts tenants that share the GPU on one clock
only once all of them are ready (a fixed lead left a slow warm-up, such as
dynamic shapes under a limit, measuring alone). With "late" it prints "LOADED
<pid>" once its modules are imported, touches no GPU until a line arrives on its
stdin, then starts CUDA, warms up and runs at once (a container that arrives).

Classes (each its own kind of GPU work, none tuned to the limiter):
  gemm     one large bf16 GEMM (8192^3), repeated: long kernels, queue full
  small    many small elementwise kernels (64 Ki floats): launch-bound, GPU often idle
  dyn      transformer-style inference: batch 1..8 and sequence length 32..512
           (step 32) drawn anew every step, 4 layers (d 2048) of attention + MLP, bf16:
           128 distinct (batch, seqlen) shapes, as an inference server sees (each
           run once in the warm-up, as a server's warm-up would)
  train    MLP training step with AdamW, batch size drawn from 6 sizes each step
  graph    a CUDA graph (an MLP block, captured once) replayed
  switch   a different class every second (gemm, small, dyn, train, in turn)
  cycle_*  gemm2/small2/...: the same with another seed (unseen variants)
  decode   autoregressive decoding with a static KV cache (8 layers, d 1024, 256 positions, the
           unwritten ones masked, as a server that captures or compiles its decode step keeps
           them): one token per sequence per step, then a new batch of 1..16 sequences every 256
           steps: tiny launch-bound kernels; its rate is in steps. (With the cache sliced to the
           written length, the attention's shape changing every step, it ran 25 steps/s with the
           GPU 1 % busy on the H200: CPU-bound elsewhere, not a test of a GPU limit.)
  conv     convolutional inference (5 conv layers, 3x3, 64..256 channels, fp16) on a batch of
           8, 16, 32 or 64 images of 96 or 128 pixels drawn anew each step (cuDNN picks per shape)
  hfgen    Hugging Face transformers generate() (a small GPT-2, random weights), one prompt at a time:
           launch-bound, the GPU a few percent busy; its rate is in tokens
  idle     a CUDA context and no work (a neighbour that is held, or gone quiet); with
           HAMID_BENCH_IDLE_NVML=1 it polls NVML every 100 ms as the shim's monitor does
           (process utilization, device samples): what such polling costs a tenant beside it
"""

import json
import mmap
import os
import random
import sys
import time

import torch

REGION_GPU_TIME_OFF = 256 + 56  # hamid_region.devices[0].gpu_time_ns (hamid_region.h)
REGION_THROTTLE_OFF = 256 + 64  # hamid_region.devices[0].throttle_ns: the time launches were held back
REGION_LAST_KERNEL_OFF = 256 + 72  # hamid_region.devices[0].last_kernel_realtime_ns: a recent launch (wall clock)


def region_read(off=REGION_GPU_TIME_OFF):
    return region_gpu_time(os.environ.get("CUDA_DEVICE_MEMORY_SHARED_CACHE"), off)


def region_gpu_time(p, off=REGION_GPU_TIME_OFF):
    """The GPU time (ns) the shim charged on device 0 in the region file at p (or the counter at off);
    None when there is none."""
    if not p or not os.path.exists(p) or os.path.getsize(p) < off + 8:
        return None
    with open(p, "rb") as f:
        m = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        try:
            g = int.from_bytes(m[off:off + 8], "little")
        finally:
            m.close()
    return g


def make(cls, seed=7):
    rng = random.Random(seed)
    dev = "cuda"
    if cls == "gemm":
        a = torch.randn(8192, 8192, device=dev, dtype=torch.bfloat16)
        b = torch.randn(8192, 8192, device=dev, dtype=torch.bfloat16)

        def step():
            torch.mm(a, b)
            return 1
        return step
    if cls == "small":
        x = torch.ones(64 * 1024, device=dev)

        def step():
            for _ in range(20):
                x.mul_(1.0000001).add_(1e-7)
            return 40
        return step
    if cls == "dyn":
        d, layers = 2048, 4
        # drawn on the GPU (on the CPU, 200 M weights took seconds of a late tenant's start-up)
        with torch.device(dev):
            ws = [(torch.nn.Linear(d, 3 * d), torch.nn.Linear(d, d), torch.nn.Linear(d, 4 * d),
                   torch.nn.Linear(4 * d, d)) for _ in range(layers)]
        mods = torch.nn.ModuleList([torch.nn.ModuleList(w) for w in ws]).to(dev, torch.bfloat16)
        emb = torch.randn(32000, d, device=dev, dtype=torch.bfloat16)

        shapes = [(b, 32 * s) for b in range(1, 9) for s in range(1, 17)]

        @torch.no_grad()
        def step(shape=None):
            b, s = shape or rng.choice(shapes)
            ids = torch.randint(0, 32000, (b, s), device=dev)
            h = emb[ids]
            for qkv, o, f1, f2 in mods:
                q, k, v = qkv(h).view(b, s, 3, 16, d // 16).unbind(2)
                att = torch.nn.functional.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2),
                                                                       v.transpose(1, 2), is_causal=True)
                h = h + o(att.transpose(1, 2).reshape(b, s, d))
                h = h + f2(torch.nn.functional.gelu(f1(h)))
            h.sum()
            return b * s  # tokens
        for sh in shapes:
            step(sh)
        return step
    if cls == "train":
        d = 2048
        model = torch.nn.Sequential(*[m for _ in range(4) for m in (torch.nn.Linear(d, d), torch.nn.GELU())],
                                    torch.nn.Linear(d, 10)).to(dev)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
        sizes = [64, 128, 256, 384, 512, 1024]
        data = {n: (torch.randn(n, d, device=dev), torch.randint(0, 10, (n,), device=dev)) for n in sizes}

        def step():
            n = rng.choice(sizes)
            x, y = data[n]
            opt.zero_grad(set_to_none=True)
            loss = torch.nn.functional.cross_entropy(model(x), y)
            loss.backward()
            opt.step()
            return n  # samples
        return step
    if cls == "decode":
        d, layers, heads, maxlen = 1024, 8, 16, 256
        mods = torch.nn.ModuleList([torch.nn.ModuleList([torch.nn.Linear(d, 3 * d), torch.nn.Linear(d, d),
                                                         torch.nn.Linear(d, 4 * d), torch.nn.Linear(4 * d, d)])
                                    for _ in range(layers)]).to(dev, torch.float16)
        kc = torch.zeros(layers, 16, heads, maxlen, d // heads, device=dev, dtype=torch.float16)
        vc = torch.zeros_like(kc)
        pos = torch.arange(maxlen, device=dev).view(1, 1, 1, maxlen)
        st = {"b": 1, "p": maxlen}

        @torch.no_grad()
        def step():
            if st["p"] >= maxlen:
                st["b"], st["p"] = rng.randint(1, 16), 0
            b, p = st["b"], st["p"]
            mask = pos <= p  # the positions written so far
            h = torch.randn(b, 1, d, device=dev, dtype=torch.float16)
            for i, (qkv, o, f1, f2) in enumerate(mods):
                q, k, v = qkv(h).view(b, 1, 3, heads, d // heads).unbind(2)
                kc[i, :b, :, p] = k[:, 0]
                vc[i, :b, :, p] = v[:, 0]
                att = torch.nn.functional.scaled_dot_product_attention(q.transpose(1, 2), kc[i, :b], vc[i, :b],
                                                                       attn_mask=mask)
                h = h + o(att.transpose(1, 2).reshape(b, 1, d))
                h = h + f2(torch.nn.functional.gelu(f1(h)))
            st["p"] = p + 1
            return 1  # steps: launch-bound, a step takes about as long for 1 sequence as for 16, and tokens/s
            # would follow the batch sizes a run happens to draw (0.8-4.4 k tokens/s second to second, H200)
        return step
    if cls == "conv":
        chans = [3, 64, 128, 128, 256, 256]
        net = torch.nn.Sequential(*[m for i in range(5) for m in (
            torch.nn.Conv2d(chans[i], chans[i + 1], 3, stride=2 if i % 2 else 1, padding=1), torch.nn.ReLU())],
            torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(), torch.nn.Linear(256, 1000)).to(dev, torch.float16)
        inputs = {(b, px): torch.randn(b, 3, px, px, device=dev, dtype=torch.float16)
                  for b in (8, 16, 32, 64) for px in (96, 128)}
        keys = list(inputs)

        @torch.no_grad()
        def step():
            b, px = rng.choice(keys)
            net(inputs[(b, px)])
            return b  # images
        for k in keys:
            net(inputs[k])
        return step
    if cls == "idle":
        torch.zeros(1, device=dev)
        polls = []
        if os.environ.get("HAMID_BENCH_IDLE_NVML") == "1":
            import pynvml
            pynvml.nvmlInit()
            h = pynvml.nvmlDeviceGetHandleByIndex(0)
            seen = [0, 0]

            def poll():
                for i, f in ((0, lambda t: pynvml.nvmlDeviceGetProcessUtilization(h, t)),
                             (1, lambda t: pynvml.nvmlDeviceGetSamples(h, pynvml.NVML_GPU_UTILIZATION_SAMPLES, t))):
                    try:
                        f(seen[i])
                    except pynvml.NVMLError:
                        pass
                    seen[i] = time.time_ns() // 1000
            polls.append(poll)

        def step():
            for f in polls:
                f()
            time.sleep(0.1)
            return 0
        return step
    if cls == "graph":
        d = 4096
        l1 = torch.nn.Linear(d, d).to(dev, torch.bfloat16)
        l2 = torch.nn.Linear(d, d).to(dev, torch.bfloat16)
        x = torch.randn(2048, d, device=dev, dtype=torch.bfloat16)
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.no_grad(), torch.cuda.stream(s):
            for _ in range(3):
                l2(torch.relu(l1(x)))
        torch.cuda.current_stream().wait_stream(s)
        g = torch.cuda.CUDAGraph()
        with torch.no_grad(), torch.cuda.graph(g):
            for _ in range(4):
                y = l2(torch.relu(l1(x)))
                y.add_(1)

        def step():
            g.replay()
            return 1
        return step
    if cls == "hfgen":
        # a Hugging Face transformers generate() server: a small GPT-2 built from its config (random weights, no
        # download), greedy generation of 32 tokens for one prompt of 16..64 tokens drawn each step; launch-bound
        # (the GPU a few percent busy), the neighbour HAMi's recent_kernel counts and NVML's samples rarely see
        from transformers import GPT2Config, GPT2LMHeadModel
        cfg = GPT2Config(n_layer=6, n_embd=512, n_head=8, vocab_size=8192, n_positions=256)
        with torch.device(dev):
            model = GPT2LMHeadModel(cfg).eval()
        model.generation_config.pad_token_id = 0

        @torch.no_grad()
        def step():
            ids = torch.randint(1, cfg.vocab_size, (1, rng.randrange(16, 65)), device=dev)
            model.generate(ids, max_new_tokens=32, min_new_tokens=32, do_sample=False)
            return 32  # tokens
        return step
    raise SystemExit(f"unknown class {cls}")


def main():
    cls, seconds, start_arg = sys.argv[1], float(sys.argv[2]), sys.argv[3]
    if start_arg == "late":  # loaded, no CUDA yet: CUDA, the warm-up and the run follow a line on stdin
        if cls == "hfgen":
            import transformers  # noqa: F401 - its import takes seconds: before the release, as torch's
        print(f"LOADED {os.getpid()}", flush=True)
        sys.stdin.readline()
    torch.cuda.init()
    torch.zeros(1, device="cuda")  # the process's first kernel (a fill)
    # its first kernels ran by now: a late tenant's neighbours are judged from here (issue 37's isolation case)
    print(f"KERNELS {time.time()}", flush=True)
    torch.backends.cuda.matmul.allow_tf32 = True
    if cls == "switch":
        parts = ["gemm", "small", "dyn", "train"]
        steps = {p: make(p) for p in parts}
    else:
        steps = {cls: make(cls)}
    for st in steps.values():  # warm-up: kernels loaded, cuBLAS heuristics, allocator primed
        t = time.perf_counter()
        while time.perf_counter() - t < 0.8:
            st()
    torch.cuda.synchronize()
    if start_arg == "-":
        print(f"READY {os.getpid()}", flush=True)
        start_ns = int(sys.stdin.readline())
    else:
        start_ns = 0 if start_arg == "late" else int(start_arg)
    while time.time_ns() < start_ns:
        time.sleep(0.0005)
    g0, h0 = region_read(), region_read(REGION_THROTTLE_OFF)
    t0 = time.time()
    units = {p: 0 for p in steps}
    end = t0 + seconds
    names = list(steps)
    last = None
    # units launched in each second of the run (by launch time; a held tenant's queue is a few ms, an unheld
    # one's the driver's): the bench reads a tenant's share after the daemon's correction has settled from it
    per_s = [0] * (int(seconds) + 1)
    while True:
        now = time.time()
        if now >= end:
            break
        p = names[int(now - t0) % len(names)] if len(names) > 1 else names[0]
        if p != last and last is not None:
            torch.cuda.synchronize()  # what a part queued counts in its own second, not the next part's
        last = p
        n = steps[p]()
        units[p] += n
        per_s[min(int(now - t0), len(per_s) - 1)] += n
    torch.cuda.synchronize()
    t1 = time.time()
    g1, h1 = region_read(), region_read(REGION_THROTTLE_OFF)
    # the switching class spends about seconds/len(names) in each part: its rate per part is units per part
    # over its share of the time
    rate = {p: units[p] / ((t1 - t0) / len(names)) for p in names}
    out = {"cls": cls, "pid": os.getpid(), "t0": t0, "t1": t1, "rate": rate, "per_s": per_s,
           "shim_gpu_s": None if g0 is None else (g1 - g0) / 1e9,
           "held_s": None if h0 is None else (h1 - h0) / 1e9}
    print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
