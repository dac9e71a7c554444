"""The shim (libvgpu.so) against fake driver stand-ins, on a CPU-only machine.

Owns the CPU proof of shim/: every way a program reaches the driver, every
allocator, the limit across processes, frees, the NVML view, fork, threads,
dead-process reclaim, a lock owner's death, the compute limiter's share, and
that unrelated "cu*" names and non-CUDA programs are left alone. The real-GPU
proof is bench/gpu/.
"""

from __future__ import annotations

import os
import re
import shlex
import struct
import subprocess
import sys
import time

import pytest

from hamid.shimregion import read_region

from shimharness import SHIM_DIR, Shim, finish, wait_ready

MiB = 1 << 20
GiB = 1 << 30
CTX = 40 * MiB  # the fake driver's context size
MODES = ["direct", "dlsym", "procaddr"]


def used(shim) -> int:
    return read_region(shim.region).device(0).used_bytes


# ---- build ----------------------------------------------------------------

def test_build_is_versioned_and_exports_only_the_intended_names(built):
    real = built.shim
    assert re.fullmatch(r"libvgpu\.so\.\d+\.\d+\.\d+", real.name), real.name
    assert real.name == "libvgpu.so." + (SHIM_DIR / "VERSION").read_text().strip()
    nm = subprocess.run(["nm", "-D", "--defined-only", str(real)], capture_output=True, text=True, check=True)
    exported = {ln.split()[-1] for ln in nm.stdout.splitlines() if ln.strip()}
    mapfile = (SHIM_DIR / "libvgpu.map").read_text()
    listed = set(re.findall(r"\b((?:cu|nvml)\w+|dlsym|hamid_shim_version)\b", mapfile.split("global:")[1].split("local:")[0]))
    assert exported == listed
    needed = subprocess.run(["readelf", "-d", str(real)], capture_output=True, text=True, check=True).stdout
    assert "libcuda" not in needed and "libnvidia-ml" not in needed  # built with gcc alone, resolved at run time


# ---- the three ways in ------------------------------------------------------

@pytest.mark.parametrize("mode", MODES)
def test_memory_limit_through_every_route(shim, mode):
    r = shim.run(mode, "init", "alloc:mem:512m", "alloc:mem:600m", "meminfo", "totalmem", "nvml", "freebad",
                 "freeall", "meminfo", CUDA_DEVICE_MEMORY_LIMIT="1g")
    assert r.rc == 0, r
    allocs = r.find("alloc")
    assert [a[3] for a in allocs] == ["0", "2"]  # second one is CUDA_ERROR_OUT_OF_MEMORY
    info = r.find("meminfo")
    assert info[0][1] == "0" and int(info[0][3]) == GiB
    assert int(info[0][2]) == GiB - 512 * MiB - CTX
    assert r.one("totalmem")[1:] == ["0", str(GiB)]
    nv, nv2 = r.one("nvml"), r.one("nvml2")
    for line in (nv, nv2):
        assert line[1] == "0" and int(line[2]) == GiB and int(line[3]) == 512 * MiB + CTX
    assert r.one("freebad")[1] == "1"  # the driver's own answer for an unknown pointer
    assert r.one("freeall")[1] == "0"
    assert int(info[1][2]) == GiB - CTX  # everything returned, nothing leaked


def test_without_the_shim_nothing_is_limited(shim):
    r = shim.run("direct", "init", "alloc:mem:600m", "alloc:mem:600m", "totalmem", preload=False,
                 CUDA_DEVICE_MEMORY_LIMIT="1g")
    assert [a[3] for a in r.find("alloc")] == ["0", "0"]
    assert int(r.one("totalmem")[2]) == 16384 * MiB
    assert not shim.region.exists()


@pytest.mark.parametrize("kind", ["mem", "managed", "pitch", "async", "asyncptsz", "pool", "vmm", "array", "array3d", "mipmap"])
def test_every_allocator_counts_and_frees(shim, kind):
    r = shim.run("procaddr", "init", f"alloc:{kind}:600m", "meminfo", f"alloc:{kind}:600m",
                 "free:0", "meminfo", CUDA_DEVICE_MEMORY_LIMIT="1g")
    allocs = r.find("alloc")
    assert allocs[0][3] == "0" and allocs[1][3] == "2", (kind, r)
    f, t = (int(x) for x in r.find("meminfo")[0][2:4])
    charged = t - f - CTX
    top = 810 * MiB if kind == "mipmap" else 604 * MiB  # a mipmap chain carries its smaller levels (< 4/3)
    assert 600 * MiB <= charged <= top, (kind, charged)
    assert r.one("free")[2] == "0"
    f2, _ = (int(x) for x in r.find("meminfo")[1][2:4])
    assert GiB - f2 == CTX, kind


@pytest.mark.parametrize("kind,env", [("pitch", {"FAKE_PITCH_ALIGN": str(MiB)}), ("array", {"FAKE_ARRAY_PAD_PCT": "100"}),
                                      ("array3d", {"FAKE_ARRAY_PAD_PCT": "100"}), ("mipmap1d", {})])
