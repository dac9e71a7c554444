"""The limits file's bytes, through cffi on the shim's own header.

Owns: locating hamid_limits.h (the same file the shim is compiled from),
the dataclasses the daemon fills in, checking every value against what the
shim accepts (errors name the bad value and what is accepted), and encoding
to / decoding from exactly ``sizeof(struct hamid_limits)`` bytes. Must not
touch the filesystem beyond reading the header (writer.py writes).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Literal

import cffi

from hamid.errors import HamidError

_HERE = Path(__file__).resolve().parent
_HEADER_CANDIDATES = (
    Path(__file__).parent / "hamid_limits.h",  # packaged copy (a symlink in the source tree)
    _HERE.parent.parent / "shim" / "include" / "hamid_limits.h",  # source checkout
)

SmMode = Literal["enforce", "observe"]
_SM_MODES: dict[str, int] = {"enforce": 0, "observe": 1}
# GPU_CORE_UTILIZATION_POLICY, HAMi's meaning: default limits only while another container shares the GPU,
# force always, disable never. HAMi's chart default is default.
SmPolicy = Literal["default", "force", "disable"]
SM_POLICIES: dict[str, int] = {"default": 0, "force": 1, "disable": 2}
_UUID_RE = re.compile(r"[\x21-\x7e]+")  # printable ASCII, no spaces


class LimitsFormatError(HamidError):
    """Limits that the file cannot hold, or bytes that are not a limits file this reader knows."""


@dataclass(frozen=True)
class DeviceLimits:
    uuid: str
    memory_bytes: int = 0  # 0: no memory limit
    sm_percent: int = 0  # 0: no compute limit; 1..99 limited
    slots: tuple[tuple[int, int], ...] = ()  # percent ranges of the period, sorted, disjoint


@dataclass(frozen=True)
class ContainerLimits:
    devices: tuple[DeviceLimits, ...]
    region_path: str  # the region file's path inside the container
    priority: int | None = None
    sm_mode: SmMode = "enforce"  # "observe": charge and count, never hold a launch back
    sm_period_us: int = 100_000  # the limiter's period; slots are parts of it
    sm_policy: SmPolicy = "default"  # HAMi's chart default; ABI 1 files (no field) meant force
    mps: bool = False  # an MPS client share: one device, its sm_percent is the active thread percentage


def header_path() -> Path:
    for p in _HEADER_CANDIDATES:
        if p.is_file():
            return p
    raise LimitsFormatError(f"hamid_limits.h not found (looked in {', '.join(map(str, _HEADER_CANDIDATES))})")


@lru_cache(maxsize=1)
def _ffi() -> cffi.FFI:
    text = header_path().read_text()
    m = re.search(r"/\* HAMID_CDEF_BEGIN \*/(.*?)/\* HAMID_CDEF_END \*/", text, re.S)
    if not m:
        raise LimitsFormatError(f"{header_path()} has no HAMID_CDEF_BEGIN/END block")
    ffi = cffi.FFI()
    ffi.cdef(m.group(1))
    return ffi


@lru_cache(maxsize=1)
def _consts() -> dict[str, int]:
    lib = _ffi().dlopen(None)
    names = ("HAMID_LIMITS_MAGIC", "HAMID_LIMITS_ABI_VERSION", "HAMID_LIMITS_ABI_MIN", "HAMID_LIMITS_MAX_DEVICES",
             "HAMID_LIMITS_MAX_HOLD",
             "HAMID_LIMITS_MAX_SLOTS", "HAMID_LIMITS_UUID_LEN", "HAMID_LIMITS_PATH_LEN", "HAMID_LIMITS_FLAG_PRIORITY",
             "HAMID_LIMITS_FLAG_MPS", "HAMID_LIMITS_SHARE_MIN", "HAMID_LIMITS_SHARE_MAX",
             "HAMID_LIMITS_ACTIVE_WINDOW_S")
    return {n: int(getattr(lib, n)) for n in names}


def limits_size() -> int:
    """The file's exact size in bytes."""
    return _ffi().sizeof("struct hamid_limits")


