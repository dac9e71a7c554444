"""hamid-runtime without Docker: its command line, its launcher, runc directly."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from hamid.runtime.argv import parse
from hamid.node.released import mark, pending
from hamid.node.identity import Owner
from hamid.request import parse_docker_env
from nodeharness import make_node

BIN = Path(sys.executable).parent
LAUNCHER = BIN / "hamid-runtime"
ADMIT = BIN / "hamid-runtime-admit"


def test_argv_our_options_first_then_runc():
    inv = parse(["--state-dir", "/s", "--runc=/x/runc", "--root", "/r", "--log", "/l.json", "--log-format", "json",
                 "--systemd-cgroup", "create", "--bundle", "/b", "--pid-file", "/p", "cid1"])
    assert (inv.state_dir, inv.runc, inv.root, inv.log_file, inv.log_format) == ("/s", "/x/runc", "/r", "/l.json", "json")
    assert inv.verb == "create" and inv.bundle_and_id() == ("/b", "cid1")
    assert inv.runc_args[0] == "--root"
    inv = parse(["--", "--root", "/r", "delete", "--force", "cid2"])
    assert inv.state_dir == "/var/lib/hamid" and inv.verb == "delete"


@pytest.fixture
def fake_runc(tmp_path):
    p = tmp_path / "runc"
    p.write_text(f"#!/bin/sh\nprintf '%s\\n' \"$@\" > {tmp_path}/runc.args\n")
    p.chmod(0o755)
    return p


def test_launcher_passes_other_verbs_to_runc_without_our_options(tmp_path, fake_runc):
    r = subprocess.run([str(LAUNCHER), "--state-dir", str(tmp_path), "--runc", str(fake_runc),
                        "--root", "/r", "--log", "/l", "start", "cid"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "runc.args").read_text().split() == ["--root", "/r", "--log", "/l", "start", "cid"]


def test_launcher_poststop_drops_a_marker_and_refuses_bad_ids(tmp_path):
    ok = subprocess.run([str(LAUNCHER), "--state-dir", str(tmp_path), "hook", "poststop", "abc123"],
                        capture_output=True, text=True)
    assert ok.returncode == 0, ok.stderr
    assert pending(str(tmp_path)) == ["abc123"]
    assert oct((tmp_path / "released").stat().st_mode & 0o777) == "0o700"
    bad = subprocess.run([str(LAUNCHER), "--state-dir", str(tmp_path), "hook", "poststop", "../../etc"],
                         capture_output=True, text=True)
    assert bad.returncode == 1 and "bad container id" in bad.stderr
    assert not Path(tmp_path / "etc").exists()


def test_drain_releases_and_is_idempotent(tmp_path):
    d = make_node(tmp_path / "s")
    try:
        req = parse_docker_env(["HAMI_VGPU_SPEC=mem=1g"], "c1")
        got = d.core.admit(Owner("docker", "c1"), req)
        rdir = tmp_path / "s" / "containers" / "c1"
        assert rdir.is_dir() and (tmp_path / "s" / "limits" / "c1").is_file()
        assert got.reservation.state == "allocated"
        mark(str(tmp_path / "s"), "c1")
        assert d.core.drain_released() == ["c1"]
        assert d.ledger.get("docker:c1") is None and not rdir.exists()
        assert not (tmp_path / "s" / "limits" / "c1").exists() and pending(str(tmp_path / "s")) == []
        assert d.core.drain_released() == []
    finally:
        d.close()


@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("runc") or not shutil.which("busybox"),
                    reason="needs root, runc and busybox (make test installs them)")
def test_runc_bundle_with_etc_linked_to_the_host_is_refused(tmp_path, free_port):
    from test_daemon import start, stop

    state = tmp_path / "state"
    daemon = start(state, free_port, "--simulate", "T4")
    try:
        bundle = tmp_path / "bundle"
        rootfs = bundle / "rootfs"
        (rootfs / "bin").mkdir(parents=True)
        shutil.copy2(shutil.which("busybox"), rootfs / "bin" / "busybox")
        os.symlink("/etc", rootfs / "etc")
        subprocess.run(["runc", "spec"], cwd=bundle, check=True)
        spec = json.loads((bundle / "config.json").read_text())
        spec["process"]["env"].append("HAMI_VGPU_SPEC=mem=1g")
        spec["process"]["args"] = ["/bin/busybox", "true"]
        spec["process"]["terminal"] = False
        (bundle / "config.json").write_text(json.dumps(spec))
        before = Path("/etc/ld.so.preload").read_bytes() if Path("/etc/ld.so.preload").exists() else None
        log = tmp_path / "runc-log.json"
        r = subprocess.run([str(LAUNCHER), "--state-dir", str(state), "--root", str(tmp_path / "runc-root"),
                            "--log", str(log), "--log-format", "json", "create", "--bundle", str(bundle), "cid-etc"],
                           capture_output=True, text=True, timeout=60)
        assert r.returncode == 1
        assert "the container's /etc is a symbolic link (to '/etc')" in r.stderr
        entry = json.loads(log.read_text().splitlines()[-1])  # what docker shows the user
        assert entry["level"] == "error" and "symbolic link" in entry["msg"]
        after = Path("/etc/ld.so.preload").read_bytes() if Path("/etc/ld.so.preload").exists() else None
        assert after == before
        assert json.loads((bundle / "config.json").read_text()) == spec  # untouched
        from hamid.localapi.client import LocalClient

        with LocalClient(state) as c:
            assert c.reservations() == []
    finally:
        stop(daemon)


@pytest.mark.parametrize("env,bundle_flag,python", [
    (["PATH=/bin"], "--bundle", False),
    (["PATH=/bin", "HAMI_VGPU_SPEC=mem=1g"], "--bundle", True),
    (["PATH=/bin", "HAMI_VISIBLE_DEVICES=0"], "-b", True),
    (["PATH=/bin", "NOT_HAMI_VGPU_SPEC=x"], "--bundle=", False),
])
def test_launcher_decides_pass_through_without_starting_python(tmp_path, fake_runc, env, bundle_flag, python):
    """A create whose spec names neither variable goes straight to runc (no Python start, ~80 ms);
    one that may be ours goes to hamid-runtime-py, which decides for certain."""
    bindir = tmp_path / "bin"
    bindir.mkdir()
    shutil.copy2(LAUNCHER, bindir / "hamid-runtime")  # the C runtime, as make builds it
    shutil.copy2(ADMIT, bindir / "hamid-runtime-admit")
    (bindir / "hamid-runtime-py").write_text(f"#!/bin/sh\ntouch {tmp_path}/python-started\n")
    (bindir / "hamid-runtime-py").chmod(0o755)
    bundle = tmp_path / "bundle"
    bundle.mkdir()
    (bundle / "config.json").write_text(json.dumps({"process": {"env": env, "args": ["true"]}}))
    flag = [f"--bundle={bundle}"] if bundle_flag.endswith("=") else [bundle_flag, str(bundle)]
    r = subprocess.run([str(bindir / "hamid-runtime"), "--runc", str(fake_runc), "--root", "/r", "create", *flag,
                        "cid"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "python-started").exists() == python
    if not python:
        assert (tmp_path / "runc.args").read_text().split() == ["--root", "/r", "create", *flag, "cid"]


CLIENT = LAUNCHER


def _front(tmp_path: Path) -> tuple[Path, Path]:
    """The front door alone in a bin directory of its own, beside a stand-in hamid-runtime-admit
    that records its arguments; (the front, the record)."""
    bindir = tmp_path / "bin"
    bindir.mkdir()
    shutil.copy2(LAUNCHER, bindir / "hamid-runtime")
    record = tmp_path / "admit.args"
    (bindir / "hamid-runtime-admit").write_text(f"#!/bin/sh\nprintf '%s\\n' \"$0\" \"$@\" > {record}\n")
    (bindir / "hamid-runtime-admit").chmod(0o755)
    return bindir / "hamid-runtime", record


@pytest.mark.parametrize("verb", [["state", "cid"], ["start", "cid"], ["kill", "cid", "9"],
                                  ["delete", "--force", "cid"], ["features"], ["--version"],
                                  ["ps", "--format", "json", "cid"]])
def test_the_front_execs_runc_for_every_verb_but_create_with_argv_unchanged_and_nothing_else(tmp_path, fake_runc, verb):
    """Docker runs the runtime a dozen times or more per container: every verb but create, run and the
    hook goes to runc with exactly runc's arguments (ours dropped), and nothing else happens: no call
    on the daemon's socket, no other program (hamid-runtime-admit) started, no C library loaded."""
    import socket

    front, record = _front(tmp_path)
    state = tmp_path / "state"
    state.mkdir()
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)  # a daemon's Docker face: it must hear nothing
    sock.bind(str(state / "docker.sock"))
    sock.listen(8)
    sock.setblocking(False)
    try:
        runc_args = ["--root", "/run/docker/runtime-runc/moby", "--log", "/l.json", "--log-format", "json",
                     "--systemd-cgroup", *verb]
        r = subprocess.run([str(front), "--state-dir", str(state), "--runc", str(fake_runc), *runc_args],
                           capture_output=True, text=True)
        assert r.returncode == 0, r.stderr
        assert (tmp_path / "runc.args").read_text().splitlines() == runc_args
        assert not record.exists()
        with pytest.raises(BlockingIOError):
            sock.accept()
    finally:
        sock.close()
    # runc on PATH (daemon.json with no --runc), reached through a link to the front (make install's)
    (tmp_path / "pathdir").mkdir()
    shutil.copy2(fake_runc, tmp_path / "pathdir" / "runc")
    os.symlink(front, tmp_path / "link")
    r = subprocess.run([str(tmp_path / "link"), "--", "--root", "/r", *verb], capture_output=True, text=True,
                       env={"PATH": f"/nonexistent::{tmp_path / 'pathdir'}"})
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "runc.args").read_text().splitlines() == ["--root", "/r", *verb]
    assert not record.exists()
    data = front.read_bytes()
    assert data[:4] == b"\x7fELF" and b"ld-linux" not in data and b"libc.so" not in data  # no loader, no libc


