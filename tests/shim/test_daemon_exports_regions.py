"""The daemon exports what the shim measures in a Docker container's region."""

from __future__ import annotations

import sys
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from shimharness import Shim, finish, wait_ready  # noqa: E402
from test_daemon import start, stop  # noqa: E402


def test_daemon_metrics_carry_the_containers_shim_usage(built, tmp_path, free_port):
    state = tmp_path / "state"
    daemon = start(state, free_port, "--simulate", "T4")
    try:
        region_dir = state / "containers" / "c0ffee"  # where hamid-runtime puts a container's region
        region_dir.mkdir(parents=True)
        proc = Shim(built, tmp_path).spawn("procaddr", "init", "alloc:mem:256m", "wait",
                                           CUDA_DEVICE_MEMORY_LIMIT="1g",
                                           CUDA_DEVICE_MEMORY_SHARED_CACHE=str(region_dir / "vgpu.cache"))
        wait_ready(proc)
        try:
            text = httpx.get(f"http://127.0.0.1:{free_port}/metrics").text
            line = next(ln for ln in text.splitlines() if ln.startswith("hami_vgpu_memory_limit_bytes{")
                        and 'pod="c0ffee"' in ln)
            assert 'namespace="docker"' in line and 'container="main"' in line
            assert float(line.split()[-1]) == 1 << 30
            used = next(ln for ln in text.splitlines() if ln.startswith("hami_vgpu_memory_used_bytes{")
                        and 'pod="c0ffee"' in ln)
            assert float(used.split()[-1]) >= 256 << 20
        finally:
            finish(proc)
    finally:
        stop(daemon)
