"""Harness for the shim's CPU tests (tests/shim/conftest.py exposes it as fixtures).

Owns building, once per session and into a temporary directory, the honest
stand-ins the tests run against: a fake libcuda.so.1 and libnvidia-ml.so.1
(tests/shim/csrc/fake_*.c, NOT NVIDIA's libraries: a simulated GPU kept in a
state file), the test program shimtest in its three linking modes, and the
small libraries for the dlsym tests; plus a runner that starts shimtest under
LD_PRELOAD=libvgpu.so with a fresh fake GPU and region per test.

A runner made with vclock=True runs on the stand-in driver's virtual clock
(FAKE_VCLOCK=1, tests/shim/csrc/fake_state.h) with a test build of the shim
that reads time and sleeps through it (-DHAMID_TEST_CLOCK, shim/src/clock.c):
the rate tests measure simulated time, not the machine's, so a busy machine
neither slows them nor moves their results (the same run gives the same
numbers, to the launch). A thread blocked on anything but the clock (stdin, a
lock) holds simulated time still, and so does a thread of the process that
has yet to read the clock (so that one just started is not left behind): a
shim that slept holding a lock another thread waits for, or started a thread
that never reads the clock, would hang, and the runner's timeout fails the
test.
"""

from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SHIM_DIR = ROOT / "shim"
CSRC = Path(__file__).resolve().parent / "csrc"
CFLAGS = ["-O1", "-g", "-Wall", "-Wno-unused-parameter", "-Werror", f"-I{SHIM_DIR / 'include'}", f"-I{CSRC}"]


def _cc(*args: str) -> None:
    subprocess.run(["gcc", *args], check=True, capture_output=True, text=True)


@dataclass
class Built:
    libdir: Path
    shim: Path
    shimtest: Path
    unrelated: Path
    next_a: Path
    shim_limits: Path  # a test build of the shim that reads its limits file at limits_path (test clock too)
    limits_path: Path
    limitsdump: Path  # the shim's own limits reader (shim/src/limits.c), printing what it read
    mps_pipe: Path  # the test build's HAMID_MPS_PIPE_DIR
    shim_vclock: Path  # a test build of the shim on the stand-in driver's clock (HAMID_TEST_CLOCK)


def build_all(tmp_path_factory) -> Built:
    subprocess.run(["make", "-s", "-C", str(SHIM_DIR)], check=True, capture_output=True, text=True)
    shim = (SHIM_DIR / "build" / "libvgpu.so").resolve()
    d = tmp_path_factory.mktemp("fakedriver")
    _cc(*CFLAGS, "-shared", "-fPIC", "-fvisibility=hidden", "-Wl,-soname,libcuda.so.1",
        "-o", str(d / "libcuda.so.1"), str(CSRC / "fake_cuda.c"), "-ldl", "-lpthread")
    _cc(*CFLAGS, "-shared", "-fPIC", "-fvisibility=hidden", "-Wl,-soname,libnvidia-ml.so.1",
        "-o", str(d / "libnvidia-ml.so.1"), str(CSRC / "fake_nvml.c"))
    _cc(*CFLAGS, "-o", str(d / "shimtest"), str(CSRC / "shimtest.c"), f"-L{d}", "-l:libcuda.so.1",
        "-l:libnvidia-ml.so.1", "-ldl", "-lpthread", f"-Wl,-rpath,{d}")
    _cc(*CFLAGS, "-shared", "-fPIC", "-o", str(d / "libfake_unrelated.so"), str(CSRC / "fake_unrelated.c"))
    _cc(*CFLAGS, "-shared", "-fPIC", "-o", str(d / "libnext_b.so"), str(CSRC / "next_b.c"))
    _cc(*CFLAGS, "-shared", "-fPIC", "-o", str(d / "libnext_a.so"), str(CSRC / "next_a.c"),
        f"-L{d}", "-Wl,--no-as-needed", "-l:libnext_b.so", f"-Wl,-rpath,{d}", "-ldl")
    limits_path = d / "limits" / "hamid.limits"
    limits_path.parent.mkdir()
    mps_pipe = d / "mpspipe"  # where the test build looks for an MPS share's control socket
    mps_pipe.mkdir()
    define = (f"EXTRA_CFLAGS=-DHAMID_LIMITS_PATH='\"{limits_path}\"' -DHAMID_MPS_PIPE_DIR='\"{mps_pipe}\"' "
              "-DHAMID_TEST_CLOCK")
    subprocess.run(["make", "-s", "-C", str(SHIM_DIR), f"BUILD={d / 'shimbuild'}", define], check=True,
                   capture_output=True, text=True)
    subprocess.run(["make", "-s", "-C", str(SHIM_DIR), f"BUILD={d / 'shimvclock'}", "EXTRA_CFLAGS=-DHAMID_TEST_CLOCK"],
                   check=True, capture_output=True, text=True)
    _cc(*CFLAGS, f"-I{SHIM_DIR / 'src'}", f"-DHAMID_LIMITS_PATH=\"{limits_path}\"", "-DHAMID_SHIM_VERSION=\"test\"",
        "-o", str(d / "limitsdump"), str(CSRC / "limitsdump.c"), str(SHIM_DIR / "src" / "limits.c"))
    return Built(d, shim, d / "shimtest", d / "libfake_unrelated.so", d / "libnext_a.so",
                 (d / "shimbuild" / "libvgpu.so").resolve(), limits_path, d / "limitsdump", mps_pipe,
                 (d / "shimvclock" / "libvgpu.so").resolve())


