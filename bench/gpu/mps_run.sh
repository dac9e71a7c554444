#!/usr/bin/env bash
# bench/gpu/mps_run.sh: the MPS bench on a GPU host, as root: bench/gpu/mps_bench.py, or the
# script $BENCH names (bench/gpu/mps_partition_bench.py: round 2, partitions and faults).
# Builds the shim, installs the wheels in $WHEELS (cffi, pycparser, structlog: hamid's
# modules need them and the GPU image lacks them) into a private target, runs the
# bench, and whatever happens stops every MPS control daemon the bench started
# (echo quit | nvidia-cuda-mps-control with its own pipe directory). It never changes
# the GPU's compute mode or any other setting. Results: $OUT/mps-results.json.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/mps-out}
mkdir -p "$OUT"
stop_daemons() {
    for p in /tmp/mpsb/mps/*/pipe; do
        if [ -S "$p/control" ]; then
            echo quit | CUDA_MPS_PIPE_DIRECTORY="$p" timeout 15 nvidia-cuda-mps-control || true
        fi
    done
}
trap stop_daemons EXIT
make -s -C shim || exit 1
if [ -n "${WHEELS:-}" ]; then
    python3 -m pip install -q --no-index --no-deps --target /tmp/mps-site "$WHEELS"/*.whl || exit 1
    export PYTHONPATH=/tmp/mps-site${PYTHONPATH:+:$PYTHONPATH}
fi
BENCH=${BENCH:-bench/gpu/mps_bench.py}
timeout "${BENCH_TIMEOUT:-400}" python3 "$BENCH" --out "$OUT" "$@" 2>&1 | tee "$OUT/$(basename "$BENCH" .py).log" \
    | grep -v '\[debug'
exit "${PIPESTATUS[0]}"
