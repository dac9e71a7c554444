"""A Docker container's ``HAMI_VISIBLE_DEVICES`` and ``HAMI_VGPU_SPEC``.

``HAMI_VISIBLE_DEVICES`` names the GPUs the container may use::

    0            one GPU by index
    0,2          several
    0-3          a range (inclusive)
    GPU-<uuid>   by UUID (mixable with indexes)
    all          every GPU of the node

``HAMI_VGPU_SPEC`` says how much of each, as comma-separated items::

    mem=4g       memory per GPU: MiB (mem=4096) or with a unit (512m, 4g)
    mem=25%      memory as a percent of each card
    cores=30     percent of each GPU's compute (100 = exclusive)
    gpus=2       how many of the visible GPUs to use (default: all listed)
    1g.10gb      a MIG profile (MIG mode; checked against the GPU's table)
    mode=mig     MIG with the smallest profile that holds mem=
    priority=1   0 high, 1 low (passed to the shim)

Either variable alone is enough: a spec without visible devices may use any
GPU of the node (``gpus=`` of them, default 1); visible devices without a
spec get those GPUs whole and exclusive. Neither: the container is not ours.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping

from .model import MODES, ContainerRequest, Defaults, GpuRequest, Request, RequestError
from .quantity import SIZE_FORMS, parse_size_mib

ENV_DEVICES = "HAMI_VISIBLE_DEVICES"
ENV_SPEC = "HAMI_VGPU_SPEC"

VISIBLE_DEVICES_FORMS = "an index (0), a list (0,2), a range (0-3), GPU UUIDs (GPU-...), or all"
VGPU_SPEC_FORMS = (
    "comma-separated items: mem=<MiB or size such as 512m, 4g> | mem=<1-100>% | cores=<0-100> | "
    "gpus=<1-64> | mode=hami-core|mig | priority=0|1 | a MIG profile such as 1g.10gb or 3g.40gb"
)

_UUID = re.compile(r"^GPU-[0-9a-fA-F]{8}(-[0-9a-fA-F]{4}){3}-[0-9a-fA-F]{12}$")
_PROFILE = re.compile(r"^[1-8]g\.\d{1,3}gb(\+me)?$")
_INT = re.compile(r"^\d{1,6}$")
_MAX_INDEX = 63


def _env_map(env: Mapping[str, str] | Iterable[str]) -> dict[str, str]:
    if isinstance(env, Mapping):
        return {str(k): str(v) for k, v in env.items()}
    out: dict[str, str] = {}
    for item in env:
        k, sep, v = str(item).partition("=")
        if sep:
            out[k] = v  # the last occurrence wins, as in execve's environment
    return out


def parse_visible_devices(text: str) -> tuple[str, ...]:
    """To a tuple of selectors: indexes as decimal strings, UUIDs, or ("all",)."""
    raw = text.strip()
    if raw.lower() == "all":
        return ("all",)
    out: list[str] = []
    for part in raw.split(","):
        part = part.strip()
        if not part:
            raise RequestError(f"{ENV_DEVICES}={text!r}: empty entry; accepted: {VISIBLE_DEVICES_FORMS}")
        if _UUID.match(part):
            sel = [part]
        elif _INT.match(part):
            sel = [str(int(part))]
        elif "-" in part and all(_INT.match(x) for x in part.split("-", 1)):
            lo, hi = (int(x) for x in part.split("-", 1))
            if lo > hi:
                raise RequestError(f"{ENV_DEVICES}={text!r}: range {part!r} runs backwards; write {hi}-{lo}")
            if hi > _MAX_INDEX:
                raise RequestError(f"{ENV_DEVICES}={text!r}: index {hi} in {part!r} is above {_MAX_INDEX}")
            sel = [str(i) for i in range(lo, hi + 1)]
        else:
            raise RequestError(f"{ENV_DEVICES}={text!r}: bad entry {part!r}; accepted: {VISIBLE_DEVICES_FORMS}")
        for s in sel:
            if s.isdigit() and int(s) > _MAX_INDEX:
                raise RequestError(f"{ENV_DEVICES}={text!r}: index {s} is above {_MAX_INDEX}")
            if s not in out:
                out.append(s)
    return tuple(out)


def parse_vgpu_spec(text: str) -> dict:
    """To a dict of the items given; raises on anything not in the grammar."""
    seen: dict = {}
    for part in text.split(","):
        item = part.strip()
        if not item:
            raise RequestError(f"{ENV_SPEC}={text!r}: empty item; accepted: {VGPU_SPEC_FORMS}")
        key, eq, value = item.partition("=")
        key = key.strip().lower()
        value = value.strip()
        if not eq:
            if _PROFILE.match(item.lower()):
                key, value = "profile", item.lower()
            else:
                raise RequestError(f"{ENV_SPEC}={text!r}: {item!r} is neither key=value nor a MIG profile name; "
                                   f"accepted: {VGPU_SPEC_FORMS}")
        if key in seen:
            raise RequestError(f"{ENV_SPEC}={text!r}: {key} is given twice")
        what = f"{ENV_SPEC} item {item!r}"
        if key == "mem":
            if value.endswith("%"):
                pct = value[:-1].strip()
                if not _INT.match(pct) or not 1 <= int(pct) <= 100:
                    raise RequestError(f"{what}: percent must be 1 to 100")
                seen["mem_percent"] = int(pct)
                key = "mem"
                seen[key] = None
                continue
            seen[key] = parse_size_mib(value, what)
        elif key == "cores":
            if not _INT.match(value) or not 0 <= int(value) <= 100:
                raise RequestError(f"{what}: cores must be a whole percent from 0 to 100 (100 = exclusive)")
            seen[key] = int(value)
        elif key == "gpus":
            if not _INT.match(value) or not 1 <= int(value) <= 64:
                raise RequestError(f"{what}: gpus must be a whole number from 1 to 64")
            seen[key] = int(value)
        elif key == "mode":
            if value not in MODES:
                raise RequestError(f"{what}: mode must be one of {', '.join(MODES)}")
            seen[key] = value
        elif key == "priority":
            if value not in ("0", "1"):
                raise RequestError(f"{what}: priority must be 0 (high) or 1 (low)")
            seen[key] = int(value)
        elif key == "profile":
            seen[key] = value
        else:
            raise RequestError(f"{ENV_SPEC}={text!r}: unknown key {key!r}; accepted: {VGPU_SPEC_FORMS}; "
                               f"sizes are {SIZE_FORMS}")
    if "profile" in seen:
        for clash in ("mem", "cores"):
            if clash in seen:
                raise RequestError(f"{ENV_SPEC}={text!r}: a MIG profile ({seen['profile']}) fixes memory and "
                                   f"compute; remove {clash}=")
        if seen.get("mode") == "hami-core":
            raise RequestError(f"{ENV_SPEC}={text!r}: a MIG profile ({seen['profile']}) needs mode=mig, not hami-core")
    if seen.get("mode") == "mig" and "cores" in seen:
        raise RequestError(f"{ENV_SPEC}={text!r}: cores= does not apply to MIG (an instance's compute is fixed "
                           "by its profile); remove cores=")
    return seen


def parse_docker_env(env: Mapping[str, str] | Iterable[str], container_id: str,
                     defaults: Defaults = Defaults()) -> Request | None:
    """The request of a Docker container, or ``None`` if it asks for nothing of ours."""
    vars_ = _env_map(env)
    dev_text = vars_.get(ENV_DEVICES, "").strip()
    spec_text = vars_.get(ENV_SPEC, "").strip()
    if not dev_text and not spec_text:
        return None
    devices = parse_visible_devices(dev_text) if dev_text else ()
    spec = parse_vgpu_spec(spec_text) if spec_text else {}

    count: int | None
    if "gpus" in spec:
        count = spec["gpus"]
        listed = [d for d in devices if d != "all"]
        if listed and count > len(listed):
            raise RequestError(f"{ENV_SPEC} gpus={count} but {ENV_DEVICES}={dev_text!r} lists only {len(listed)}")
    elif devices and devices != ("all",):
        count = len(devices)
    elif devices == ("all",):
        count = None  # every GPU of the node
    else:
        count = 1
    if devices == ("all",):
        devices = ()
        if "gpus" not in spec:
            count = None

    profile = spec.get("profile")
    mode = "mig" if profile else spec.get("mode")
    mem_mib = spec.get("mem")
    mem_pct = spec.get("mem_percent")
    if mem_mib is None and mem_pct is None:
        if defaults.memory_mib and not profile:
            mem_mib = defaults.memory_mib
        else:
            mem_pct = 100
    if "cores" in spec:
        cores = spec["cores"]
    elif mode == "mig":
        cores = 0
    else:
        cores = 100 if (mem_pct == 100 and "mem" not in spec) else defaults.cores
    gpu = GpuRequest(count=count, mem_mib=mem_mib, mem_percent=mem_pct, cores=cores, mig_profile=profile,
                     mode=mode, devices=devices, priority=spec.get("priority"))
    return Request(owner=f"docker:{container_id}", containers=(ContainerRequest(name="main", gpu=gpu),))
