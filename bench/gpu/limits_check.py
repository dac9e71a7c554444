"""The limits-file check of the shim's H100 benchmark: a container's limits
file, mounted as the daemon mounts it, holds processes that set no limit
variables, or higher ones, on the real driver.

Run as root inside a private mount namespace, so nothing outside it changes:

    unshare --mount --propagation private python3 limits_check.py SPEC_JSON

SPEC_JSON names the limits file (written by hamid.shimlimits.write_limits_file,
root-owned, 0644), a world-writable copy of it, the shim, the region file the
limits file names, and the helpers (torch_work.py, cbench, regiondump). This
script puts a tmpfs on /usr/local/vgpu (its mount point file must not exist
outside), binds the limits file read-only at /usr/local/vgpu/hamid.limits,
then starts, with only LD_PRELOAD set:

  holder   PyTorch holding 1 GiB of tensors (about 1.8 GiB with its context), waiting;
  unset    PyTorch, no CUDA_DEVICE_* / HAMID_* variables: 1 GiB, then 3 GiB;
  higher   PyTorch with CUDA_DEVICE_MEMORY_LIMIT(_0)=70g and a region of its own named: the same;
  (holder ends)
  alone    PyTorch, no variables, alone: 3 GiB, then 5 GiB;
  refused  a world-writable copy bound over the file: cbench must get no CUDA.

Prints one JSON line. Owns nothing but this scenario; shim_bench.py judges it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

LIMITS = "/usr/local/vgpu/hamid.limits"


def sh(*cmd: str) -> None:
    subprocess.run(cmd, check=True)


def env(shim: str, **kv) -> dict:
    drop = ("CUDA_DEVICE_", "HAMID_", "LD_PRELOAD", "GPU_CORE_UTILIZATION_POLICY", "CUDA_TASK_PRIORITY")
    e = {k: v for k, v in os.environ.items() if not k.startswith(drop)}
    e["PYTHONUNBUFFERED"] = "1"
    e["LD_PRELOAD"] = shim
    e.update({k: str(v) for k, v in kv.items()})
    return e


def last_json(out: str) -> dict:
    for ln in reversed(out.splitlines()):
        if ln.startswith("{"):
            return json.loads(ln)
    raise RuntimeError(f"no JSON in {out[-1500:]}")


def torch_run(spec: dict, args: list[str], e: dict) -> dict:
    p = subprocess.run([*spec["torch"], *args], env=e, capture_output=True, text=True, timeout=180)
    if p.returncode != 0:
        raise RuntimeError(f"{args} rc={p.returncode}: {p.stderr[-2000:]}")
    res = last_json(p.stdout)
    res["shim_stderr"] = [ln for ln in p.stderr.splitlines() if "hamid-shim" in ln][:5]
    return res


def main() -> int:
    spec = json.loads(sys.argv[1])
    shim = spec["shim"]
    # The mount point: a tmpfs here, so the file it needs exists in this namespace only.
    sh("mount", "-t", "tmpfs", "-o", "mode=0755,size=1m", "hamid-vgpu", "/usr/local/vgpu")
    open(LIMITS, "w").close()
    sh("mount", "--bind", spec["file"], LIMITS)
    sh("mount", "-o", "remount,ro,bind", LIMITS)
    st = os.stat(LIMITS)
    res: dict = {"mounted": {"uid": st.st_uid, "mode": oct(st.st_mode & 0o7777), "size": st.st_size,
                             "read_only": subprocess.run(["findmnt", "-no", "OPTIONS", LIMITS], capture_output=True,
                                                         text=True).stdout.strip()}}
    holder = subprocess.Popen([*spec["torch"], "hold", "1024"], env=env(shim), stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        ln = holder.stdout.readline()
        if not ln.startswith("ready"):
            holder.kill()
            raise RuntimeError(f"holder not ready: {ln!r} {holder.stderr.read()[-2000:]}")
        res["unset"] = torch_run(spec, ["tryalloc", "1024", "3072"], env(shim))
        res["higher"] = torch_run(spec, ["tryalloc", "1024", "3072"],
                                  env(shim, CUDA_DEVICE_MEMORY_LIMIT="70g", CUDA_DEVICE_MEMORY_LIMIT_0="70g",
                                      CUDA_DEVICE_MEMORY_SHARED_CACHE=spec["other_region"], HAMID_NVML_RECONCILE=0))
        d = subprocess.run([spec["regiondump"], spec["region"]], capture_output=True, text=True, check=True).stdout
        res["region_while_held"] = json.loads(d)
        res["holder_pid"] = int(ln.split()[1])
        res["other_region_exists"] = os.path.lexists(spec["other_region"])
    finally:
        holder.communicate("x\n", timeout=60)
    res["alone"] = torch_run(spec, ["tryalloc", "3072", "5120"], env(shim))
    # Fail closed: a file that group or others may write refuses CUDA.
    sh("mount", "--bind", spec["writable_copy"], LIMITS)
    p = subprocess.run([spec["cbench"], "ctx_cycle", "1", "64"], env=env(shim), capture_output=True, text=True,
                       timeout=120)
    res["refused"] = {"rc": p.returncode, "stdout": p.stdout[-300:],
                      "stderr": [ln for ln in p.stderr.splitlines() if "hamid-shim" in ln][:3]}
    print(json.dumps(res), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