@pytest.mark.parametrize("args", [
    ["--state-dir", "/s", "--runc", "/x/runc", "--root", "/r", "create", "--bundle", "/b", "cid"],
    ["--runc=/x/runc", "--log", "/l", "--log-format=json", "run", "-b", "/b", "cid"],
    ["--state-dir=/s", "--", "hook", "poststop", "cid"],
    ["--root", "/r", "--log-format", "json", "create", "--bundle", "/b", "cid"],  # runc from PATH: not needed
])
def test_the_front_hands_create_run_and_the_hook_to_admit_with_argv_unchanged(tmp_path, args):
    front, record = _front(tmp_path)
    os.symlink(front, tmp_path / "link")  # hamid-runtime-admit is found beside the front's real path
    r = subprocess.run([str(tmp_path / "link"), *args], capture_output=True, text=True, env={"PATH": "/nonexistent"})
    assert r.returncode == 0, r.stderr
    assert record.read_text().splitlines() == [str(tmp_path / "bin" / "hamid-runtime-admit"), *args]


def test_the_front_leaves_a_runc_it_cannot_start_to_admit_which_says_why(tmp_path):
    """No runc on PATH, or a --runc that cannot be executed: the real hamid-runtime-admit gets the call
    and reports it on stderr and in runc's --log file, which is what `docker run` shows."""
    bindir = tmp_path / "bin"
    bindir.mkdir()
    shutil.copy2(LAUNCHER, bindir / "hamid-runtime")
    shutil.copy2(ADMIT, bindir / "hamid-runtime-admit")
    log = tmp_path / "log.json"
    r = subprocess.run([str(bindir / "hamid-runtime"), "--log", str(log), "--log-format", "json", "state", "cid"],
                       capture_output=True, text=True, env={"PATH": str(tmp_path / "none")})
    assert r.returncode == 1 and "runc not found; pass --runc PATH" in r.stderr
    assert "runc not found" in json.loads(log.read_text().splitlines()[-1])["msg"]
    r = subprocess.run([str(bindir / "hamid-runtime"), "--runc", str(tmp_path / "no-runc"), "state", "cid"],
                       capture_output=True, text=True)
    assert r.returncode == 1 and f"cannot exec runc ({tmp_path / 'no-runc'})" in r.stderr
    (bindir / "hamid-runtime-admit").unlink()  # a broken install: one line that names what is missing
    r = subprocess.run([str(bindir / "hamid-runtime"), "create", "cid"], capture_output=True, text=True)
    assert r.returncode == 1 and r.stderr == f"hamid-runtime: cannot run {bindir / 'hamid-runtime-admit'}\n"


