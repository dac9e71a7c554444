#!/usr/bin/env bash
# bench/gpu/runtime_h100.sh: hamid on a real H100, in one run (read-only on the GPU's settings).
#   1. hamid's NVML backend reads the GPU; compared with the simulated catalog.
#   2. `hamid run` starts on NVML (its first log line says so); `hamid status`.
#   3. hamid-runtime + runc (from a Debian .deb unpacked with dpkg -x): a container
#      under HAMI_VISIBLE_DEVICES=0 HAMI_VGPU_SPEC=mem=4g whose PyTorch must fail to
#      allocate 5 GiB and succeed with 3 GiB, with the shim mounted and preloaded.
# Needs: the repo, .dev/whl (wheels of the daemon's pure-Python deps), .dev/runc_*.deb.
set -uo pipefail
cd "$(dirname "$0")/../.."
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/runtime-h100}
mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .dev/whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD
mkdir -p /tmp/bin
for s in hamid hamid-runtime-py; do
  mod=$([ $s = hamid ] && echo hamid.cli.main || echo hamid.runtime.main)
  printf '#!/bin/sh\nexec python3 -c "import sys; from %s import main; sys.argv[0]=\\"%s\\"; sys.exit(main())" "$@"\n' "$mod" "/tmp/bin/$s" > /tmp/bin/$s
  chmod +x /tmp/bin/$s
done
cp contrib/docker/hamid-runtime /tmp/bin/hamid-runtime
export PATH=/tmp/bin:$PATH

echo "== 1. NVML inventory vs catalog"
python3 bench/gpu/nvml_inventory.py 2>&1 | tee "$OUT/nvml_inventory.txt"

echo "== 2. hamid run on NVML"
make -s -C shim || exit 1
STATE=/tmp/hamid-state
hamid run --state-dir $STATE --metrics-port 9394 --node-name h100 --log-format json > "$OUT/daemon.log" 2>&1 &
DPID=$!
for i in $(seq 1 100); do [ -S $STATE/hamid.sock ] && break; sleep 0.1; done
head -1 "$OUT/daemon.log"
hamid status --state-dir $STATE | tee "$OUT/status.txt"
curl -s localhost:9394/metrics | grep -E '^hami_gpu_memory_limit_bytes' | head -2

echo "== 3. runc container with mem=4g"
mkdir -p /tmp/runc && dpkg -x .dev/runc_*.deb /tmp/runc && RUNC=/tmp/runc/usr/sbin/runc
$RUNC --version | head -1
B=/tmp/bundle; rm -rf $B; mkdir -p $B/rootfs/{etc,tmp,proc,sys,dev,root,run}
for f in passwd group hosts ld.so.cache ld.so.conf; do [ -e /etc/$f ] && cp -L /etc/$f $B/rootfs/etc/; done
[ -d /etc/ld.so.conf.d ] && cp -rL /etc/ld.so.conf.d $B/rootfs/etc/
PY=$(command -v python3)
cat > $B/alloc.py <<'PYEOF'
import torch
free, total = torch.cuda.mem_get_info()
print(f"mem_get_info: total {total / 2**30:.2f} GiB, free {free / 2**30:.2f} GiB")
def alloc(gib):
    try:
        x = torch.empty(int(gib * 2**30), dtype=torch.uint8, device="cuda")
        torch.cuda.synchronize()
        del x
        torch.cuda.empty_cache()
        return "ok"
    except torch.OutOfMemoryError as e:
        return "refused (OutOfMemoryError)"
print("alloc 5 GiB:", alloc(5))
print("alloc 3 GiB:", alloc(3))
PYEOF
python3 - "$B" "$PY" <<'PYEOF'
import json, os, subprocess, sys
b, py = sys.argv[1], sys.argv[2]
subprocess.run(["/tmp/runc/usr/sbin/runc", "spec"], cwd=b, check=True)
spec = json.load(open(f"{b}/config.json"))
spec["root"] = {"path": "rootfs", "readonly": False}
spec["process"]["terminal"] = False
spec["process"]["args"] = [py, "/bundle/alloc.py"]
keep = [e for e in spec["process"]["env"] if not e.startswith("PATH=")]
spec["process"]["env"] = keep + ["PATH=" + os.environ["PATH"], "HAMI_VISIBLE_DEVICES=0", "HAMI_VGPU_SPEC=mem=4g",
    "LD_LIBRARY_PATH=" + os.environ.get("LD_LIBRARY_PATH", ""), "HOME=/root"]
def bind(d):
    if os.path.islink(d):
        os.makedirs(os.path.dirname(f"{b}/rootfs{d}"), exist_ok=True)
        os.symlink(os.readlink(d), f"{b}/rootfs{d}")
    elif os.path.isdir(d):
        spec["mounts"].append({"destination": d, "type": "bind", "source": d, "options": ["rbind", "ro"]})
# The host's programs and PyTorch, read-only; /usr/local entry by entry so that
# /usr/local/vgpu (where the runtime mounts the shim) is the rootfs's own.
for d in ("/lib", "/lib64", "/bin", "/sbin", "/opt"):
    bind(d)
for e in sorted(os.listdir("/usr")):
    if e != "local":
        bind(f"/usr/{e}")
for e in sorted(os.listdir("/usr/local")):
    if e != "vgpu":
        bind(f"/usr/local/{e}")
os.makedirs(f"{b}/rootfs/usr/local/vgpu", exist_ok=True)
spec["mounts"].append({"destination": "/bundle", "type": "bind", "source": b, "options": ["rbind", "ro"]})
spec["linux"]["namespaces"] = [n for n in spec["linux"]["namespaces"] if n["type"] != "network"]
json.dump(spec, open(f"{b}/config.json", "w"))
PYEOF
echo "-- with hamid (mem=4g):"
hamid-runtime --state-dir $STATE --runc $RUNC --root /tmp/runc-root run --bundle $B h100-vgpu 2>&1 | tee "$OUT/container_hamid.txt"
echo "-- env the runtime gave it:"
python3 -c "import json; print([e for e in json.load(open('$B/config.json'))['process']['env'] if 'CUDA' in e or 'NVIDIA' in e])"
echo "-- ledger right after:"
sleep 0.6; hamid status --state-dir $STATE -o json | python3 -c "import json,sys; d=json.load(sys.stdin); print('reservations:', len(d['reservations']))"
kill $DPID; wait $DPID 2>/dev/null
echo "== done"
