"""The daemon's limits file: hamid.shimlimits writes it, the shim reads it first and trusts nothing else.

Owns the proof that: the Python writer and the shim's C reader agree field by field; a limit the file sets
holds whatever a process's environment says (unset, raised, switched to observe or off), also for a
`docker exec`-like process with no environment at all, which lands in the container's region; a file that is
there but not right (malformed, wrong owner, writable by others, a symbolic link, a FIFO) refuses CUDA
initialisation with a clear message; and the release build reads the fixed path
/usr/local/vgpu/hamid.limits (checked in a mount namespace of its own).
"""

from __future__ import annotations

import dataclasses
import os
import shlex
import struct
import subprocess

import pytest

from hamid.errors import HamidError
from hamid.node.layout import LIMITS_IN_CONTAINER
from hamid.shimlimits import (
    ContainerLimits,
    DeviceLimits,
    LimitsFormatError,
    decode,
    encode,
    limits_size,
    write_limits_file,
)
from hamid.shimregion import read_region

MiB = 1 << 20
GiB = 1 << 30
CTX = 40 * MiB
UUID0 = "GPU-fa4e0000-0000-0000-0000-000000000000"  # the fake driver's device 0
UUID1 = "GPU-fa4e0000-0000-0000-0000-000000000001"

root_only = pytest.mark.skipif(os.geteuid() != 0, reason="the shim trusts only a root-owned file (CI runs as root)")


def sample() -> ContainerLimits:
    return ContainerLimits(
        devices=(DeviceLimits(UUID0, memory_bytes=3 * GiB + 5, sm_percent=30, slots=((0, 30), (50, 70))),
                 DeviceLimits(UUID1, memory_bytes=0, sm_percent=0)),
        region_path="/var/run/hamid/region.cache", priority=-7, sm_mode="observe", sm_period_us=250_000)


# ---- the Python side ---------------------------------------------------------

SM_POLICY_OFF = 40 + 1024  # after the 40-byte fixed header and region_path (hamid_limits.h, ABI 2)


def test_the_policy_round_trips_and_an_abi_1_file_means_force():
    """ABI 2 carries GPU_CORE_UTILIZATION_POLICY; a file an ABI 1 daemon wrote (no field) limited always."""
    for p in ("default", "force", "disable"):
        assert decode(encode(dataclasses.replace(sample(), sm_policy=p))).sm_policy == p
    assert ContainerLimits(devices=(), region_path="/r").sm_policy == "default"  # HAMi's chart default
    data = encode(dataclasses.replace(sample(), sm_policy="default"))
    old = data[:8] + struct.pack("<I", 1) + data[12:]
    assert decode(old).sm_policy == "force"
    with pytest.raises(LimitsFormatError, match="sm_policy='sometimes'"):
        encode(dataclasses.replace(sample(), sm_policy="sometimes"))


def test_round_trip_and_size():
    lim = sample()
    data = encode(lim)
    assert len(data) == limits_size() == 8192
    assert decode(data) == lim
    assert decode(encode(dataclasses.replace(lim, priority=None))).priority is None
    assert LIMITS_IN_CONTAINER == "/usr/local/vgpu/hamid.limits"


def _dev(**kw) -> ContainerLimits:
    return ContainerLimits(devices=(DeviceLimits(**{"uuid": UUID0, **kw}),), region_path="/r")


