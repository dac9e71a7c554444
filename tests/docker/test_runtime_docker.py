"""hamid-runtime under a real Docker engine and runc, on simulated GPUs.

The node: GPU 0 is an H100 in MIG mode, GPU 1 a T4 shared through the shim
(see tests/dockerharness.py for how dockerd and the daemon are started).
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import dockerharness as dh  # noqa: E402

pytestmark = [pytest.mark.docker, pytest.mark.slow]


@pytest.fixture(scope="module")
def env():
    if os.geteuid() != 0:
        pytest.skip("needs root to run dockerd (CI runs as root)")
    missing = dh.missing_tools()
    if missing:
        pytest.skip(f"missing {', '.join(missing)} (make test installs docker.io, runc, busybox-static)")
    e = dh.new_env()
    yield e
    e.stop()


def gpu_uuid(env, index):
    from hamid.devices.simulated import gpu_uuid as uuid_of

    return uuid_of("docker-node", index)


def test_container_sees_its_limits_its_shim_and_only_its_gpu(env):
    r = env.docker("run", "--rm", "--runtime=hami", "-e", "HAMI_VISIBLE_DEVICES=1",
                   "-e", "HAMI_VGPU_SPEC=mem=4g,cores=30", dh.IMAGE, "sh", "-c",
                   "env; echo DEVS $(ls /dev); echo PRELOAD $(cat /etc/ld.so.preload); "
                   "test -s /usr/local/vgpu/libvgpu.so && echo SHIM ok; test -d /run/hamid && echo REGION ok")
    assert r.returncode == 0, r.stderr
    out = r.stdout
    assert "CUDA_DEVICE_MEMORY_LIMIT_0=4096m" in out
    assert "CUDA_DEVICE_SM_LIMIT=30" in out
    assert f"NVIDIA_VISIBLE_DEVICES={gpu_uuid(env, 1)}" in out
    assert "CUDA_DEVICE_MEMORY_SHARED_CACHE=/run/hamid/vgpu.cache" in out
    devs = next(line for line in out.splitlines() if line.startswith("DEVS")).split()
    assert "nvidia1" in devs and "nvidiactl" in devs and "nvidia0" not in devs
    assert "PRELOAD /usr/local/vgpu/libvgpu.so" in out and "SHIM ok" in out and "REGION ok" in out
    env.wait_for(lambda: env.reservations() == [], what="release after --rm")


def test_compute_limited_containers_on_one_gpu_get_their_shares_and_no_time_slots(env):
    """Time slots are not work-conserving (issue 22, measured: a launch-bound tenant kept 3 % of its 30 %):
    each container gets its share as a rate limit, and no slots."""
    a = env.docker("run", "-d", "--runtime=hami", "-e", "HAMI_VISIBLE_DEVICES=1", "-e",
                   "HAMI_VGPU_SPEC=mem=1g,cores=30", dh.IMAGE, "sh", "-c", "env; sleep 60")
    assert a.returncode == 0, a.stderr
    cid = a.stdout.strip()
    try:
        b = env.docker("run", "--rm", "--runtime=hami", "-e", "HAMI_VISIBLE_DEVICES=1", "-e",
                       "HAMI_VGPU_SPEC=mem=1g,cores=70", dh.IMAGE, "env")
        assert b.returncode == 0, b.stderr
        env.wait_for(lambda: "CUDA_DEVICE_SM_LIMIT_0" in env.docker("logs", cid).stdout, what="first container's env")
        first = env.docker("logs", cid).stdout
        assert "CUDA_DEVICE_SM_LIMIT_0=30" in first and "HAMID_SM_SLOTS" not in first
        assert "CUDA_DEVICE_SM_LIMIT_0=70" in b.stdout and "HAMID_SM_SLOTS" not in b.stdout
    finally:
        env.docker("rm", "-f", cid)
    env.wait_for(lambda: env.reservations() == [], what="release")


def test_a_container_asking_for_nothing_passes_through(env):
    r = env.docker("run", "--rm", "--runtime=hami", dh.IMAGE, "sh", "-c", "env; ls /dev")
    assert r.returncode == 0, r.stderr
    assert "CUDA_DEVICE" not in r.stdout and "nvidia" not in r.stdout


def test_second_container_that_does_not_fit_is_refused(env):
    a = env.docker("run", "-d", "--runtime=hami", "-e", "HAMI_VISIBLE_DEVICES=1", "-e", "HAMI_VGPU_SPEC=mem=12g",
                   dh.IMAGE, "sleep", "60")
    assert a.returncode == 0, a.stderr
    cid = a.stdout.strip()
    try:
        assert [r["owner"] for r in env.reservations()] == [f"docker:{cid}"]
        b = env.docker("run", "--rm", "--runtime=hami", "-e", "HAMI_VISIBLE_DEVICES=1", "-e",
                       "HAMI_VGPU_SPEC=mem=4g", dh.IMAGE, "true")
        assert b.returncode != 0
        assert "GPU 1 has 3072 MiB free, 4096 requested" in b.stderr
        assert len(env.reservations()) == 1  # the refused one left nothing behind
    finally:
        env.docker("rm", "-f", cid)
    env.wait_for(lambda: env.reservations() == [], what="release after docker rm -f")
    assert not (env.state / "containers" / cid).exists()


def test_a_container_that_exits_on_its_own_is_released(env):
    a = env.docker("run", "-d", "--runtime=hami", "-e", "HAMI_VGPU_SPEC=mem=1g,cores=10", dh.IMAGE, "sleep", "1")
    assert a.returncode == 0, a.stderr
    cid = a.stdout.strip()
    env.wait_for(lambda: env.docker("inspect", "-f", "{{.State.Running}}", cid).stdout.strip() == "false",
                 what="container exit")
    env.wait_for(lambda: env.reservations() == [], what="release after exit")
    env.docker("rm", "-f", cid)


@pytest.mark.parametrize("spec,devices,needles", [
    ("mem=4x", None, ["'mem=4x'", "512m, 4g"]),
    ("memory=1g", None, ["unknown key 'memory'", "cores="]),
    ("mem=1g", "9", ["no GPU with index 9"]),
    ("1g.10gb", "1", ["GPU 1 (Tesla T4) has no MIG", "instead of a MIG profile"]),
    ("5g.50gb", "0", ["has no MIG profile 5g.50gb", "1g.10gb"]),
])
def test_bad_requests_fail_docker_run_with_the_reason(env, spec, devices, needles):
    args = ["run", "--rm", "--runtime=hami", "-e", f"HAMI_VGPU_SPEC={spec}"]
    if devices is not None:
        args += ["-e", f"HAMI_VISIBLE_DEVICES={devices}"]
    r = env.docker(*args, dh.IMAGE, "true")
    assert r.returncode != 0
    for n in needles:
        assert n in r.stderr, r.stderr
    assert env.reservations() == []


def test_mig_instance_is_created_for_the_container_and_destroyed_after(env):
    a = env.docker("run", "-d", "--runtime=hami", "-e", "HAMI_VISIBLE_DEVICES=0", "-e", "HAMI_VGPU_SPEC=1g.10gb",
                   dh.IMAGE, "sh", "-c", "env; ls /dev /dev/nvidia-caps; sleep 60")
    assert a.returncode == 0, a.stderr
    cid = a.stdout.strip()
    try:
        inst = env.wait_for(lambda: env.mig_instances().get(gpu_uuid(env, 0)), what="MIG instance")
        assert [i["profile"] for i in inst] == ["1g.10gb"] and inst[0]["start"] == 6
        logs = env.wait_for(lambda: env.docker("logs", cid).stdout if "nvidia-cap" in env.docker("logs", cid).stdout
                            else None, what="container output")
        assert f"NVIDIA_VISIBLE_DEVICES={inst[0]['uuid']}" in logs
        gi = inst[0]["gi"]
        assert f"nvidia-cap{100 + gi * 10}" in logs and f"nvidia-cap{100 + gi * 10 + 1}" in logs
        assert "CUDA_DEVICE_MEMORY_LIMIT" not in logs  # MIG isolates in hardware; no shim limits
        res = env.reservations()
        assert res[0]["mig"][gpu_uuid(env, 0)]["uuid"] == inst[0]["uuid"]
    finally:
        env.docker("rm", "-f", cid)
    env.wait_for(lambda: env.reservations() == [] and not env.mig_instances(), what="MIG teardown")


@pytest.mark.parametrize("image,link", [(dh.IMAGE_PRELOAD_LINK, "/etc/ld.so.preload"), (dh.IMAGE_USR_LINK, "/usr")])
def test_links_out_of_the_rootfs_are_not_written_through(env, image, link):
    watched = [Path("/etc/ld.so.preload"), Path("/usr/local/vgpu")]
    before = [p.exists() and (p.read_bytes() if p.is_file() else "dir") for p in watched]
    # GPU 1: a shim share, which mounts over those paths (a MIG share mounts nothing)
    r = env.docker("run", "--rm", "--runtime=hami", "-e", "HAMI_VISIBLE_DEVICES=1", "-e", "HAMI_VGPU_SPEC=mem=1g",
                   image, "true")
    assert r.returncode != 0
    assert f"the container's {link} is a symbolic link" in r.stderr, r.stderr
    after = [p.exists() and (p.read_bytes() if p.is_file() else "dir") for p in watched]
    assert after == before
    assert env.reservations() == []  # rolled back


def test_daemon_killed_and_restarted_midway_ends_with_the_truth(env):
    from hamid.devices.simulated import SimulatedBackend, parse_simulate_spec
    from hamid.devices.types import MigPlacement
    from hamid.ledger import Details, Ledger
    from hamid.request import parse_docker_env

    m = env.docker("run", "-d", "--runtime=hami", "-e", "HAMI_VISIBLE_DEVICES=0", "-e", "HAMI_VGPU_SPEC=2g.20gb",
                   dh.IMAGE, "sleep", "60")
    assert m.returncode == 0, m.stderr
    env.kill_hamid()
    try:
        # With no daemon, the poststop marker waits; the next create drains it itself.
        assert env.docker("rm", "-f", m.stdout.strip()).returncode == 0
        v = env.docker("run", "-d", "--runtime=hami", "-e", "HAMI_VISIBLE_DEVICES=1", "-e", "HAMI_VGPU_SPEC=mem=2g",
                       dh.IMAGE, "sleep", "60")
        assert v.returncode == 0, v.stderr  # reserved through the ledger directly
        assert [r["owner"] for r in env.reservations()] == [f"docker:{v.stdout.strip()}"]
        assert not env.mig_instances(), "the drained release destroyed the MIG instance"
        # A crash between creating a MIG instance and recording it, for a container that never started.
        led = Ledger(env.state / "ledger.db")
        ghost = parse_docker_env({"HAMI_VISIBLE_DEVICES": "0", "HAMI_VGPU_SPEC": "3g.40gb"}, "f" * 64)
        res = led.reserve(ghost, kind="docker", details=Details(container_id="f" * 64, runc_root=str(env.runc_root)))
        led.close()
        pl = res.decision.containers[0].devices[0].mig_placement
        SimulatedBackend(parse_simulate_spec(env.simulate), "docker-node", mig_enabled=True,
                         state_file=env.state / "simulated-mig.json").create_mig_instance(
            gpu_uuid(env, 0), "3g.40gb", MigPlacement(pl.start, pl.size))
        assert env.docker("rm", "-f", v.stdout.strip()).returncode == 0
        time.sleep(2.5)  # past dockerStartGrace
    finally:
        env.start_hamid()
    env.wait_for(lambda: env.reservations() == [] and not env.mig_instances(), what="reconcile after restart")


@pytest.fixture(scope="module")
def cuda_image(env, tmp_path_factory):
    """An image with the suite's stand-in driver (a fake libcuda/libnvidia-ml, NOT NVIDIA's), the shim's
    test program and the glibc they need, so the shim the runtime mounts can run inside a container."""
    import shutil
    import subprocess

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "shim"))
    from shimharness import build_all

    built = build_all(tmp_path_factory)
    rootfs = tmp_path_factory.mktemp("cudaimg") / "rootfs"
    for d in ("bin", "tmp", "proc", "sys", "dev", "etc", "lib/x86_64-linux-gnu"):
        (rootfs / d).mkdir(parents=True, exist_ok=True)
    shutil.copy2(shutil.which("busybox"), rootfs / "bin" / "busybox")
    for a in ("sh", "sleep", "cat", "touch"):
        os.symlink("busybox", rootfs / "bin" / a)
    shutil.copy2(built.shimtest, rootfs / "shimtest")
    for lib in ("libcuda.so.1", "libnvidia-ml.so.1"):
        shutil.copy2(built.libdir / lib, rootfs / "lib" / "x86_64-linux-gnu" / lib)
    needed = set()
    for binary in (built.shimtest, built.shim):
        out = subprocess.run(["ldd", str(binary)], capture_output=True, text=True, check=True).stdout
        for line in out.splitlines():
            path = line.split("=>")[-1].split("(")[0].strip()
            if path.startswith("/") and "libcuda" not in path and "libnvidia-ml" not in path:
                needed.add(path)
    for path in needed:
        dest = rootfs / path.lstrip("/")
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(os.path.realpath(path), dest)
    env._import(rootfs, "hamid-test:cuda")
    return "hamid-test:cuda"


def test_docker_exec_processes_get_the_containers_limits_from_its_limits_file(env, cuda_image):
    """``docker exec`` processes carry none of the CUDA_DEVICE_* variables the runtime put in the spec
    (Docker keeps its own copy of the environment), and may set their own: the limits file decides."""
    from hamid.shimregion.reader import read_region

    a = env.docker("run", "-d", "--runtime=hami", "-e", "HAMI_VISIBLE_DEVICES=1", "-e", "HAMI_VGPU_SPEC=mem=1g",
                   cuda_image, "sleep", "120")
    assert a.returncode == 0, a.stderr
    cid = a.stdout.strip()
    try:
        env_in_exec = env.docker("exec", cid, "sh", "-c", "env").stdout
        assert "CUDA_DEVICE_MEMORY_LIMIT" not in env_in_exec  # what made exec'd processes unlimited before

        def shimtest(*cmds, extra=()):
            return env.docker("exec", *extra, cid, "/shimtest", "direct", *cmds)

        r = shimtest("init", "alloc:mem:700m", "alloc:mem:600m")
        assert r.returncode == 0, r.stderr
        assert r.stdout.split("\n")[1:3] == ["alloc mem 700m 0", "alloc mem 600m 2"], r.stdout + r.stderr
        # lifting the limit from the environment changes nothing while the file is there
        lifted = shimtest("init", "alloc:mem:1500m", extra=("-e", "CUDA_DEVICE_MEMORY_LIMIT_0=64g",
                                                            "-e", "CUDA_DEVICE_MEMORY_LIMIT=64g",
                                                            "-e", "CUDA_DEVICE_MEMORY_SHARED_CACHE=/tmp/mine"))
        assert "alloc mem 1500m 2" in lifted.stdout, lifted.stdout + lifted.stderr
        # a holder's usage lands in the container's region on the host, which the daemon reads
        holder = subprocess_popen(["docker", "-H", f"unix://{env.sock}", "exec", cid, "/shimtest", "direct",
                                   "init", "alloc:mem:512m", "waitfile:/tmp/go"])
        try:
            region = env.state / "containers" / cid / "vgpu.cache"

            def used():
                if not region.exists():
                    return None
                snap = read_region(region)
                dev = snap.device(0)
                return dev if dev and dev.used_bytes >= 512 << 20 else None

            dev = env.wait_for(used, what="the exec'd process's usage in the container's region")
            assert dev.limit_bytes == 1 << 30
            second = shimtest("init", "alloc:mem:600m")  # 512m held by a sibling: 600m more does not fit
            assert "alloc mem 600m 2" in second.stdout, second.stdout + second.stderr
        finally:
            env.docker("exec", cid, "touch", "/tmp/go")
            holder.wait(timeout=30)
    finally:
        env.docker("rm", "-f", cid)


def subprocess_popen(args):
    import subprocess

    return subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def hamid_cli(env, *args):
    import subprocess

    return subprocess.run([str(dh.BIN / "hamid"), *args, "--state-dir", str(env.state)], capture_output=True,
                          text=True, timeout=60)


def test_named_container_shows_by_name_runs_and_can_be_inspected(env):
    import json

    a = env.docker("run", "-d", "--name", "trainer-1", "--runtime=hami", "-e", "HAMI_VISIBLE_DEVICES=1",
                   "-e", "HAMI_VGPU_SPEC=mem=2g,cores=20", dh.IMAGE, "sleep", "60")
    assert a.returncode == 0, a.stderr
    cid = a.stdout.strip()
    try:
        def running():
            rows = [r for r in json.loads(hamid_cli(env, "status", "-o", "json").stdout)["reservations"]
                    if r["owner"] == f"docker:{cid}"]
            return rows[0] if rows and rows[0]["state"] == "running" else None

        row = env.wait_for(running, timeout=10, what="state running while it runs")
        assert row["name"] == "trainer-1"
        table = hamid_cli(env, "status").stdout
        line = next(ln for ln in table.splitlines() if ln.startswith("trainer-1"))
        assert f"docker:{cid[:12]}" in line and "running" in line and "2048 MiB, 20% cores" in line
        for target in ("trainer-1", cid[:8], f"docker:{cid}"):
            r = hamid_cli(env, "inspect", target, "-o", "json")
            assert r.returncode == 0, r.stderr
            doc = json.loads(r.stdout)
            assert doc["owner"] == f"docker:{cid}" and doc["state"] == "running"
        (c,) = doc["containers"]
        (lim,) = c["limits_file"]["devices"]
        assert lim["memory_bytes"] == 2 << 30 and lim["sm_percent"] == 20
        assert c["limits_file"]["sm_policy"] == "default"  # the node's gpuCorePolicy, as the shim reads it
        assert (c["devices"][0]["mem_mib"], c["devices"][0]["cores"]) == (2048, 20)
        assert "no CUDA process" in c["region"]["error"]
        text = hamid_cli(env, "inspect", "trainer-1").stdout
        assert "memory 2048 MiB, compute 20%" in text and "state: running" in text
        miss = hamid_cli(env, "inspect", "no-such-thing")
        assert miss.returncode == 1 and "no reservation matches 'no-such-thing'" in miss.stderr
    finally:
        env.docker("rm", "-f", cid)
    env.wait_for(lambda: env.reservations() == [], what="release after docker rm -f")


def test_every_refusal_is_logged_by_the_daemon_with_its_reason(env):
    import json

    r = env.docker("run", "--rm", "--runtime=hami", "-e", "HAMI_VISIBLE_DEVICES=1", "-e", "HAMI_VGPU_SPEC=mem=100g",
                   dh.IMAGE, "true")
    assert r.returncode != 0
    r = env.docker("run", "--rm", "--runtime=hami", "-e", "HAMI_VGPU_SPEC=mem=4x", dh.IMAGE, "true")
    assert r.returncode != 0

    def refusals():
        out = []
        for line in (env.root / "hamid.log").read_text().splitlines():
            try:
                rec = json.loads(line)
            except ValueError:
                continue
            if rec.get("event") == "container refused":
                out.append(rec["reason"])
        return out

    got = env.wait_for(lambda: len(refusals()) >= 2 and refusals(), timeout=5, what="two refusals logged")
    assert any("no room for this container" in x and "102400 requested" in x for x in got), got
    assert any("'mem=4x'" in x for x in got), got


def test_cores_without_memory_refused_says_it_wanted_the_whole_card(env):
    a = env.docker("run", "-d", "--runtime=hami", "-e", "HAMI_VISIBLE_DEVICES=1", "-e", "HAMI_VGPU_SPEC=mem=1g",
                   dh.IMAGE, "sleep", "60")
    assert a.returncode == 0, a.stderr
    try:
        b = env.docker("run", "--rm", "--runtime=hami", "-e", "HAMI_VISIBLE_DEVICES=1", "-e", "HAMI_VGPU_SPEC=cores=30",
                       dh.IMAGE, "true")
        assert b.returncode != 0
        assert "15360 requested" in b.stderr and "asks no memory" in b.stderr and "add mem=" in b.stderr, b.stderr
    finally:
        env.docker("rm", "-f", a.stdout.strip())
    env.wait_for(lambda: env.reservations() == [], what="release after docker rm -f")