def _int(what: str, v: object, lo: int, hi: int, note: str = "") -> int:
    if isinstance(v, bool) or not isinstance(v, int):
        raise LimitsFormatError(f"{what}={v!r}: expected an integer {lo}..{hi}{note}")
    if not lo <= v <= hi:
        raise LimitsFormatError(f"{what}={v}: expected {lo}..{hi}{note}")
    return v


def _check_slots(what: str, slots: object, max_slots: int) -> tuple[tuple[int, int], ...]:
    form = "sorted, disjoint (start, end) percent ranges with 0 <= start < end <= 100"
    if not isinstance(slots, (tuple, list)):
        raise LimitsFormatError(f"{what}={slots!r}: expected {form}")
    if len(slots) > max_slots:
        raise LimitsFormatError(f"{what}: {len(slots)} slots, at most {max_slots} are accepted")
    out = []
    prev_end = 0
    for s in slots:
        if (not isinstance(s, (tuple, list)) or len(s) != 2
                or any(isinstance(x, bool) or not isinstance(x, int) for x in s)):
            raise LimitsFormatError(f"{what}: slot {s!r} is not a (start, end) pair of integers; expected {form}")
        a, b = s
        if not (0 <= a < b <= 100) or a < prev_end:
            raise LimitsFormatError(f"{what}: slot {a}-{b} in {slots!r}; expected {form}")
        out.append((a, b))
        prev_end = b
    return tuple(out)


def validate(limits: ContainerLimits) -> None:
    """Raise LimitsFormatError naming the first value the file (or the shim) would not accept."""
    c = _consts()
    if not isinstance(limits, ContainerLimits):
        raise LimitsFormatError(f"expected ContainerLimits, got {type(limits).__name__}")
    devs = limits.devices
    if not isinstance(devs, (tuple, list)):
        raise LimitsFormatError(f"devices={devs!r}: expected a tuple of DeviceLimits")
    if len(devs) > c["HAMID_LIMITS_MAX_DEVICES"]:
        raise LimitsFormatError(f"{len(devs)} devices: at most {c['HAMID_LIMITS_MAX_DEVICES']} are accepted")
    for i, d in enumerate(devs):
        w = f"devices[{i}]"
        if not isinstance(d, DeviceLimits):
            raise LimitsFormatError(f"{w}: expected DeviceLimits, got {type(d).__name__}")
        ulen = c["HAMID_LIMITS_UUID_LEN"] - 1
        if not isinstance(d.uuid, str) or not _UUID_RE.fullmatch(d.uuid) or len(d.uuid) > ulen:
            raise LimitsFormatError(f"{w}.uuid={d.uuid!r}: expected 1..{ulen} printable ASCII characters "
                                    "(a GPU or MIG UUID as NVML prints it)")
        _int(f"{w}.memory_bytes", d.memory_bytes, 0, 2**64 - 1, " (0: no limit)")
        _int(f"{w}.sm_percent", d.sm_percent, 0, 99, " (0: no compute limit)")
        slots = _check_slots(f"{w}.slots", d.slots, c["HAMID_LIMITS_MAX_SLOTS"])
        if slots and not d.sm_percent:
            raise LimitsFormatError(f"{w}.slots={d.slots!r}: time slots need a compute limit (sm_percent 1..99)")
    rp = limits.region_path
    plen = c["HAMID_LIMITS_PATH_LEN"] - 1
    if not isinstance(rp, str) or not rp.startswith("/") or "\x00" in rp or len(rp.encode()) > plen:
        raise LimitsFormatError(f"region_path={rp!r}: expected an absolute path of at most {plen} bytes, no NUL")
    if limits.priority is not None:
        _int("priority", limits.priority, -(2**31), 2**31 - 1, " or None (unset)")
    if limits.sm_policy not in SM_POLICIES:
        raise LimitsFormatError(f"sm_policy={limits.sm_policy!r}: expected one of {', '.join(SM_POLICIES)}")
    if limits.sm_mode not in _SM_MODES:
        raise LimitsFormatError(f"sm_mode={limits.sm_mode!r}: expected one of {', '.join(_SM_MODES)}")
    _int("sm_period_us", limits.sm_period_us, 1000, 10_000_000)
    if not isinstance(limits.mps, bool):
        raise LimitsFormatError(f"mps={limits.mps!r}: expected True or False")
    if limits.mps and (len(devs) != 1 or devs[0].slots):
        raise LimitsFormatError(f"mps=True with {len(devs)} device(s): an MPS share has exactly one device and "
                                "no time slots")