def test_an_allocation_larger_than_estimated_is_refused_at_the_limit(shim, kind, env):
    """Every byte is admitted: when the driver's real size (a pitch aligned to 1 MiB rows, an array padded to twice
    its texels, a 1-D mip chain of nearly twice its base) exceeds what was estimated and does not fit, the
    allocation is freed again and refused; nothing stays charged, on the host either. 600 MiB estimated, about
    1.2 GiB real, under a 1 GiB limit."""
    p = shim.spawn("procaddr", "init", f"alloc:{kind}:600m", "meminfo", "wait", CUDA_DEVICE_MEMORY_LIMIT="1g", **env)
    lines = wait_ready(p)
    host = {int(ln[1]): int(ln[2]) for ln in shim.run("dlsym", "nvmlprocs", preload=False).find("proc")}
    inside = used(shim)
    finish(p)
    assert f"alloc {kind} 600m 2" in lines, lines
    assert inside == CTX and host[p.pid] == CTX, (inside, host)
    r = shim.run("procaddr", "init", f"alloc:{kind}:300m", "meminfo", CUDA_DEVICE_MEMORY_LIMIT="2g", **env)
    free, total = (int(x) for x in r.one("meminfo")[2:4])
    assert r.one("alloc")[3] == "0" and total - free - CTX >= 580 * MiB, r  # what fits is charged in full


def test_accounting_matches_the_host_view(shim):
    """The container's figure against the (fake) host's, with VMM, pools and arrays mixed."""
    p = shim.spawn("procaddr", "init", "alloc:mem:300m", "alloc:vmm:256m", "alloc:pool:100m", "alloc:async:64m",
                   "alloc:array:32m", "alloc:managed:10m", "wait", CUDA_DEVICE_MEMORY_LIMIT="4g")
    wait_ready(p)
    inside = used(shim)
    host = shim.run("dlsym", "nvml", preload=False)
    host_used = int(host.one("nvml")[3])
    finish(p)
    assert abs(inside - host_used) <= 0.02 * host_used, (inside, host_used)
    snap = read_region(shim.region)
    assert snap.processes == [] and snap.device(0).used_bytes == 0  # released at exit


