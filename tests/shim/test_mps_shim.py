"""An MPS share's limits reach the driver from the limits file, never from the workload (issue 27).

Owns the proof that, with a limits file marked MPS (HAMID_LIMITS_FLAG_MPS), the shim hands the driver
(here the fake libcuda, which records the MPS variables it sees in cuInit, where the real driver reads
them to join the MPS server) the file's active thread percentage, pinned-memory limit and the mounted
pipe directory, whatever the process set itself or when it has no variables at all (``docker exec``);
that it refuses CUDA when no control daemon listens there (the driver would run the process outside
MPS, outside every partition); and that the shim's own memory limit holds under MPS.
"""

from __future__ import annotations

import os
import socket
import subprocess

import pytest

from hamid.shimlimits import ContainerLimits, DeviceLimits, write_limits_file

GiB = 1 << 30
UUID0 = "GPU-fa4e0000-0000-0000-0000-000000000000"  # the fake driver's device 0

root_only = pytest.mark.skipif(os.geteuid() != 0, reason="the shim trusts only a root-owned file (CI runs as root)")


@pytest.fixture
def mps_share(built, tmp_path):
    region = tmp_path / "container" / "region.cache"
    region.parent.mkdir(mode=0o700)
    write_limits_file(built.limits_path, ContainerLimits(
        devices=(DeviceLimits(UUID0, memory_bytes=GiB, sm_percent=30),), region_path=str(region), mps=True))
    sock = socket.socket(socket.AF_UNIX)
    path = built.mps_pipe / "control"
    if path.exists():
        path.unlink()
    sock.bind(str(path))  # a control daemon's socket, as the real one makes it in its pipe directory
    yield path
    sock.close()
    path.unlink(missing_ok=True)
    built.limits_path.unlink(missing_ok=True)


def run(built, shim, tmp_path, *cmds, **env):
    seen = tmp_path / "cuinit.env"
    e = {k: v for k, v in os.environ.items() if not k.startswith(("CUDA_", "HAMID_", "LIBCUDA_", "FAKE_", "GPU_"))}
    e.update(LD_LIBRARY_PATH=str(built.libdir), FAKE_GPU_STATE=str(shim.state), LD_PRELOAD=str(built.shim_limits),
             FAKE_CUINIT_ENV=str(seen), **env)
    p = subprocess.run([str(built.shimtest), "procaddr", "init", *cmds], env=e, capture_output=True, text=True,
                       timeout=30)
    got = dict(ln.split("=", 1) for ln in seen.read_text().splitlines()) if seen.exists() else {}
    return p, got


@root_only
@pytest.mark.parametrize("env", [{}, {"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "100",
                                      "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": "0=80G",
                                      "CUDA_MPS_PIPE_DIRECTORY": "/tmp/nvidia-mps"}],
                         ids=["docker-exec-no-variables", "lifted-by-the-workload"])
def test_the_driver_gets_the_files_share_whatever_the_process_sets(built, shim, tmp_path, mps_share, env):
    p, got = run(built, shim, tmp_path, **env)
    assert got == {"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "30", "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": "0=1024M",
                   "CUDA_MPS_PIPE_DIRECTORY": str(built.mps_pipe)}, (p.stdout, p.stderr)


@root_only
def test_the_shims_memory_limit_holds_under_mps(built, shim, tmp_path, mps_share):
    p, _ = run(built, shim, tmp_path, "alloc:mem:600m", "alloc:mem:600m")
    allocs = [ln.split()[3] for ln in p.stdout.splitlines() if ln.startswith("alloc ")]
    assert allocs == ["0", "2"], (p.stdout, p.stderr)  # the second 600 MiB is past 1 GiB: out of memory


@root_only
def test_no_control_daemon_refuses_cuda(built, shim, tmp_path, mps_share):
    mps_share.unlink()  # the daemon is gone (hamid restarts it)
    p, got = run(built, shim, tmp_path)
    assert got == {}  # the real cuInit never ran
    assert "no MPS control daemon listens at" in p.stderr and str(built.mps_pipe) in p.stderr
