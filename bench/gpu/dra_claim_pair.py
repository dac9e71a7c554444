"""A DRA claim's limits on a real GPU (issue 41): prepared in process as kubelet's
NodePrepareResources would, then a tenant run through the limits file prepare wrote, paired with
an unlimited run of the same work on the same GPU.

    sudo python3 bench/gpu/dra_claim_pair.py --memory 4Gi --cores 30 --seconds 10 [--gpu 0] [--out F]
    python3 bench/gpu/dra_claim_pair.py --simulate H100:1 --dry   # the prepare alone, no GPU

What it does, in order:

1. a node daemon's state in a fresh directory (NVML, ``draDevices: all``), and the claim as the
   scheduler writes it (one result on ``gpu-<n>``, ``consumedCapacity`` memory and cores, a
   ``GpuConfig``), prepared by :class:`hamid.dra.prepare.ClaimPreparer`: the reservation in the
   ledger, the limits file, the CDI spec;
2. in a private mount namespace (``unshare --mount``), the spec's mounts made as a runtime would
   (the shim, the limits file read-only, the region directory), then ``torch_work.py tryalloc``
   below and above the claim's memory and ``matmul`` for ``--seconds`` with the shim preloaded;
3. ``matmul`` again without the shim (no limits): the baseline of the same run;
4. the claim unprepared (released).

Prints one JSON line: the claim, the limits file as decoded, the allocations (``ok``/``oom``),
both throughputs and their ratio (expected near ``cores``/100 with gpuCorePolicy force; the
device plugin's pair is ``limits_bench.py``). Needs root (the state directory, mounts), PyTorch
and the shim built (``make -C shim``).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

TORCH = [sys.executable, str(ROOT / "bench" / "gpu" / "torch_work.py")]


def prepare(args) -> tuple[object, dict, dict]:
    """The daemon, the CDI spec prepare wrote, and the claim."""
    from hamid.config.load import load_config, resolve_node
    from hamid.daemon import service
    from hamid.dra.claims import parse_claim
    from hamid.dra.prepare import ClaimPreparer
    from hamid.node.dragpus import dra_gpus

    over = {"stateDir": args.state, "nodeName": "bench", "draDevices": "all", "gpuCorePolicy": args.core_policy}
    if args.simulate:
        over["simulate"] = args.simulate
    config = load_config(None, over)
    d = service.prepare(config, resolve_node(config, "bench"), "bench")
    claim = {"metadata": {"namespace": "bench", "name": "claim", "uid": "bench-claim-0001"},
             "status": {"allocation": {"devices": {
                 "results": [{"request": "gpu", "driver": "gpu.hamid.io", "pool": "bench",
                              "device": f"gpu-{args.gpu}", "shareID": "bench-share",
                              "consumedCapacity": {"memory": args.memory, "cores": str(args.cores)}}],
                 "config": [{"source": "FromClaim", "requests": ["gpu"], "opaque": {
                     "driver": "gpu.hamid.io", "parameters": {"apiVersion": "gpu.hamid.io/v1alpha1",
                                                              "kind": "GpuConfig", "priority": 0}}}]}}}}
    alloc = parse_claim(claim, node="bench", uid="bench-claim-0001")
    door = d.service.door()
    preparer = ClaimPreparer(door, os.path.join(args.state, "cdi"))
    got = preparer.prepare(alloc, dra_gpus("all", door.view().gpus))
    spec_file = Path(args.state, "cdi", "gpu.hamid.io-claim-bench-claim-0001.json")
    spec = json.loads(spec_file.read_text())
    return d, spec, {"claim": claim["status"]["allocation"]["devices"]["results"][0], "cdi": got[0].cdi_id}


def inside(spec_path: str) -> int:
    """In the private mount namespace: make the spec's mounts, run the tenant's work with the shim."""
    spec = json.loads(Path(spec_path).read_text())
    edits = spec["edits"]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CUDA_DEVICE_", "HAMID_", "LD_PRELOAD"))}
    covered: set[str] = set()
    for m in edits.get("mounts") or []:
        dst = m["containerPath"]
        if dst == "/etc/ld.so.preload":
            continue  # preloaded by LD_PRELOAD below: the host's own programs stay unpreloaded
        parent = os.path.dirname(dst)
        if parent == "/usr/local/vgpu" and parent not in covered:  # this namespace's own, once
            os.makedirs(parent, exist_ok=True)
            subprocess.run(["mount", "-t", "tmpfs", "-o", "mode=0755,size=1m", "hamid-bench", parent], check=True)
            covered.add(parent)
        if os.path.isdir(m["hostPath"]):
            os.makedirs(dst, exist_ok=True)
        else:
            open(dst, "a").close()
        subprocess.run(["mount", "--bind", m["hostPath"], dst], check=True)
        if "ro" in (m.get("options") or []):
            subprocess.run(["mount", "-o", "remount,ro,bind", dst], check=True)
    for e in edits.get("env") or []:
        k, _, v = e.partition("=")
        if not k.startswith("CUDA_DEVICE_"):  # the limits file is the shim's only source of limits
            env[k] = v
    env["LD_PRELOAD"] = "/usr/local/vgpu/libvgpu.so"
    env["CUDA_VISIBLE_DEVICES"] = str(spec["gpu"])
    mib = spec["memory_mib"]
    out = {}
    p = subprocess.run([*TORCH, "tryalloc", str(mib * 3 // 4), str(mib * 5 // 4)], env=env, capture_output=True,
                       text=True, timeout=300)
    out["tryalloc"] = _last_json(p.stdout, p.stderr)
    p = subprocess.run([*TORCH, "matmul", str(spec["seconds"])], env=env, capture_output=True, text=True,
                       timeout=300 + spec["seconds"])
    out["limited"] = _last_json(p.stdout, p.stderr)
    print(json.dumps(out))
    return 0


def _last_json(out: str, err: str) -> dict:
    for ln in reversed(out.splitlines()):
        if ln.startswith("{"):
            return json.loads(ln)
    return {"error": err[-1500:]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--memory", default="4Gi")
    ap.add_argument("--cores", type=int, default=30)
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--gpu", type=int, default=0)
    ap.add_argument("--core-policy", default="force", choices=("default", "force"))
    ap.add_argument("--state", default=None)
    ap.add_argument("--simulate", default=None)
    ap.add_argument("--dry", action="store_true", help="prepare and print the edits; run nothing on a GPU")
    ap.add_argument("--out", default=None)
    ap.add_argument("--inside", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.inside:
        return inside(args.inside)
    args.state = args.state or tempfile.mkdtemp(prefix="hamid-dra-bench-")
    d, spec, claim = prepare(args)
    try:
        from hamid.node import layout
        from hamid.shimlimits import decode

        edits = spec["devices"][0]["containerEdits"]
        limits_host = next(m["hostPath"] for m in edits["mounts"] if m["containerPath"] == layout.LIMITS_IN_CONTAINER)
        lim = decode(Path(limits_host).read_bytes())
        result = {"claim": claim, "limits": {"devices": [{"uuid": x.uuid, "memory_bytes": x.memory_bytes,
                                                          "sm_percent": x.sm_percent} for x in lim.devices],
                                             "priority": lim.priority, "sm_policy": lim.sm_policy}}
        if args.dry:
            result["edits"] = edits
        else:
            run_spec = Path(args.state, "bench-run.json")
            run_spec.write_text(json.dumps({"edits": edits, "seconds": args.seconds, "gpu": args.gpu,
                                            "memory_mib": lim.devices[0].memory_bytes >> 20}))
            p = subprocess.run(["unshare", "--mount", "--propagation", "private", sys.executable, __file__,
                                "--inside", str(run_spec)], capture_output=True, text=True,
                               timeout=900 + 2 * args.seconds)
            result.update(_last_json(p.stdout, p.stderr))
            env = {k: v for k, v in os.environ.items() if not k.startswith(("CUDA_DEVICE_", "HAMID_", "LD_PRELOAD"))}
            env["CUDA_VISIBLE_DEVICES"] = str(args.gpu)
            p = subprocess.run([*TORCH, "matmul", str(args.seconds)], env=env, capture_output=True, text=True,
                               timeout=300 + args.seconds)
            result["unlimited"] = _last_json(p.stdout, p.stderr)
            try:
                result["ratio"] = result["limited"]["tflops"] / result["unlimited"]["tflops"]
            except (KeyError, TypeError, ZeroDivisionError):
                result["ratio"] = None
    finally:
        d.core.release("claim:bench-claim-0001")
        d.close()
    line = json.dumps(result)
    print(line)
    if args.out:
        Path(args.out).write_text(line + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