@pytest.mark.parametrize("bad,needle", [
    (lambda: _dev(sm_percent=100), "sm_percent=100: expected 0..99"),
    (lambda: _dev(sm_percent=-1), "sm_percent=-1"),
    (lambda: _dev(memory_bytes=2**64), "memory_bytes"),
    (lambda: _dev(memory_bytes=True), "memory_bytes=True"),
    (lambda: _dev(uuid=""), "uuid=''"),
    (lambda: _dev(uuid="GPU-" + "a" * 92), "1..95 printable ASCII"),
    (lambda: _dev(sm_percent=30, slots=((30, 10),)), "slot 30-10"),
    (lambda: _dev(sm_percent=30, slots=((0, 30), (20, 40))), "slot 20-40"),
    (lambda: _dev(sm_percent=30, slots=((0, 101),)), "slot 0-101"),
    (lambda: _dev(sm_percent=30, slots=tuple((i * 5, i * 5 + 2) for i in range(17))), "17 slots, at most 16"),
    (lambda: _dev(slots=((0, 30),)), "time slots need a compute limit"),
    (lambda: ContainerLimits(devices=tuple(DeviceLimits(UUID0) for _ in range(17)), region_path="/r"),
     "17 devices: at most 16"),
    (lambda: ContainerLimits(devices=(), region_path="relative/path"), "region_path='relative/path'"),
    (lambda: ContainerLimits(devices=(), region_path="/" + "x" * 1100), "at most 1023 bytes"),
    (lambda: ContainerLimits(devices=(), region_path="/r", priority=2**31), "priority=2147483648"),
    (lambda: ContainerLimits(devices=(), region_path="/r", sm_mode="off"), "sm_mode='off'"),
    (lambda: ContainerLimits(devices=(), region_path="/r", sm_period_us=10), "sm_period_us=10: expected 1000"),
])
def test_bad_values_are_named(bad, needle):
    with pytest.raises(LimitsFormatError) as e:
        encode(bad())
    assert needle in str(e.value)
    assert isinstance(e.value, HamidError)


@pytest.mark.parametrize("mutate,needle", [
    (lambda b: b[:-1], "8191 bytes"),
    (lambda b: b"\0" * 8 + b[8:], "bad magic"),
    (lambda b: b[:8] + struct.pack("<I", 5) + b[12:], "ABI 5"),
    (lambda b: b[:SM_POLICY_OFF] + struct.pack("<I", 3) + b[SM_POLICY_OFF + 4:], "sm_policy 3"),
    (lambda b: b[:16] + struct.pack("<I", 99) + b[20:], "device_count 99"),
])
def test_decode_names_what_is_wrong(mutate, needle):
    with pytest.raises(LimitsFormatError) as e:
        decode(mutate(encode(sample())))
    assert needle in str(e.value)


def test_write_is_atomic_tight_and_never_follows_a_link(tmp_path):
    target = tmp_path / "hamid.limits"
    elsewhere = tmp_path / "elsewhere"
    elsewhere.write_bytes(b"keep")
    target.symlink_to(elsewhere)
    old = os.umask(0o000)
    try:
        write_limits_file(target, sample())
    finally:
        os.umask(old)
    assert not target.is_symlink() and elsewhere.read_bytes() == b"keep"  # the link was replaced, not followed
    st = target.stat()
    assert st.st_mode & 0o7777 == 0o644 and st.st_uid == os.geteuid()
    assert decode(target.read_bytes()) == sample()
    assert [p.name for p in tmp_path.iterdir() if p.name.endswith(".tmp")] == []
    with pytest.raises(LimitsFormatError):
        write_limits_file(target, _dev(sm_percent=100))
    assert decode(target.read_bytes()) == sample()  # a refused write leaves the old file


# ---- the C reader agrees -------------------------------------------------------

@root_only
def test_the_shims_reader_reads_what_python_wrote(built):
    lim = sample()
    write_limits_file(built.limits_path, lim)
    try:
        out = subprocess.run([str(built.limitsdump)], capture_output=True, text=True, check=True).stdout
    finally:
        built.limits_path.unlink()
    got = dict(ln.split(" ", 1) for ln in out.splitlines() if not ln.startswith("device "))
    assert got["result"] == "1", out
    assert int(got["device_count"]) == 2 and int(got["flags"]) == 1 and int(got["priority"]) == -7
    assert int(got["sm_mode"]) == 1 and int(got["sm_period_us"]) == 250_000
    assert got["region_path"] == lim.region_path
    devs = [ln.split()[1:] for ln in out.splitlines() if ln.startswith("device ")]
    assert devs == [["0", UUID0, str(3 * GiB + 5), "30", "0-30", "50-70"], ["1", UUID1, "0", "0"]]


# ---- the shim takes its limits from the file -------------------------------------