def encode(limits: ContainerLimits) -> bytes:
    """The file's bytes for `limits` (validated first)."""
    validate(limits)
    ffi, c = _ffi(), _consts()
    buf = ffi.new("struct hamid_limits *")  # zeroed: every reserved byte is 0
    buf.magic = c["HAMID_LIMITS_MAGIC"]
    buf.abi_version = c["HAMID_LIMITS_ABI_VERSION"]
    buf.struct_size = limits_size()
    buf.device_count = len(limits.devices)
    if limits.priority is not None:
        buf.flags |= c["HAMID_LIMITS_FLAG_PRIORITY"]
        buf.priority = limits.priority
    if limits.mps:
        buf.flags |= c["HAMID_LIMITS_FLAG_MPS"]
    buf.sm_mode = _SM_MODES[limits.sm_mode]
    buf.sm_policy = SM_POLICIES[limits.sm_policy]
    buf.sm_period_us = limits.sm_period_us
    buf.region_path = limits.region_path.encode()
    for i, d in enumerate(limits.devices):
        dv = buf.devices[i]
        dv.uuid = d.uuid.encode("ascii")
        dv.memory_bytes = d.memory_bytes
        dv.sm_percent = d.sm_percent
        dv.nslots = len(d.slots)
        for j, (a, b) in enumerate(d.slots):
            dv.slots[j][0] = a
            dv.slots[j][1] = b
    return bytes(ffi.buffer(buf))


