#!/usr/bin/env bash
# bench/gpu/limits_run.sh: the compute-limit acceptance bench (issue 22) on a
# real GPU. Builds libvgpu.so (make -C shim), the CUDA helper that
# shim_bench.py's launch-cost and alloc-rate rows use (nvcc), then runs
# bench/gpu/limits_bench.py with the given arguments. OUT: where results go.
set -euo pipefail
cd "$(dirname "$0")/../.."
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/limbench-out}
mkdir -p "$OUT"
WORK=$(mktemp -d /tmp/limbench.XXXXXX)
make -s -C shim
# WHEELS: a folder of wheels of the daemon's Python deps (cffi, structlog, nvidia-ml-py...) for a GPU machine
# that has torch but not those and reaches no index (the device tool's machines)
if [ -n "${WHEELS:-}" ]; then
    python3 -m pip install -q --no-index --no-deps --target /tmp/limbench-site "$WHEELS"/*.whl
    export PYTHONPATH=/tmp/limbench-site${PYTHONPATH:+:$PYTHONPATH}
fi
CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
nvcc -O2 -arch=sm_90 -o "$WORK/cbench" bench/gpu/cbench.cu -L"$CUDA_HOME/lib64/stubs" -L"$CUDA_HOME/lib64" -lcuda
gcc -O2 -Ishim/include -o "$WORK/regiondump" bench/gpu/regiondump.c
exec python3 bench/gpu/limits_bench.py --work "$WORK" --out "$OUT" "$@"