@dataclass
class Result:
    rc: int
    lines: list[str]
    stderr: str

    def find(self, word: str) -> list[list[str]]:
        return [ln.split() for ln in self.lines if ln.split() and ln.split()[0] == word]

    def one(self, word: str) -> list[str]:
        got = self.find(word)
        assert got, f"no {word!r} line in {self.lines}\nstderr: {self.stderr}"
        return got[0]


@dataclass
class Shim:
    built: Built
    tmp: Path
    env: dict[str, str] = field(default_factory=dict)
    vclock: bool = False  # on the stand-in driver's virtual clock (see the module docstring)

    @property
    def region(self) -> Path:
        return self.tmp / "region.cache"

    @property
    def state(self) -> Path:
        return self.tmp / "fake_gpu.state"

    def environ(self, preload: bool = True, **extra: str) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("CUDA_", "HAMID_", "LIBCUDA_", "FAKE_"))}
        env.update(
            LD_LIBRARY_PATH=str(self.built.libdir),
            FAKE_GPU_STATE=str(self.state),
            CUDA_DEVICE_MEMORY_SHARED_CACHE=str(self.region),
        )
        if preload:
            env["LD_PRELOAD"] = str(self.built.shim_vclock if self.vclock else self.built.shim)
        if self.vclock:
            env["FAKE_VCLOCK"] = "1"
        env.update(self.env)
        env.update(extra)
        return env

    def run(self, mode: str, *cmds: str, preload: bool = True, timeout: float = 30, **extra: str) -> Result:
        p = subprocess.run([str(self.built.shimtest), mode, *cmds], env=self.environ(preload, **extra),
                           capture_output=True, text=True, timeout=timeout)
        return Result(p.returncode, p.stdout.splitlines(), p.stderr)

    def spawn(self, mode: str, *cmds: str, preload: bool = True, **extra: str) -> subprocess.Popen:
        return subprocess.Popen([str(self.built.shimtest), mode, *cmds], env=self.environ(preload, **extra),
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def wait_ready(p: subprocess.Popen) -> list[str]:
    """Read a spawned shimtest's lines up to its 'ready'."""
    lines = []
    while True:
        ln = p.stdout.readline()
        assert ln, f"process ended before 'ready': {lines} {p.stderr.read()}"
        lines.append(ln.strip())
        if ln.strip() == "ready":
            return lines


def finish(p: subprocess.Popen, timeout: float = 30) -> list[str]:
    out, _ = p.communicate("go\n", timeout=timeout)
    return out.splitlines()


def forged_region(claimed: list[int]) -> bytes:
    """A well-formed region (the reader's own layout) whose process table claims ``claimed`` as its active
    processes on device 0, by pid and NVML pid: what a container can write into its own region."""
    from hamid.shimregion.reader import _consts, _ffi, region_struct_size

    ffi, c = _ffi(), _consts()
    buf = bytearray(region_struct_size())
    r = ffi.from_buffer("struct hamid_region *", buf)
    r.magic, r.abi_version, r.struct_size = c["HAMID_REGION_MAGIC"], c["HAMID_REGION_ABI_VERSION"], len(buf)
    r.device_count, r.max_procs = 1, c["HAMID_MAX_PROCS"]
    claimed = claimed[:c["HAMID_MAX_PROCS"]]
    for i, pid in enumerate(claimed):
        r.procs[i].pid = r.procs[i].nvml_pid = pid
        r.procs[i].flags = 1  # active
        r.procs[i].used[0] = 64 << 20  # on device 0
    r.proc_high_water = len(claimed)
    ffi.release(r)
    return bytes(buf)


def claim_in_region(path: Path, pids: list[int]) -> None:
    """Writes into a live region, in place (the shim has it mapped), active process entries claiming ``pids``
    by pid and NVML pid, after the ones in use: what a container's own process can do to its region."""
    from hamid.shimregion.reader import _ffi

    ffi = _ffi()
    buf = bytearray(Path(path).read_bytes())
    r = ffi.from_buffer("struct hamid_region *", buf)
    at = int(r.proc_high_water)
    for i, pid in enumerate(pids, start=at):
        r.procs[i].pid = r.procs[i].nvml_pid = pid
        r.procs[i].flags = 1
        r.procs[i].used[0] = 64 << 20
    r.proc_high_water = at + len(pids)
    ffi.release(r)
    fd = os.open(path, os.O_WRONLY)
    try:
        os.pwrite(fd, bytes(buf), 0)
    finally:
        os.close(fd)