@pytest.fixture
def limits(built, tmp_path):
    """Writes the container's limits file where the test build of the shim reads it; removed afterwards."""
    region = tmp_path / "container" / "region.cache"
    region.parent.mkdir(mode=0o700)

    def put(mem: int = GiB, sm: int = 0, slots=(), **kw) -> ContainerLimits:
        lim = ContainerLimits(devices=(DeviceLimits(UUID0, memory_bytes=mem, sm_percent=sm, slots=slots),),
                              region_path=str(region), **kw)
        write_limits_file(built.limits_path, lim)
        return lim

    put.region = region
    yield put
    if built.limits_path.exists() or built.limits_path.is_symlink():
        built.limits_path.unlink()


def bare_env(built, shim) -> dict[str, str]:
    """What a `docker exec` process has: no limit variables, no region variable, just the preload."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CUDA_", "HAMID_", "LIBCUDA_", "FAKE_", "GPU_"))}
    env.update(LD_LIBRARY_PATH=str(built.libdir), FAKE_GPU_STATE=str(shim.state), LD_PRELOAD=str(built.shim_limits))
    return env


def run(cmd: list[str], env: dict[str, str], timeout: float = 30) -> tuple[list[str], str, int]:
    p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
    return p.stdout.splitlines(), p.stderr, p.returncode


def allocs(lines: list[str]) -> list[str]:
    return [ln.split()[3] for ln in lines if ln.startswith("alloc ")]


@root_only
@pytest.mark.parametrize("env", [{}, {"CUDA_DEVICE_MEMORY_LIMIT": "8g"}, {"CUDA_DEVICE_MEMORY_LIMIT_0": "0"},
                                 {"CUDA_DEVICE_MEMORY_LIMIT_0": "16g", "HAMID_CONTEXT_SIZE": "1"}],
                         ids=["unset", "raised", "zero", "raised+ctx"])
def test_the_files_memory_limit_holds_whatever_the_environment_says(built, shim, limits, env):
    limits(mem=GiB)
    e = bare_env(built, shim)
    e.update(env, CUDA_DEVICE_MEMORY_SHARED_CACHE=str(shim.region))  # a region of its own choosing, too
    lines, err, rc = run([str(built.shimtest), "procaddr", "init", "alloc:mem:600m", "alloc:mem:600m", "totalmem"], e)
    assert allocs(lines) == ["0", "2"], (lines, err)
    assert [ln for ln in lines if ln.startswith("totalmem")] == [f"totalmem 0 {GiB}"]
    assert not shim.region.exists()  # the file's region, not the environment's
    assert read_region(limits.region).device(0).limit_bytes == GiB


@root_only
def test_the_files_memory_limit_holds_whatever_the_region_says(built, shim, limits):
    """The region is the container's to write: a process that sets its container's limit there to none and
    what it holds to nothing (shimtest's forgemem) is still refused at the file's limit for what it holds
    itself (issue 37: before, both 600 MiB allocations after the forgery passed a 1 GiB limit)."""
    limits(mem=GiB)
    e = bare_env(built, shim)
    e.update(CUDA_DEVICE_MEMORY_SHARED_CACHE=str(limits.region))  # forgemem finds the region by it
    lines, err, rc = run([str(built.shimtest), "procaddr", "init", "alloc:mem:600m", "forgemem", "alloc:mem:600m",
                          "alloc:mem:300m", "totalmem"], e)
    assert "forgemem ok" in lines, (lines, err)
    assert allocs(lines) == ["0", "2", "0"], (lines, err)  # 600 more would pass 1 GiB; 300 fits
    assert [ln for ln in lines if ln.startswith("totalmem")] == [f"totalmem 0 {GiB}"]


@root_only
def test_a_process_with_no_environment_joins_the_container(built, shim, limits):
    """The first process came with limit variables (as `docker run` sets them) and holds 600 MiB; a process
    started like `docker exec` has none at all: it gets the file's limit and is counted in the same region."""
    limits(mem=GiB)
    first_env = bare_env(built, shim)
    first_env.update(CUDA_DEVICE_MEMORY_LIMIT="16g")
    holder = subprocess.Popen([str(built.shimtest), "procaddr", "init", "alloc:mem:600m", "wait"], env=first_env,
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "init 0"
        assert holder.stdout.readline().strip() == "alloc mem 600m 0"
        assert holder.stdout.readline().strip() == "ready"
        go = limits.region.parent / "go"
        second = subprocess.Popen([str(built.shimtest), "procaddr", "init", "alloc:mem:600m", "alloc:mem:300m",
                                   f"waitfile:{go}"], env=bare_env(built, shim), stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, text=True)
        lines = [second.stdout.readline().strip() for _ in range(4)]
        snap = read_region(limits.region)
        go.touch()
        second.communicate(timeout=30)
    finally:
        holder.communicate("go\n", timeout=30)
    assert allocs(lines) == ["2", "0"], lines  # 600 more would pass 1 GiB; 300 fits
    assert sorted(p.pid for p in snap.processes) == sorted([holder.pid, second.pid])
    assert snap.device(0).used_bytes == 900 * MiB + 2 * CTX and snap.device(0).limit_bytes == GiB


@root_only
@pytest.mark.parametrize("env", [{"HAMID_SM_LIMIT_MODE": "observe"}, {"GPU_CORE_UTILIZATION_POLICY": "disable"},
                                 {"CUDA_DEVICE_SM_LIMIT": "0"}, {"HAMID_SM_AHEAD_US": "1000000"}],
                         ids=["observe", "disable", "unset", "ahead"])
def test_the_files_compute_limit_cannot_be_switched_off(built, shim, limits, env):
    limits(mem=0, sm=20)
    e = bare_env(built, shim)
    e.update(env)
    lines, err, rc = run([str(built.shimtest), "direct", "init", "run:0.6:400:k"], e)
    n, ns = (int(x) for x in [ln for ln in lines if ln.startswith("run ")][0].split()[1:3])
    share = n * 400e3 / ns
    assert share < 0.3, (share, err)  # 20 % enforced; ~1.0 when switched off
    d = read_region(limits.region).device(0)
    assert d.sm_limit_percent == 20 and d.throttle_ns > 0


@root_only
@pytest.mark.parametrize("priority,listed,held", [(1, True, True), (None, True, True), (0, True, False),
                                                  (1, False, False)],
                         ids=["low", "unset-is-low", "high", "nobody-listed"])
def test_a_busy_higher_priority_process_holds_the_launches_back(built, shim, limits, tmp_path, priority, listed,
                                                                held):
    """HAMi's priority: while a higher-priority container's process (listed in the file's live hold_pids by
    the daemon, updated in place) runs kernels (NVML's per-process samples), a lower-priority container's
    launches wait; they go on once it has been idle for the hold time. No compute limit needed. On the
    stand-in driver's virtual clock (shimharness.py), the neighbour's changes at set moments of the run."""
    from hamid.shimlimits import write_hold_pids
    limits(mem=0, sm=0, priority=priority)
    if listed:
        write_hold_pids(built.limits_path, 0, [4242])
    util = tmp_path / "nvml_util"
    util.write_text("4242 0\n")  # idle while the process starts (its first launches start the monitor)
    e = bare_env(built, shim)
    e.update(FAKE_NVML_UTIL=str(util), FAKE_VCLOCK="1")
    # the neighbour busy only once the monitor runs (busy from the start, a monitor that polled before the
    # second launch would hold it), seen busy 0.3 s before the run, idle from 1.0 s into it: the hold ends
    # within its 2 s
    p = subprocess.run([str(built.shimtest), "direct", "init", "launch:2:400:k", f"at:0:{util}:4242 80", "sleep:300",
                        f"at:1000:{util}:4242 0", "run:0.5:400:k"], env=e, capture_output=True, text=True, timeout=30)
    out, err = p.stdout, p.stderr
    n, ns, longest = (int(x) for x in [ln for ln in out.splitlines() if ln.startswith("run ")][0].split()[1:4])
    if held:
        assert longest > 0.9e9 and ns > 1.4e9, (n, ns, longest, err)
        assert read_region(limits.region).device(0).throttle_ns > 0.9e9
    else:
        assert longest < 0.2e9 and ns < 0.8e9, (n, ns, longest, err)


@root_only
def test_a_region_claiming_the_neighbours_pid_does_not_escape_the_hold(built, shim, limits, tmp_path):
    """A low-priority container writes its own region (it is mapped writable inside the container): once its
    process runs, the region's process table claims the high-priority neighbour's pid 4242 as one of its own.
    The hold list the daemon wrote names 4242, busy in NVML: the launches are still held (a shim that trusted
    its region's pids dropped the entry and ran free beside its neighbour). On the stand-in driver's virtual
    clock (shimharness.py): time stands still while the process waits for "go"."""
    from hamid.shimlimits import write_hold_pids
    from shimharness import claim_in_region
    limits(mem=0, sm=0, priority=1)
    write_hold_pids(built.limits_path, 0, [4242])
    util = tmp_path / "nvml_util"
    util.write_text("4242 0\n")
    e = bare_env(built, shim)
    e.update(FAKE_NVML_UTIL=str(util), FAKE_VCLOCK="1")
    p = subprocess.Popen([str(built.shimtest), "direct", "init", "launch:2:400:k", "wait", f"at:0:{util}:4242 80",
                          "sleep:300", f"at:1000:{util}:4242 0", "run:0.5:400:k"], env=e, stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    lines = []
    while (ln := p.stdout.readline()) and ln.strip() != "ready":
        lines.append(ln)
    assert ln, (lines, p.stderr.read())
    claim_in_region(limits.region, [4242])
    assert 4242 in [pr.nvml_pid for pr in read_region(limits.region).processes]
    p.stdin.write("go\n")
    p.stdin.flush()
    out, err = p.communicate(timeout=30)
    n, ns, longest = (int(x) for x in [ln for ln in out.splitlines() if ln.startswith("run ")][0].split()[1:4])
    assert longest > 0.9e9 and ns > 1.4e9, (n, ns, longest, err)


# ---- a file that is there but not right refuses CUDA ---------------------------------

def _wrong_owner(path):
    os.chown(path, 1000, 0)


def _group_writable(path):
    os.chmod(path, 0o664)


def _truncated(path):
    os.truncate(path, 100)


def _bad_magic(path):
    with open(path, "r+b") as f:
        f.write(b"\0" * 8)


def _bad_slots(path):
    data = bytearray(open(path, "rb").read())
    dev0 = 2048
    struct.pack_into("<II", data, dev0 + 96 + 8, 30, 1)  # sm_percent = 30, nslots = 1
    data[dev0 + 96 + 8 + 8:dev0 + 96 + 8 + 10] = bytes([50, 20])  # slot 50-20
    open(path, "wb").write(bytes(data))


def _symlink(path):
    real = path.with_name("real.limits")
    os.rename(path, real)
    path.symlink_to(real)


def _fifo(path):
    os.unlink(path)
    os.mkfifo(path, 0o644)


def _directory(path):
    os.unlink(path)
    os.mkdir(path)


@root_only
@pytest.mark.parametrize("spoil,needle", [
    (_wrong_owner, "owned by uid 1000, not root"), (_group_writable, "mode 0664"), (_truncated, "100 bytes"),
    (_bad_magic, "bad magic"), (_bad_slots, "slot 50-20"), (_symlink, "symbolic link"),
    (_fifo, "not a regular file"), (_directory, "not a regular file"),
])
def test_a_limits_file_that_is_not_right_refuses_cuda(built, shim, limits, spoil, needle):
    limits(mem=GiB)
    spoil(built.limits_path)
    try:
        e = bare_env(built, shim)
        e.update(CUDA_DEVICE_MEMORY_LIMIT="1g")
        lines, err, rc = run([str(built.shimtest), "procaddr", "init", "alloc:mem:10m"], e, timeout=10)
    finally:
        real = built.limits_path.with_name("real.limits")
        if real.exists():
            real.unlink()
        if built.limits_path.is_dir():
            built.limits_path.rmdir()
    assert lines[0] == "init 3", (lines, err)  # CUDA_ERROR_NOT_INITIALIZED
    assert allocs(lines) != ["0"]
    assert "CUDA refused" in err and needle in err, err
    assert err.count("CUDA refused") == 1


@root_only
def test_a_region_the_file_names_that_cannot_be_used_refuses_cuda(built, shim, limits):
    """Per-process limits would let every process of the container take the whole limit."""
    limits(mem=GiB)
    limits.region.mkdir()  # a directory where the region file should be
    lines, err, rc = run([str(built.shimtest), "procaddr", "init", "alloc:mem:10m"], bare_env(built, shim))
    assert allocs(lines) == ["3"] or lines[0] == "init 3", (lines, err)
    assert "CUDA refused" in err and str(limits.region) in err


# ---- the release build reads the fixed path ---------------------------------------

@root_only
def test_the_release_shim_reads_the_fixed_path(built, shim, tmp_path):
    """A mount namespace of its own: a tmpfs over /usr/local holds vgpu/hamid.limits; the release build
    (which no variable can point elsewhere) takes its limit from there."""
    region = tmp_path / "c" / "region.cache"
    region.parent.mkdir(mode=0o700)
    staged = tmp_path / "staged.limits"
    write_limits_file(staged, ContainerLimits(devices=(DeviceLimits(UUID0, memory_bytes=GiB),),
                                              region_path=str(region)))
    env = bare_env(built, shim)
    env.update(LD_PRELOAD=str(built.shim), CUDA_DEVICE_MEMORY_LIMIT="8g")
    cmd = " && ".join([
        "mount -t tmpfs -o mode=0755 none /usr/local", "mkdir /usr/local/vgpu",
        f"cp -p {shlex.quote(str(staged))} {LIMITS_IN_CONTAINER}",
        f"{shlex.quote(str(built.shimtest))} procaddr init alloc:mem:600m alloc:mem:600m",
    ])
    lines, err, rc = run(["unshare", "--mount", "--propagation", "private", "sh", "-c", cmd], env)
    assert allocs(lines) == ["0", "2"], (lines, err)
    assert read_region(region).device(0).limit_bytes == GiB
    assert not os.path.exists(LIMITS_IN_CONTAINER)  # nothing leaked out of the namespace


@pytest.mark.parametrize("share,expect", [(0, 0.50), (2000, 0.25)], ids=["none", "doubled"])
def test_the_daemons_sharing_correction_scales_the_charge(built, shim, limits, tmp_path, share, expect):
    """share_milli (the daemon's correction while containers time-share a GPU, written in place) multiplies
    every charge: at a 50 % limit a correction of 2000 holds the process to a quarter of the GPU."""
    from hamid.shimlimits import write_share
    limits(mem=0, sm=50, sm_policy="force")
    write_share(built.limits_path, 0, share)
    util = tmp_path / "nvml_util"
    util.write_text("")  # NVML answers, nobody busy: the monitor runs (and reads the live part)
    e = bare_env(built, shim)
    e["FAKE_NVML_UTIL"] = str(util)
    bare_out, _, _ = run([str(built.shimtest), "direct", "init", "run:1.0:400:k"],
                         {k: v for k, v in e.items() if k != "LD_PRELOAD"})
    out, err, rc = run([str(built.shimtest), "direct", "init", "run:0.4:400:k", "run:1.2:400:k"], e)
    rate = [ln.split() for ln in out if ln.startswith("run ")]
    bare_n, bare_ns = (int(x) for x in [ln for ln in bare_out if ln.startswith("run ")][0].split()[1:3])
    n, ns = (int(x) for x in rate[-1][1:3])
    got = (n / ns) / (bare_n / bare_ns)
    assert abs(got - expect) <= 0.06, (share, got, err[-2000:])


def test_a_share_out_of_range_is_refused_by_writer_and_shim(built, shim, limits):
    from hamid.errors import HamidError
    from hamid.shimlimits import write_share
    from hamid.shimlimits.codec import share_offset
    limits(mem=0, sm=50)
    for bad in (1, 249, 4001, -5, True):
        with pytest.raises(HamidError, match="expected 0 .none. or 250..4000"):
            write_share(built.limits_path, 0, bad)
    raw = bytearray(built.limits_path.read_bytes())  # a file written with a bad value: the shim refuses CUDA
    raw[share_offset(0):share_offset(0) + 4] = struct.pack("<I", 9000)
    built.limits_path.unlink()
    fd = os.open(built.limits_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    os.write(fd, bytes(raw))
    os.close(fd)
    out, err, rc = run([str(built.shimtest), "direct", "init"], bare_env(built, shim))
    assert "share_milli 9000, expected 0 (none) or 250..4000" in err, (out, err)


@pytest.mark.parametrize("active,expect", [(False, None), (True, 0.30)], ids=["idle", "active"])
def test_policy_default_limits_while_the_daemon_says_another_container_is_active(built, shim, limits, tmp_path,
                                                                                 active, expect):
    """others_active (ABI 4, live): the daemon's word that another container on the GPU launched kernels within
    HAMi's window, which this process's NVML watch may not see (a launch-bound neighbour's samples are rare).
    Policy default, NVML showing nobody busy: held to the limit while the file says 1, free while it says 0.
    Rates on the stand-in driver's virtual clock (shimharness.py)."""
    from hamid.shimlimits import write_others_active
    limits(mem=0, sm=30, sm_policy="default")
    write_others_active(built.limits_path, 0, active)
    util = tmp_path / "nvml_util"
    util.write_text("")  # NVML answers, nobody busy
    e = bare_env(built, shim)
    e.update(FAKE_NVML_UTIL=str(util), FAKE_VCLOCK="1")
    bare_out, _, _ = run([str(built.shimtest), "direct", "init", "run:1.0:400:k"],
                         {k: v for k, v in e.items() if k != "LD_PRELOAD"})
    out, err, rc = run([str(built.shimtest), "direct", "init", "run:0.4:400:k", "run:1.2:400:k"], e)
    bare_n, bare_ns = (int(x) for x in [ln for ln in bare_out if ln.startswith("run ")][0].split()[1:3])
    n, ns = (int(x) for x in [ln.split() for ln in out if ln.startswith("run ")][-1][1:3])
    got = (n / ns) / (bare_n / bare_ns)
    if expect is None:
        assert got > 0.85, (got, err[-2000:])
    else:
        assert abs(got - expect) <= 0.07, (got, err[-2000:])


def test_others_active_out_of_range_is_refused_by_writer_and_shim(built, shim, limits):
    from hamid.shimlimits import write_others_active
    from hamid.shimlimits.codec import others_offset
    limits(mem=0, sm=50)
    for bad in (1, 0, "yes", None):
        with pytest.raises(HamidError, match="expected True or False"):
            write_others_active(built.limits_path, 0, bad)
    raw = bytearray(built.limits_path.read_bytes())
    raw[others_offset(0):others_offset(0) + 4] = struct.pack("<I", 7)
    built.limits_path.unlink()
    fd = os.open(built.limits_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    os.write(fd, bytes(raw))
    os.close(fd)
    out, err, rc = run([str(built.shimtest), "direct", "init"], bare_env(built, shim))
    assert "others_active 7, expected 0 or 1" in err, (out, err)


@root_only
def test_a_hold_list_naming_the_process_itself_never_holds_it(built, shim, limits, tmp_path):
    """A hold list that names the container's own process (a daemon that got it wrong, a file from before the
    host's pid map): the shim leaves its own pids out, so a busy process is never held behind itself. On the
    stand-in driver's virtual clock (shimharness.py): time stands still while the process waits for "go"."""
    from hamid.shimlimits import write_hold_pids
    limits(mem=0, sm=0, priority=1)
    util = tmp_path / "nvml_util"
    util.write_text("")
    e = bare_env(built, shim)
    e.update(FAKE_NVML_UTIL=str(util), FAKE_VCLOCK="1")
    p = subprocess.Popen([str(built.shimtest), "direct", "init", "launch:2:400:k", "wait", "run:0.5:400:k"], env=e,
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    lines = []
    while (ln := p.stdout.readline()) and ln.strip() != "ready":
        lines.append(ln)
    assert ln, (lines, p.stderr.read())
    write_hold_pids(built.limits_path, 0, [p.pid])
    util.write_text(f"{p.pid} 80\n")  # the process itself, busy: the monitor reads both within the run's 0.1 s
    p.stdin.write("go\n")
    p.stdin.flush()
    out, err = p.communicate(timeout=30)
    n, ns, longest = (int(x) for x in [ln for ln in out.splitlines() if ln.startswith("run ")][0].split()[1:4])
    assert longest < 0.2e9 and ns < 0.8e9, (n, ns, longest, err)