def _in_pid_namespace(shim, tmp_path, cmds: list[list[str]], **env: str) -> subprocess.Popen:
    """Start shimtest processes together in one new pid namespace, as the processes of one container: /proc
    is left the host's, so the fake NVML (a stand-in) reports host pids, as the real driver does. Returns
    once every process printed 'ready' (touch tmp_path/'go' to let them finish)."""
    script = " ".join(f"{' '.join(map(shlex.quote, [str(shim.built.shimtest), *c]))} &" for c in cmds) + " wait"
    p = subprocess.Popen(["unshare", "--pid", "--fork", "sh", "-c", script], env=shim.environ(**env),
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    ready = 0
    while ready < len(cmds):
        ln = p.stdout.readline()
        assert ln, f"ended before every process was ready: {p.stderr.read()}"
        ready += ln.strip() == "ready"
    return p


@pytest.mark.skipif(os.geteuid() != 0, reason="a new pid namespace needs root (CI runs as root)")
@pytest.mark.parametrize("first_context", [["init"], ["cuinit", "ctxcreate"]], ids=["primary", "own"])
def test_nvml_figure_is_found_inside_a_pid_namespace(shim, tmp_path, first_context):
    """Drivers that ignore pid namespaces list a container's processes by their host pids (this stand-in does
    so), so getpid() is not in NVML's list. Two processes of one container create their contexts at the same moment
    (creation takes 300 ms; the primary one, or one of their own with cuCtxCreate), then load a 24 MiB module
    that no allocation call shows, only NVML's per-process figure. Each must find its host pid and so count that
    module: the container's figure for each process equals the host's."""
    go = tmp_path / "go"
    cmd = ["procaddr", *first_context, "launch:1:10", "sleep:300", "alloc:mem:64m", f"waitfile:{go}"]
    p = _in_pid_namespace(shim, tmp_path, [cmd, cmd], CUDA_DEVICE_MEMORY_LIMIT="1g", FAKE_CTX_CREATE_MS="300",
                          FAKE_MODULE_MB="24")
    try:
        snap = read_region(shim.region)
        host = {int(ln[1]): int(ln[2]) for ln in shim.run("dlsym", "nvmlprocs", preload=False).find("proc")}
    finally:
        go.touch()
        p.communicate(timeout=30)
    assert len(snap.processes) == 2
    assert {q.nvml_pid for q in snap.processes} == set(host), (snap.processes, host)
    for q in snap.processes:
        assert q.pid != q.nvml_pid  # really in a namespace of its own
        assert q.used_bytes[0] == host[q.nvml_pid] == 64 * MiB + CTX + 24 * MiB, (q, host)
    assert snap.device(0).used_bytes == sum(host.values())


def test_a_region_from_the_previous_abi_is_taken_over(shim):
    """A region file an ABI 1 shim wrote (a container that outlived an upgrade) is upgraded in place."""
    assert shim.run("procaddr", "init", CUDA_DEVICE_MEMORY_LIMIT="1g").rc == 0
    with open(shim.region, "r+b") as f:
        f.seek(8)  # magic (8 bytes), then abi_version: fixed forever (hamid_region.h)
        f.write(struct.pack("<I", 1))
    assert read_region(shim.region).abi_version == 1
    p = shim.spawn("procaddr", "init", "alloc:mem:64m", "wait", CUDA_DEVICE_MEMORY_LIMIT="1g")
    wait_ready(p)
    snap = read_region(shim.region)
    finish(p)
    assert snap.abi_version == 2
    assert [(q.nvml_pid, q.used_bytes[0]) for q in snap.processes] == [(p.pid, 64 * MiB + CTX)]


def test_version_and_flags_answered_like_the_driver(shim):
    r = shim.run("direct", "init",
                 "procaddr:cuMemAlloc:12080:0", "procaddr:cuMemAlloc:3000:0", "procaddr:cuLaunchKernel:12080:0",
                 "procaddr:cuLaunchKernel:12080:2", "procaddr:cuCtxSynchronize:12080:0",
                 "procaddr:cuGetProcAddress:12080:0", "procaddr:cuGetProcAddress:11040:0",
                 "procaddr:cuNoSuchSymbol:12080:0", "procaddr:cuMemAllocAsync:11000:0",
                 "procaddr:cuDevicePrimaryCtxRelease:10000:0", "procaddr:cuDevicePrimaryCtxRelease:11000:0")
    ans = [ln[5] for ln in r.find("procaddr")]
    assert ans[0].endswith(":cuMemAlloc_v2") and ans[0].startswith("libvgpu")
    assert ans[1] == "libcuda.so.1:cuMemAlloc"  # the CUDA 3.0 ABI: the driver's, untouched
    assert ans[2].startswith("libvgpu") and ans[2].endswith(":cuLaunchKernel")
    assert ans[3].startswith("libvgpu") and ans[3].endswith(":cuLaunchKernel_ptsz")
    assert ans[4] == "libcuda.so.1:cuCtxSynchronize"  # not ours: the real function
    assert ans[5].startswith("libvgpu") and ans[5].endswith(":cuGetProcAddress_v2")
    assert ans[6].startswith("libvgpu") and ans[6].endswith(":cuGetProcAddress")
    lines = r.find("procaddr")
    assert lines[7][3] == "500" and ans[7] == "none"
    assert lines[8][3] == "500" and lines[8][4] == "2"  # version not sufficient, as the driver said
    assert ans[9] == "libcuda.so.1:cuDevicePrimaryCtxRelease" or lines[9][3] != "0"
    assert ans[10].startswith("libvgpu") and ans[10].endswith(":cuDevicePrimaryCtxRelease_v2")


def test_each_cuCtxCreate_abi_is_answered_with_its_own_wrapper(shim):
    """cuGetProcAddress("cuCtxCreate") names three ABIs by version (cudaTypedefs.h of CUDA 13:
    PFN_cuCtxCreate_v3020, _v11040, _v12050); each caller gets the wrapper of the one it asked for, never a
    wrapper of another signature."""
    r = shim.run("direct", "init", *(f"procaddr:cuCtxCreate:{v}:0" for v in (3020, 11040, 12050, 13000)))
    ans = [ln[5] for ln in r.find("procaddr")]
    assert all(a.startswith("libvgpu") for a in ans), ans
    assert [a.split(":")[1] for a in ans] == ["cuCtxCreate_v2", "cuCtxCreate_v3", "cuCtxCreate_v4", "cuCtxCreate_v4"]


def test_dlsym_hands_out_wrappers_only_for_driver_functions(shim, built):
    r = shim.run("direct", "dlsymowner:libcuda.so.1:cuMemAlloc_v2", "dlsymowner:libcuda.so.1:cuCtxSynchronize",
                 "dlsymowner:libnvidia-ml.so.1:nvmlDeviceGetMemoryInfo_v2",
                 "dlsymowner:libnvidia-ml.so.1:nvmlDeviceGetCount_v2")
    owners = [ln[2] for ln in r.find("dlsymowner")]
    assert owners[0].startswith("libvgpu") and owners[0].endswith(":cuMemAlloc_v2")
    assert owners[1] == "libcuda.so.1:cuCtxSynchronize"
    assert owners[2].startswith("libvgpu")
    assert owners[3] == "libnvidia-ml.so.1:nvmlDeviceGetCount_v2"


def test_unrelated_cu_names_are_not_hijacked(shim, built):
    r = shim.run("direct", f"callfake:{built.unrelated}", CUDA_DEVICE_MEMORY_LIMIT="1g")
    assert r.rc == 0 and r.one("callfake")[1:] == ["11", "22", "33", "44"]
    assert not shim.region.exists()  # looking up cudnn*/cublas*/curl* never started the shim


def test_rtld_next_keeps_the_callers_identity(shim, built):
    r = shim.run("direct", f"next:{built.next_a}")
    assert r.one("next")[1] == "2"


@pytest.mark.parametrize("argv", [["/bin/true"], ["sh", "-c", "echo hi; ls / >/dev/null"],
                                  [sys.executable, "-c", "import ctypes, threading; threading.Thread(target=print).start()"]])
def test_programs_that_never_use_cuda(shim, argv):
    p = subprocess.run(argv, env=shim.environ(CUDA_DEVICE_MEMORY_LIMIT="1g"), capture_output=True, text=True, timeout=30)
    assert p.returncode == 0, p.stderr
    assert "hamid-shim" not in p.stderr
    assert not shim.region.exists()


# ---- several processes -------------------------------------------------------

def test_admission_is_atomic_across_processes(shim):
    """8 processes race for 2 GiB in 256 MiB pieces: exactly 8 pieces fit, never a 9th."""
    env = dict(CUDA_DEVICE_MEMORY_LIMIT="2g", FAKE_CTX_MB="0")
    procs = [shim.spawn("procaddr", "init", "wait", *(["alloc:mem:256m"] * 4), "wait", **env) for _ in range(8)]
    for p in procs:
        wait_ready(p)
    for p in procs:
        p.stdin.write("go\n")
        p.stdin.flush()
    got = [wait_ready(p) for p in procs]
    snap = read_region(shim.region)
    for p in procs:
        finish(p)
    ok = sum(1 for lines in got for ln in lines if ln.startswith("alloc") and ln.split()[3] == "0")
    refused = sum(1 for lines in got for ln in lines if ln.startswith("alloc") and ln.split()[3] == "2")
    assert (ok, refused) == (8, 24)
    assert snap.device(0).used_bytes == 2 * GiB
    assert sum(p.used_bytes.get(0, 0) for p in snap.processes) == 2 * GiB
    assert len(snap.processes) == 8 and len({p.slot for p in snap.processes}) == 8


def test_dead_process_is_reclaimed_without_moving_others(shim):
    env = dict(CUDA_DEVICE_MEMORY_LIMIT="1g")
    holder = shim.spawn("procaddr", "init", "alloc:mem:100m", "wait", **env)
    wait_ready(holder)
    victim = shim.run("procaddr", "init", "alloc:mem:600m", "kill", **env)
    assert victim.rc == -9
    before = read_region(shim.region)
    assert len(before.processes) == 2
    holder_slot = next(p.slot for p in before.processes if p.pid == holder.pid)
    r = shim.run("procaddr", "init", "alloc:mem:700m", **env)  # only fits once the dead one is reclaimed
    assert r.one("alloc")[3] == "0", r
    after = read_region(shim.region)
    assert after.reclaimed_procs >= 1
    assert [p.slot for p in after.processes if p.pid == holder.pid] == [holder_slot]
    assert after.device(0).used_bytes == 100 * MiB + CTX
    finish(holder)


def test_a_process_dying_with_the_lock_blocks_nobody(shim):
    env = dict(CUDA_DEVICE_MEMORY_LIMIT="1g")
    assert shim.run("procaddr", "init", "alloc:mem:64m", **env).rc == 0
    assert shim.run("direct", "lockdie", **env).one("locked")
    t0 = time.monotonic()
    r = shim.run("procaddr", "init", "alloc:mem:900m", "meminfo", timeout=10, **env)
    assert r.one("alloc")[3] == "0" and time.monotonic() - t0 < 5
    assert "died holding the region lock" in r.stderr


def test_fork_child_counts_in_the_container_and_is_released(shim):
    r = shim.run("procaddr", "init", "alloc:mem:300m", "fork", "alloc:mem:300m", "alloc:mem:300m", "endfork",
                 "alloc:mem:300m", "alloc:mem:300m", "meminfo", CUDA_DEVICE_MEMORY_LIMIT="800m")
    allocs = [a[3] for a in r.find("alloc")]
    # parent 300 | child 300 ok, child's second 300 over the container's 800m | child gone: parent 300 ok, next not
    assert allocs == ["0", "0", "2", "0", "2"], r
    assert r.one("forkdone")[1] == "0"
    assert used(shim) == 0  # everyone exited


def test_threads_allocating_at_once_leave_exact_totals(shim):
    p = shim.spawn("procaddr", "init", "threads:8:300:1m", "meminfo", "wait", CUDA_DEVICE_MEMORY_LIMIT="1g")
    lines = wait_ready(p)
    assert "threads done" in lines
    snap = read_region(shim.region)
    finish(p)
    assert snap.device(0).used_bytes == CTX
    assert [p.used_bytes.get(0) for p in snap.processes] == [CTX]


def test_context_reset_returns_its_memory(shim):
    p = shim.spawn("procaddr", "init", "alloc:mem:100m", "reset", "wait", CUDA_DEVICE_MEMORY_LIMIT="1g")
    wait_ready(p)
    assert used(shim) == 0
    finish(p)


@pytest.mark.parametrize("mode", MODES)
def test_a_destroyed_context_takes_its_allocations_with_it(shim, mode):
    """The driver frees what was allocated in a context the program made (cuCtxCreate) when it is destroyed,
    without a cuMemFree: five rounds of 300 MiB in a context of its own fit a 1 GiB limit only if the shim
    lets go of each round's allocation (otherwise the third is refused), and the primary context's keep
    counting. The destroyed context's own overhead (NVML's figure shows it while it lives) goes too."""
    r = shim.run(mode, "init", "alloc:mem:100m", *(["ctxcreate", "alloc:mem:300m", "ctxdestroy"] * 5),
                 "meminfo", CUDA_DEVICE_MEMORY_LIMIT="1g")
    assert [a[3] for a in r.find("alloc")] == ["0"] * 6, r
    assert [c[1] for c in r.find("ctxdestroy")] == ["0"] * 5
    free, total = (int(x) for x in r.one("meminfo")[2:4])
    assert total - free == 100 * MiB + CTX


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("abi", ["v2", "v3", "v4"])
def test_a_context_the_program_makes_costs_what_the_driver_takes(shim, mode, abi):
    """cuCtxCreate (each ABI: v3 adds execution affinity, v4 is what CUDA 13's cuCtxCreate means) costs a
    context's memory, as the primary context does, also where NVML's per-process figure is not read
    (tracking only); cuCtxDestroy gives it back with what was allocated in it. Checked against the (fake)
    host view too."""
    p = shim.spawn(mode, "init", f"ctxcreate:0:{abi}", "alloc:mem:100m", "meminfo", "wait",
                   CUDA_DEVICE_MEMORY_LIMIT="1g", HAMID_NVML_RECONCILE="0")
    lines = wait_ready(p)
    inside = used(shim)
    host = {int(ln[1]): int(ln[2]) for ln in shim.run("dlsym", "nvmlprocs", preload=False).find("proc")}
    finish(p)
    assert "ctxcreate 0" in lines, lines
    free, total = (int(x) for x in [ln for ln in lines if ln.startswith("meminfo")][0].split()[2:4])
    assert total - free == inside == host[p.pid] == 2 * CTX + 100 * MiB, (total - free, inside, host)
    r = shim.run(mode, "init", f"ctxcreate:0:{abi}", "alloc:mem:100m", "ctxdestroy", "meminfo",
                 CUDA_DEVICE_MEMORY_LIMIT="1g", HAMID_NVML_RECONCILE="0")
    free, total = (int(x) for x in r.one("meminfo")[2:4])
    assert total - free == CTX, r


def test_a_context_over_the_limit_is_refused_and_nothing_changes(shim):
    """A context that does not fit is CUDA_ERROR_OUT_OF_MEMORY (2), and the program goes on where it was: its
    primary context current, its use unchanged, on the host too."""
    p = shim.spawn("procaddr", "init", "alloc:mem:40m", "ctxcreate", "alloc:mem:10m", "meminfo", "wait",
                   CUDA_DEVICE_MEMORY_LIMIT="100m")
    lines = wait_ready(p)
    host = {int(ln[1]): int(ln[2]) for ln in shim.run("dlsym", "nvmlprocs", preload=False).find("proc")}
    finish(p)
    assert "ctxcreate 2" in lines and "alloc mem 10m 0" in lines, lines
    free, total = (int(x) for x in [ln for ln in lines if ln.startswith("meminfo")][0].split()[2:4])
    assert total - free == host[p.pid] == CTX + 50 * MiB, (total - free, host)


def test_a_first_context_that_only_turns_out_too_big_is_undone(shim):
    """No context measured yet in the container, so the size is known only once the driver made it: over
    the limit, the shim destroys it again and answers CUDA_ERROR_OUT_OF_MEMORY; nothing stays behind."""
    p = shim.spawn("procaddr", "cuinit", "ctxcreate", "meminfo", "wait", CUDA_DEVICE_MEMORY_LIMIT="30m")
    lines = wait_ready(p)
    host = {int(ln[1]): int(ln[2]) for ln in shim.run("dlsym", "nvmlprocs", preload=False).find("proc")}
    inside = used(shim)
    finish(p)
    assert "ctxcreate 2" in lines, lines
    assert host.get(p.pid, 0) == 0 and inside == 0, (host, inside)


def test_cuda_visible_devices_inside_charges_the_right_device(shim):
    env = dict(FAKE_GPU_COUNT="2", CUDA_VISIBLE_DEVICES="1", CUDA_DEVICE_MEMORY_LIMIT_0="4g",
               CUDA_DEVICE_MEMORY_LIMIT_1="1g")
    p = shim.spawn("procaddr", "init", "alloc:mem:600m", "alloc:mem:600m", "wait", **env)
    lines = wait_ready(p)
    allocs = [ln.split()[3] for ln in lines if ln.startswith("alloc")]
    snap = read_region(shim.region)
    finish(p)
    assert allocs == ["0", "2"]  # CUDA ordinal 0 is container device 1, whose limit is 1g
    assert snap.device(1).used_bytes == 600 * MiB + CTX and snap.device(1).uuid.endswith("01")
    assert snap.device(0).used_bytes == 0


@pytest.mark.parametrize("value,expect", [("512m", 512 * MiB), ("1073741824", GiB), ("2G", 2 * GiB), ("3gi", 3 * GiB),
                                          ("010g", 10 * GiB), ("0", 16384 * MiB)])
def test_limit_units(shim, value, expect):
    r = shim.run("direct", "init", "totalmem", CUDA_DEVICE_MEMORY_LIMIT=value)
    assert int(r.one("totalmem")[2]) == expect  # base 10 only: "010g" is 10 GiB, not octal 8


@pytest.mark.parametrize("name,value", [
    ("CUDA_DEVICE_MEMORY_LIMIT", "bogus"), ("CUDA_DEVICE_MEMORY_LIMIT", "0x10g"), ("CUDA_DEVICE_MEMORY_LIMIT", "-1g"),
    ("CUDA_DEVICE_MEMORY_LIMIT", "99999999999t"), ("CUDA_DEVICE_MEMORY_LIMIT_0", "1g2"),
    ("CUDA_DEVICE_SM_LIMIT", "30%"), ("CUDA_DEVICE_SM_LIMIT", "101"), ("CUDA_DEVICE_SM_LIMIT_0", "0x1e"),
    ("HAMID_SM_PERIOD_US", "10"), ("HAMID_SM_AHEAD_US", "lots"), ("HAMID_SM_LIMIT_MODE", "off"),
    ("GPU_CORE_UTILIZATION_POLICY", "maybe"), ("HAMID_CONTEXT_SIZE", "small"), ("HAMID_NVML_RECONCILE", "yes"),
])
@pytest.mark.parametrize("mode", ["direct", "procaddr"])
def test_a_malformed_limit_refuses_cuda(shim, name, value, mode):
    """Fail closed: a limit that cannot be parsed never means "no limit"; CUDA initialisation is refused
    (CUDA_ERROR_NOT_INITIALIZED) with one line naming the variable, and nothing can be allocated."""
    r = shim.run(mode, "init", "alloc:mem:10m", CUDA_DEVICE_MEMORY_LIMIT_1="1g", **{name: value})
    assert r.one("init")[1] == "3", r
    assert r.one("alloc")[3] != "0", r
    assert r.stderr.count("CUDA refused") == 1 and f"{name}={value}" in r.stderr, r.stderr


def test_per_device_limit_wins_over_the_global_one(shim):
    r = shim.run("direct", "init:1", "totalmem:0", "totalmem:1", FAKE_GPU_COUNT="2", CUDA_DEVICE_MEMORY_LIMIT="1g",
                 CUDA_DEVICE_MEMORY_LIMIT_1="2g")
    assert [int(x[2]) for x in r.find("totalmem")] == [GiB, 2 * GiB]


# ---- compute ---------------------------------------------------------------

KERNEL_US = 400


def rate(res) -> float:
    n, ns = res.one("run")[1:3]
    return int(n) / (int(ns) / 1e9)


# The rates below are measured on the stand-in driver's virtual clock (shimharness.py): the same on a busy
# machine as on a quiet one.
@pytest.fixture
def vshim(built, tmp_path) -> Shim:
    return Shim(built, tmp_path, vclock=True)


@pytest.fixture(scope="module")
def bare_rate(built, tmp_path_factory) -> float:
    s = Shim(built, tmp_path_factory.mktemp("bare"), vclock=True)
    return rate(s.run("direct", "init", f"run:1.2:{KERNEL_US}:k", preload=False))


@pytest.mark.parametrize("variant,limit", [("k", 30), ("graph", 30), ("coop", 50), ("ex", 10), ("p", 70)])
def test_compute_share_follows_the_limit(vshim, bare_rate, variant, limit):
    r = vshim.run("direct", "init", f"run:0.3:{KERNEL_US}:{variant}", f"run:1.2:{KERNEL_US}:{variant}",
                 CUDA_DEVICE_SM_LIMIT=str(limit))
    share = rate(type(r)(r.rc, r.lines[-1:], r.stderr)) / bare_rate
    assert abs(share - limit / 100) <= 0.07, (variant, limit, share)
    d = read_region(vshim.region).device(0)
    assert d.sm_limit_percent == limit and d.gpu_time_ns > 0 and d.launches > 0


def _pair_shares(built, tmp_path, bare_rate, env_a: dict, env_b: dict) -> list[float]:
    """Two containers (separate regions) on one fake GPU, started together: their shares of bare."""
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    a, b = Shim(built, tmp_path / "a", vclock=True), Shim(built, tmp_path / "b", vclock=True)
    state = str(tmp_path / "shared_gpu.state")
    pa = a.spawn("direct", "init", "wait", f"run:0.3:{KERNEL_US}:k", f"run:1.5:{KERNEL_US}:k",
                 FAKE_GPU_STATE=state, **env_a)
    pb = b.spawn("direct", "init", "wait", f"run:0.3:{KERNEL_US}:graph", f"run:1.5:{KERNEL_US}:graph",
                 FAKE_GPU_STATE=state, **env_b)
    wait_ready(pa)
    wait_ready(pb)
    for p in (pa, pb):
        p.stdin.write("go\n")
        p.stdin.flush()
    shares = []
    for p in (pa, pb):
        out = finish(p)
        n, ns = out[-1].split()[1:3]
        shares.append(int(n) / (int(ns) / 1e9) / bare_rate)
    return shares


def test_two_containers_30_and_70_share_one_gpu(built, tmp_path, bare_rate):
    shares = _pair_shares(built, tmp_path, bare_rate, {"CUDA_DEVICE_SM_LIMIT": "30"}, {"CUDA_DEVICE_SM_LIMIT": "70"})
    assert abs(shares[0] - 0.30) <= 0.08 and abs(shares[1] - 0.70) <= 0.08, shares


@pytest.mark.parametrize("limit,slots", [(30, "0-30"), (50, "10-35,60-85")])
def test_time_slots_hold_the_share(vshim, bare_rate, limit, slots):
    # the daemon gives each limited container on a GPU its own slots of a 100 ms period
    r = vshim.run("direct", "init", f"run:0.3:{KERNEL_US}:k", f"run:1.2:{KERNEL_US}:k",
                 CUDA_DEVICE_SM_LIMIT=str(limit), HAMID_SM_SLOTS=slots)
    share = rate(type(r)(r.rc, r.lines[-1:], r.stderr)) / bare_rate
    assert abs(share - limit / 100) <= 0.05, (limit, slots, share)
    d = read_region(vshim.region).device(0)
    assert d.throttle_ns > 0
    # the last kernel was queued to end inside one of the slots (period 100 ms)
    at = d.schedule_ns % 100_000_000 / 1e6
    assert any(int(a) <= at <= int(b) for a, b in (x.split("-") for x in slots.split(","))), (at, slots)


def test_two_containers_in_their_own_slots_get_their_limits(built, tmp_path, bare_rate):
    shares = _pair_shares(built, tmp_path, bare_rate, {"CUDA_DEVICE_SM_LIMIT": "30", "HAMID_SM_SLOTS": "0-30"},
                          {"CUDA_DEVICE_SM_LIMIT": "70", "HAMID_SM_SLOTS": "30-100"})
    assert abs(shares[0] - 0.30) <= 0.05 and abs(shares[1] - 0.70) <= 0.05, shares


@pytest.mark.parametrize("bad", ["30-10", "0-30,20-40", "0-101", "abc", "0-30;40-50", "-5-30", "0-30,"])
def test_malformed_slots_refuse_cuda(shim, bad):
    r = shim.run("direct", "init", f"run:0.1:{KERNEL_US}:k", CUDA_DEVICE_SM_LIMIT="30", HAMID_SM_SLOTS=bad)
    assert r.one("init")[1] == "3", r
    assert f"HAMID_SM_SLOTS={bad}" in r.stderr and "0-30,50-70" in r.stderr


def test_no_limit_means_no_limiter_work(vshim, bare_rate):
    r = vshim.run("direct", "init", f"run:0.6:{KERNEL_US}:k", CUDA_DEVICE_MEMORY_LIMIT="1g")
    assert rate(r) / bare_rate > 0.9
    assert read_region(vshim.region).device(0).launches == 0


def test_captured_launches_are_not_throttled(vshim):
    # the kernel's cost is learnt eagerly first, so a charged capture would be held back
    r = vshim.run("direct", "init", "launch:10:2000:k", "capture:200:2000", CUDA_DEVICE_SM_LIMIT="10")
    ok, ok2, ns = r.one("capture")[1:4]
    assert ok == "0" and ok2 == "0" and int(ns) < 200e6  # 0.4 s of work at 10% would take 4 s


def test_observe_mode_charges_without_holding_back(vshim, bare_rate):
    r = vshim.run("direct", "init", f"run:0.6:{KERNEL_US}:k", CUDA_DEVICE_SM_LIMIT="10", HAMID_SM_LIMIT_MODE="observe")
    assert rate(r) / bare_rate > 0.9
    d = read_region(vshim.region).device(0)
    assert d.gpu_time_ns > 0.3e9 and d.throttle_ns == 0


def test_a_slow_first_launch_does_not_skew_the_share(vshim, bare_rate):
    # a real driver's first launch of a kernel is often far slower (lazy loading);
    # the stand-in makes it 50x the kernel's time
    r = vshim.run("direct", "init", f"run:0.3:{KERNEL_US}:k", f"run:1.2:{KERNEL_US}:k",
                 CUDA_DEVICE_SM_LIMIT="10", HAMID_SM_SLOTS="0-10", FAKE_FIRST_LAUNCH_US=str(50 * KERNEL_US))
    share = rate(type(r)(r.rc, r.lines[-1:], r.stderr)) / bare_rate
    assert abs(share - 0.10) <= 0.04, share


def test_a_backlog_from_a_sudden_slowdown_is_not_stacked(vshim):
    # after 100 launches every kernel runs 20x longer, with a launch queue deep
    # enough for seconds of work: the costs charged are far too low for a while,
    # but the next slot waits for the last one's work instead of piling onto it
    slow = 20
    r = vshim.run("direct", "init", f"run:2.5:{KERNEL_US}:k", CUDA_DEVICE_SM_LIMIT="10", HAMID_SM_SLOTS="0-10",
                 FAKE_SLOW_AFTER=f"100:{slow}", FAKE_QUEUE_MS="5000")
    n, ns = map(int, r.one("run")[1:3])
    assert n > 100, n
    gpu_s = (100 * KERNEL_US + (n - 100) * KERNEL_US * slow) / 1e6
    share = gpu_s / (ns / 1e9)
    assert share <= 0.10 + 0.10, (n, share)


def test_the_rate_limit_follows_a_kernel_that_slows_down(vshim):
    # a power-capped GPU lowers its clocks once warm: after 300 launches every
    # kernel runs 1.8x longer. The estimates must follow within a fraction of
    # a second (a sliding window, a sample at least every 20 ms), or the share
    # runs over the limit for as long as stale estimates last.
    slow, first = 1.8, 300
    r = vshim.run("direct", "init", f"run:2.5:{KERNEL_US}:k", CUDA_DEVICE_SM_LIMIT="50", FAKE_SLOW_AFTER=f"{first}:{slow}")
    n, ns = map(int, r.one("run")[1:3])
    assert n > first, n
    gpu_s = (first * KERNEL_US + (n - first) * KERNEL_US * slow) / 1e6
    share = gpu_s / (ns / 1e9)
    assert abs(share - 0.50) <= 0.05, (n, share)  # 0.59 with estimates renewed once per 8 samples of 1 in 64


@pytest.mark.parametrize("limit", [30, 60])
def test_a_launchs_own_cpu_time_is_not_charged_as_gpu_time(vshim, limit):
    # each launch costs the CPU 40 us before the GPU sees its 100 us kernel.
    # On a GPU left idle by the limit, a sample's first event completes at
    # once and the kernel comes 40 us later: charged as GPU time, the share
    # falls to 0.21 at 30 and 0.43 at 60 (measured before the correction).
    bare = rate(vshim.run("direct", "init", "run:1.0:100:k", preload=False, FAKE_LAUNCH_US="40"))
    r = vshim.run("direct", "init", "run:0.3:100:k", "run:1.5:100:k", CUDA_DEVICE_SM_LIMIT=str(limit),
                 FAKE_LAUNCH_US="40")
    share = rate(type(r)(r.rc, r.lines[-1:], r.stderr)) / bare
    # 0.07: the two rates are measured in separate processes on a shared CPU (0.654 seen at 60 under
    # load); the defect this catches is 0.21 / 0.43. Above the limit, also the burst credit: a launcher
    # the loaded CPU stalls is light for a moment and earns up to 500 ms of GPU time (limiter.c
    # CREDIT_NS), which 1.5 s may spend (0.403 at 30 seen in a fresh-clone CI run with 250 ms)
    assert limit / 100 - 0.07 <= share <= limit / 100 + 0.07 + 0.5 / 1.5, share


@pytest.mark.parametrize("limit", [30, 60])
def test_a_kernel_running_while_its_closing_event_is_recorded_is_charged(vshim, limit):
    # each launch costs the CPU 40 us before the GPU sees its 100 us kernel, and recording an event 60 us:
    # on a GPU left idle by the limit the kernel runs on while the sample's closing event is being recorded.
    # Only the launch call itself may be latency; counting the record's time too charged the kernel 40 of
    # its 100 us and held the share at 0.75 of the GPU under a 30 % limit. The monitor is off: a container
    # that never runs alone learns no correction (limiter.c, k_gap/k_all), its per-launch costs are all it has
    bare = rate(vshim.run("direct", "init", "run:1.0:100:k", preload=False, FAKE_LAUNCH_US="40"))
    r = vshim.run("direct", "init", "run:0.3:100:k", "run:1.5:100:k", CUDA_DEVICE_SM_LIMIT=str(limit),
                 FAKE_LAUNCH_US="40", FAKE_RECORD_US="60", HAMID_SHIM_NO_MONITOR="1")
    share = rate(type(r)(r.rc, r.lines[-1:], r.stderr)) / bare
    # the tolerance and the credit as in test_a_launchs_own_cpu_time_is_not_charged_as_gpu_time
    assert limit / 100 - 0.07 <= share <= limit / 100 + 0.07 + 0.5 / 1.5, share


@pytest.mark.parametrize("limit", [30, 60])
def test_one_shape_running_work_of_many_sizes_is_charged_its_mean(vshim, limit):
    # a persistent kernel (one function, one grid) whose work runs 50..450 us by its argument, as cuBLAS's
    # GEMMs of dynamic-shape inference do on Hopper: charged its fastest size (the estimate anchored at the
    # window's minimum, as before), it ran at 0.58 of its real cost on the H100 and past the limit here
    r = vshim.run("direct", "init", "persist:0.4:50:450", "persist:1.5:50:450", CUDA_DEVICE_SM_LIMIT=str(limit),
                 HAMID_SHIM_NO_MONITOR="1")
    n, ns, work_us = map(int, r.find("persist")[-1][1:4])
    share = work_us * 1e3 / ns
    assert n > 100, n
    assert limit / 100 - 0.05 <= share <= limit / 100 + 0.05 + 0.25 / 1.5, (n, share)


def test_waiting_for_a_backlog_is_bounded(vshim):
    # after 50 launches each kernel runs 500x longer (200 ms): one slot's 25
    # launches leave 5 s of work queued. Waiting on that backlog must give
    # up after two periods (a queued kernel may be waiting for work this thread
    # has yet to launch), so launches go on instead of stalling for seconds
    r = vshim.run("direct", "init", f"run:2.5:{KERNEL_US}:k", CUDA_DEVICE_SM_LIMIT="10", HAMID_SM_SLOTS="0-10",
                 FAKE_SLOW_AFTER="50:500", FAKE_QUEUE_MS="60000", timeout=60)
    n, longest = int(r.one("run")[1]), int(r.one("run")[3]) / 1e9
    # bounded: two periods of patience plus at most one period to the next
    # slot (0.3 s); unbounded, the launch after the backlog waits out its 5 s.
    # (A count of launches would not tell: a loaded CPU fits fewer of them
    # into the slot that builds the backlog.)
    assert n > 50 + 1 and longest < 1.0, (n, longest)


# ---- the cost table and the launch path's locks ---------------------------------

@pytest.mark.parametrize("shapes", [2, 300])
def test_colliding_shapes_are_charged_like_any_other(vshim, bare_rate, shapes):
    """Shapes of one kernel whose keys land on the same entry of a direct-mapped table (the same low 12 bits),
    launched in turn, hundreds of them (dynamic shapes: LLM decode, variable batch): each launch is charged, so
    the share stays within 5 points of the limit. A table that resets an entry on a collision never charges
    them (100 % of the GPU under a 30 % limit)."""
    r = vshim.run("direct", "init", f"collide:{shapes}:{KERNEL_US}:0.3", f"collide:{shapes}:{KERNEL_US}:1.2",
                 CUDA_DEVICE_SM_LIMIT="30")
    share = rate(type(r)(r.rc, r.lines[-1:], r.stderr)) / bare_rate
    assert abs(share - 0.30) <= 0.05, (shapes, share)


def test_a_blocked_event_record_does_not_stop_other_threads(vshim):
    """One thread's event record blocks for 1.5 s (a full launch queue on its stream); another thread, launching
    on its own stream, must not wait for it: no lock is held across a driver call on the launch path."""
    r = vshim.run("direct", "init", "stall:2.0", CUDA_DEVICE_SM_LIMIT="90")
    n, longest = (int(x) for x in r.one("stall")[1:3])
    assert n > 20 and longest < 0.3e9, (n, longest / 1e9)


def test_the_region_file_is_the_containers_alone(shim, tmp_path):
    """The region is writable by no other user: created 0600 (inside the container's own 0700 directory, which
    the daemon makes), an older shim's world-writable one of ours is tightened, and a symbolic link at its path
    is never followed."""
    env = dict(CUDA_DEVICE_MEMORY_LIMIT="1g")
    assert shim.run("procaddr", "init", "alloc:mem:10m", **env).one("alloc")[3] == "0"
    assert shim.region.stat().st_mode & 0o777 == 0o600
    os.chmod(shim.region, 0o666)
    assert shim.run("procaddr", "init", "alloc:mem:10m", **env).one("alloc")[3] == "0"
    assert shim.region.stat().st_mode & 0o777 == 0o600
    target, link = tmp_path / "elsewhere", tmp_path / "link.cache"
    target.write_bytes(b"not a region")
    link.symlink_to(target)
    r = shim.run("procaddr", "init", "alloc:mem:10m", CUDA_DEVICE_MEMORY_SHARED_CACHE=str(link), **env)
    assert r.one("alloc")[3] == "0" and target.read_bytes() == b"not a region"