def decode(data: bytes) -> ContainerLimits:
    """Parse and check a limits file's bytes; LimitsFormatError names what is wrong."""
    ffi, c = _ffi(), _consts()
    size = limits_size()
    if len(data) != size:
        raise LimitsFormatError(f"{len(data)} bytes: a limits file is exactly {size} bytes")
    buf = ffi.new("struct hamid_limits *")
    ffi.memmove(buf, data, size)
    if buf.magic != c["HAMID_LIMITS_MAGIC"]:
        raise LimitsFormatError(f"bad magic {buf.magic:#x}: expected {c['HAMID_LIMITS_MAGIC']:#x}")
    if not c["HAMID_LIMITS_ABI_MIN"] <= buf.abi_version <= c["HAMID_LIMITS_ABI_VERSION"] or buf.struct_size != size:
        raise LimitsFormatError(f"ABI {buf.abi_version} of {buf.struct_size} bytes: this reader knows ABI "
                                f"{c['HAMID_LIMITS_ABI_MIN']}..{c['HAMID_LIMITS_ABI_VERSION']} of {size} bytes")
    policies = {v: k for k, v in SM_POLICIES.items()}
    if buf.abi_version < 2:
        policy = "force"  # ABI 1 shims limited always
    elif buf.sm_policy in policies:
        policy = policies[buf.sm_policy]
    else:
        raise LimitsFormatError(f"sm_policy {buf.sm_policy}: expected one of {sorted(policies)}")
    n = buf.device_count
    if n > c["HAMID_LIMITS_MAX_DEVICES"]:
        raise LimitsFormatError(f"device_count {n}: at most {c['HAMID_LIMITS_MAX_DEVICES']}")
    if buf.flags & ~(c["HAMID_LIMITS_FLAG_PRIORITY"] | c["HAMID_LIMITS_FLAG_MPS"]):
        raise LimitsFormatError(f"flags {buf.flags:#x}: unknown bits")
    modes = {v: k for k, v in _SM_MODES.items()}
    if buf.sm_mode not in modes:
        raise LimitsFormatError(f"sm_mode {buf.sm_mode}: expected one of {sorted(modes)}")

    def cstr(field, what: str) -> str:
        raw = bytes(ffi.buffer(field))
        if b"\x00" not in raw:
            raise LimitsFormatError(f"{what} is not NUL-terminated")
        try:
            return raw.split(b"\x00", 1)[0].decode("utf-8")
        except UnicodeDecodeError as e:
            raise LimitsFormatError(f"{what} is not UTF-8: {e}") from None

    devices = []
    for i in range(n):
        dv = buf.devices[i]
        if dv.nslots > c["HAMID_LIMITS_MAX_SLOTS"]:
            raise LimitsFormatError(f"devices[{i}].nslots {dv.nslots}: at most {c['HAMID_LIMITS_MAX_SLOTS']}")
        devices.append(DeviceLimits(
            uuid=cstr(dv.uuid, f"devices[{i}].uuid"),
            memory_bytes=int(dv.memory_bytes),
            sm_percent=int(dv.sm_percent),
            slots=tuple((int(dv.slots[j][0]), int(dv.slots[j][1])) for j in range(dv.nslots)),
        ))
    out = ContainerLimits(
        devices=tuple(devices),
        region_path=cstr(buf.region_path, "region_path"),
        priority=int(buf.priority) if buf.flags & c["HAMID_LIMITS_FLAG_PRIORITY"] else None,
        sm_mode=modes[buf.sm_mode],  # type: ignore[arg-type]
        sm_period_us=int(buf.sm_period_us),
        sm_policy=policy,  # type: ignore[arg-type]
        mps=bool(buf.flags & c["HAMID_LIMITS_FLAG_MPS"]),
    )
    validate(out)
    return out


def hold_pids_offset(device: int) -> int:
    """Where device ``device``'s live hold_pids (HAMID_LIMITS_MAX_HOLD int32) start in the file."""
    ffi, c = _ffi(), _consts()
    if not 0 <= device < c["HAMID_LIMITS_MAX_DEVICES"]:
        raise LimitsFormatError(f"device {device}: expected 0..{c['HAMID_LIMITS_MAX_DEVICES'] - 1}")
    return (ffi.offsetof("struct hamid_limits", "devices") + device * ffi.sizeof("struct hamid_limits_device")
            + ffi.offsetof("struct hamid_limits_device", "hold_pids"))


def max_hold() -> int:
    return _consts()["HAMID_LIMITS_MAX_HOLD"]


def share_offset(device: int) -> int:
    """Where device ``device``'s live share_milli (uint32, ABI 3) is in the file."""
    hold_pids_offset(device)  # checks the index
    ffi = _ffi()
    return (ffi.offsetof("struct hamid_limits", "devices") + device * ffi.sizeof("struct hamid_limits_device")
            + ffi.offsetof("struct hamid_limits_device", "share_milli"))


def others_offset(device: int) -> int:
    """Where device ``device``'s live others_active (uint32, ABI 4) is in the file."""
    hold_pids_offset(device)  # checks the index
    ffi = _ffi()
    return (ffi.offsetof("struct hamid_limits", "devices") + device * ffi.sizeof("struct hamid_limits_device")
            + ffi.offsetof("struct hamid_limits_device", "others_active"))


def active_window_s() -> int:
    """How long after its last kernels another container counts as active (HAMi's recent_kernel window)."""
    return _consts()["HAMID_LIMITS_ACTIVE_WINDOW_S"]


def share_range() -> tuple[int, int]:
    """The share_milli values a shim accepts besides 0 (none), inclusive."""
    c = _consts()
    return c["HAMID_LIMITS_SHARE_MIN"], c["HAMID_LIMITS_SHARE_MAX"]
