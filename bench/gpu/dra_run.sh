#!/usr/bin/env bash
# bench/gpu/dra_run.sh: a DRA claim's limits on a real GPU (issue 41), as limits_run.sh runs the
# device plugin's: builds libvgpu.so (make -C shim), then bench/gpu/dra_claim_pair.py with the given
# arguments (e.g. --memory 4Gi --cores 30 --seconds 10). OUT: where the JSON line goes.
set -euo pipefail
cd "$(dirname "$0")/../.."
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/drabench-out}
mkdir -p "$OUT"
make -s -C shim
# WHEELS: a folder of wheels of the daemon's Python deps for a GPU machine that reaches no index
if [ -n "${WHEELS:-}" ]; then
    python3 -m pip install -q --no-index --no-deps --target /tmp/drabench-site "$WHEELS"/*.whl
    export PYTHONPATH=/tmp/drabench-site${PYTHONPATH:+:$PYTHONPATH}
fi
exec python3 bench/gpu/dra_claim_pair.py --out "$OUT/dra-claim-pair.json" "$@"