def test_the_release_marker_is_private_and_never_written_through_a_link(tmp_path):
    state = tmp_path / "s"
    r = subprocess.run([str(LAUNCHER), "--state-dir", str(state), "hook", "poststop", "abc123"],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert (state / "released" / "abc123").is_file() and oct((state / "released").stat().st_mode & 0o777) == "0o700"
    for bad in (".hidden", "a/b", ""):
        r = subprocess.run([str(LAUNCHER), "--state-dir", str(state), "hook", "poststop", bad],
                           capture_output=True, text=True)
        assert r.returncode == 1 and "bad container id" in r.stderr, bad
    (tmp_path / "elsewhere").mkdir()
    os.symlink(tmp_path / "elsewhere", state / "released" / "link")  # a marker name that is a link: not followed
    r = subprocess.run([str(LAUNCHER), "--state-dir", str(state), "hook", "poststop", "link"],
                       capture_output=True, text=True)
    assert r.returncode == 1 and not any((tmp_path / "elsewhere").iterdir())


def test_the_client_admits_through_the_daemon_and_falls_back_to_python_without_one(tmp_path, fake_runc, free_port):
    from test_daemon import start, stop

    state = tmp_path / "s"

    def bundle(name):
        b = tmp_path / name
        (b / "rootfs").mkdir(parents=True)
        (b / "config.json").write_text(json.dumps({"process": {"env": ["HAMI_VGPU_SPEC=mem=1g"], "args": ["true"]},
                                                   "root": {"path": "rootfs"}}))
        return b

    daemon = start(state, free_port, "--simulate", "T4")
    try:
        b = bundle("b1")
        r = subprocess.run([str(CLIENT), "--state-dir", str(state), "--runc", str(fake_runc), "--root", "/r",
                            "create", "--bundle", str(b), "via-daemon"], capture_output=True, text=True)
        assert r.returncode == 0, r.stderr
        assert (tmp_path / "runc.args").read_text().split() == ["--root", "/r", "create", "--bundle", str(b),
                                                                "via-daemon"]
        spec = json.loads((b / "config.json").read_text())
        assert "CUDA_DEVICE_MEMORY_LIMIT_0=1024m" in spec["process"]["env"]
        big = bundle("b2")
        spec2 = json.loads((big / "config.json").read_text())
        spec2["process"]["env"] = ["HAMI_VGPU_SPEC=mem=100g"]
        (big / "config.json").write_text(json.dumps(spec2))
        log = tmp_path / "log.json"
        r = subprocess.run([str(CLIENT), "--state-dir", str(state), "--runc", str(fake_runc), "--log", str(log),
                            "--log-format", "json", "create", "--bundle", str(big), "too-big"],
                           capture_output=True, text=True)
        assert r.returncode == 1 and "no room for this container" in r.stderr
        assert "no room for this container" in json.loads(log.read_text().splitlines()[-1])["msg"]
        # a Docker admission goes through the node service's door: it is counted like every other commit
        import httpx

        metrics = httpx.get(f"http://127.0.0.1:{free_port}/metrics", timeout=5).text
        assert 'hamid_ledger_commits_total{result="ok"} 1.0' in metrics
        assert 'hamid_ledger_commits_total{result="conflict"} 1.0' in metrics
    finally:
        stop(daemon)
    b = bundle("b3")  # no daemon now: the Python runtime admits it through the ledger
    r = subprocess.run([str(CLIENT), "--state-dir", str(state), "--runc", str(fake_runc), "create", "--bundle",
                        str(b), "no-daemon"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert "CUDA_DEVICE_MEMORY_LIMIT_0=1024m" in json.loads((b / "config.json").read_text())["process"]["env"]
    from hamid.ledger import Ledger

    led = Ledger(state / "ledger.db")
    assert {x.owner for x in led.list()} == {"docker:via-daemon", "docker:no-daemon"}
    led.close()


@pytest.mark.parametrize("node_policy,spec,want", [
    (None, "mem=1g,cores=30", "default"),            # HAMi's chart default
    ("disable", "mem=1g,cores=30", "disable"),
    ("disable", "mem=1g,cores=30,policy=force", "force"),
    ("force", "mem=1g,cores=30,policy=default", "force"),
])
def test_the_limits_file_carries_the_compute_policy_and_no_time_slots(tmp_path, node_policy, spec, want):
    from hamid.shimlimits import decode
    extra = {"gpuCorePolicy": node_policy} if node_policy else {}
    d = make_node(tmp_path / "s", **extra)
    try:
        d.core.admit(Owner("docker", "c1"), parse_docker_env([f"HAMI_VGPU_SPEC={spec}"], "c1"))
        d.core.admit(Owner("docker", "c2"), parse_docker_env(["HAMI_VGPU_SPEC=mem=1g,cores=60"], "c2"))
        lim = decode((tmp_path / "s" / "limits" / "c1").read_bytes())
        assert lim.sm_policy == want
        assert lim.devices[0].sm_percent == 30 and lim.devices[0].slots == ()  # the ledger's share, no slots
    finally:
        d.close()
