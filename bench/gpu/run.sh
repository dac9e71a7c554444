#!/usr/bin/env bash
# bench/gpu/run.sh: the shim's benchmark on a real GPU (an H100), in one run.
# Builds libvgpu.so there (make -C shim), the CUDA helper (nvcc) and the region
# dumper (gcc), then runs bench/gpu/shim_bench.py, which measures PyTorch and
# CUDA programs with and without the shim and prints the table beside
# HAMi-core's published H100 figures. Results also go to
# $OUT (results.json, table.md, rewritten after every step) when OUT is set.
# Runs as root: its last step binds a limits file in a private mount namespace
# (limits_check.py) and imports hamid.shimlimits, which needs cffi and
# structlog (not in the GPU machine's image: install them first, e.g.
# pip install --target /tmp/site <wheels>; PYTHONPATH=/tmp/site).
set -euo pipefail
cd "$(dirname "$0")/../.."
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/shimbench-out}
mkdir -p "$OUT"
WORK=$(mktemp -d /tmp/shimbench.XXXXXX)
make -s -C shim
CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
nvcc -O2 -arch=sm_90 -o "$WORK/cbench" bench/gpu/cbench.cu -L"$CUDA_HOME/lib64/stubs" -L"$CUDA_HOME/lib64" -lcuda
gcc -O2 -Ishim/include -o "$WORK/regiondump" bench/gpu/regiondump.c
exec python3 bench/gpu/shim_bench.py --work "$WORK" --out "$OUT" "$@"
