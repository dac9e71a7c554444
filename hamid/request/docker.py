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
    mode=mps     an MPS client share: cores= is its active thread percentage
                 and mem= its pinned-memory limit, both set by the daemon; one GPU
    mode=hami-core  the shim's time-shared limits (the default on most GPUs)
    priority=1   0 high, 1 low (passed to the shim)
    policy=force GPU_CORE_UTILIZATION_POLICY: force limits even alone; default
                 (the node's gpuCorePolicy otherwise) limits only while another
                 container shares the GPU

Either variable alone is enough: a spec without visible devices may use any
GPU of the node (``gpus=`` of them, default 1); visible devices without a
spec get those GPUs whole and exclusive. Neither: the container is not ours.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping

from .model import MODES, ContainerRequest, Defaults, GpuRequest, Request, RequestError, echo, parse_core_policy
from .quantity import parse_size_mib

ENV_DEVICES = "HAMI_VISIBLE_DEVICES"
ENV_SPEC = "HAMI_VGPU_SPEC"
# The environment entries that make a container hamid's (the runtime and the Docker face look for them).
ENV_PREFIXES = (f"{ENV_DEVICES}=", f"{ENV_SPEC}=")

VISIBLE_DEVICES_FORMS = "an index (0), a list (0,2), a range (0-3), GPU UUIDs (GPU-...), or all"
VGPU_SPEC_FORMS = (
    "comma-separated lower-case items: mem=<MiB or size such as 512m, 4g> | mem=<1-100>% | cores=<0-100> | "
    "gpus=<1-64> | mode=hami-core|mig|mps | priority=0|1 | policy=default|force | a MIG profile such as 1g.10gb or "
    "3g.40gb (ASCII digits)"
)

_UUID = re.compile(r"^GPU-[0-9a-fA-F]{8}(-[0-9a-fA-F]{4}){3}-[0-9a-fA-F]{12}$", re.ASCII)
_PROFILE = re.compile(r"^[1-8]g\.[0-9]{1,3}gb(\+me)?$", re.ASCII)
_INT = re.compile(r"^[0-9]{1,6}$", re.ASCII)  # ASCII digits only: int() would read any Unicode digit
_KEYS = ("mem", "cores", "gpus", "mode", "priority", "policy")
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
            raise RequestError(f"{ENV_DEVICES}={echo(text)}: empty entry; accepted: {VISIBLE_DEVICES_FORMS}")
        if _UUID.match(part):
            sel = [part]
        elif _INT.match(part):
            sel = [str(int(part))]
        elif "-" in part and all(_INT.match(x) for x in part.split("-", 1)):
            lo, hi = (int(x) for x in part.split("-", 1))
            if lo > hi:
                raise RequestError(f"{ENV_DEVICES}={echo(text)}: range {part!r} runs backwards; write {hi}-{lo}")
            if hi > _MAX_INDEX:
                raise RequestError(f"{ENV_DEVICES}={echo(text)}: index {hi} in {part!r} is above {_MAX_INDEX}")
            sel = [str(i) for i in range(lo, hi + 1)]
        else:
            raise RequestError(f"{ENV_DEVICES}={echo(text)}: bad entry {echo(part)}; accepted: {VISIBLE_DEVICES_FORMS}")
        for s in sel:
            if s.isdigit() and int(s) > _MAX_INDEX:
                raise RequestError(f"{ENV_DEVICES}={echo(text)}: index {s} is above {_MAX_INDEX}")
            if s not in out:
                out.append(s)
    return tuple(out)


def parse_vgpu_spec(text: str) -> dict:
    """To a dict of the items given; raises on anything not in the grammar.

    Keys, units, modes and profile names are lower case and numbers are
    ASCII digits, exactly as documented; any other spelling (``MEM=4G``,
    ``mem=4gb``, full-width or Arabic-Indic digits) is refused with the accepted forms, never
    read as something close. Errors quote at most the first 64 characters.
    """
    seen: dict = {}
    whole = f"{ENV_SPEC}={echo(text)}"
    for part in text.split(","):
        item = part.strip(" ")
        if not item:
            raise RequestError(f"{whole}: empty item; accepted: {VGPU_SPEC_FORMS}")
        words = item.split()
        if sum(1 for w in words if "=" in w or _PROFILE.match(w)) > 1:  # "mem=4g cores=30"
            raise RequestError(f"{whole}: separate items with commas, not spaces "
                               f"({ENV_SPEC}={echo(','.join(words))}); accepted: {VGPU_SPEC_FORMS}")
        key, eq, value = item.partition("=")
        key, value = key.strip(" "), value.strip(" ")
        what = f"{ENV_SPEC} item {echo(item)}"
        if not eq:
            if not _PROFILE.match(item):
                raise RequestError(f"{what} is neither key=value nor a MIG profile name; "
                                   f"accepted: {VGPU_SPEC_FORMS}")
            key, value = "profile", item
        elif key not in _KEYS:
            hint = f" (keys are lower case: {key.lower()}=)" if key.lower() in _KEYS else ""
            raise RequestError(f"{what}: unknown key {echo(key)}{hint}; accepted: {VGPU_SPEC_FORMS}")
        if key in seen or (key == "mem" and "mem_percent" in seen):
            raise RequestError(f"{whole}: {key} is given twice")
        if key == "mem":
            if value.endswith("%"):
                pct = value[:-1]
                if not _INT.match(pct) or not 1 <= int(pct) <= 100:
                    raise RequestError(f"{what}: percent must be a whole number from 1 to 100 (ASCII digits)")
                seen["mem_percent"] = int(pct)
                seen[key] = None
                continue
            seen[key] = parse_size_mib(value, what)
        elif key == "cores":
            if not _INT.match(value) or not 0 <= int(value) <= 100:
                raise RequestError(f"{what}: cores must be a whole percent from 0 to 100 (100 = exclusive), "
                                   "in ASCII digits")
            seen[key] = int(value)
        elif key == "gpus":
            if not _INT.match(value) or not 1 <= int(value) <= 64:
                raise RequestError(f"{what}: gpus must be a whole number from 1 to 64 (ASCII digits)")
            seen[key] = int(value)
        elif key == "mode":
            if value not in MODES:
                raise RequestError(f"{what}: mode must be one of {', '.join(MODES)}")
            seen[key] = value
        elif key == "priority":
            if value not in ("0", "1"):
                raise RequestError(f"{what}: priority must be 0 (high) or 1 (low)")
            seen[key] = int(value)
        elif key == "policy":
            seen[key] = parse_core_policy(value, what)
        else:
            seen[key] = value
    if "profile" in seen:
        for clash in ("mem", "cores"):
            if clash in seen:
                raise RequestError(f"{whole}: a MIG profile ({seen['profile']}) fixes memory and "
                                   f"compute; remove {clash}=")
        if seen.get("mode") in ("hami-core", "mps"):
            raise RequestError(f"{whole}: a MIG profile ({seen['profile']}) needs mode=mig, not {seen['mode']}")
    if seen.get("mode") == "mig" and "cores" in seen:
        raise RequestError(f"{whole}: cores= does not apply to MIG (an instance's compute is fixed "
                           "by its profile); remove cores=")
    if seen.get("mode") == "mps" and seen.get("gpus", 1) != 1:
        raise RequestError(f"{whole}: mode=mps takes one GPU (gpus={seen['gpus']}): a process reaches one MPS "
                           "control daemon and hamid runs one per GPU; remove gpus= or use mode=hami-core")
    return seen


def whole_card_note(env: Mapping[str, str] | Iterable[str]) -> str | None:
    """The sentence a refusal needs when the container asked no memory: then it
    books each GPU's whole memory (as HAMi's gpucores without gpumem does), and
    only an idle GPU holds it. None when it asked for memory or a MIG profile."""
    vars_ = _env_map(env)
    spec_text = vars_.get(ENV_SPEC, "").strip()
    try:
        spec = parse_vgpu_spec(spec_text) if spec_text else {}
    except RequestError:
        return None
    if "mem" in spec or "mem_percent" in spec or "profile" in spec or spec.get("mode") == "mig":
        return None
    what = f"{ENV_SPEC}={echo(spec_text)}" if spec_text else f"{ENV_DEVICES} without {ENV_SPEC}"
    return (f"note: {what} asks no memory, so the container books each GPU's whole memory (as HAMi does "
            "without gpumem) and fits only on a GPU nobody else holds; add mem= (e.g. mem=4g or mem=25%) "
            "to share a GPU")


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
            raise RequestError(f"{ENV_SPEC} gpus={count} but {ENV_DEVICES}={echo(dev_text)} lists only {len(listed)}")
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
    if spec.get("mode") == "mps" and count != 1:
        raise RequestError(f"{ENV_SPEC} mode=mps takes one GPU, but {ENV_DEVICES}={echo(dev_text)} gives "
                           f"{'every GPU' if count is None else count}: a process reaches one MPS control daemon and "
                           "hamid runs one per GPU; name one GPU or add gpus=1")

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
        # no memory named (or 100%): exclusive, whatever defaultMemory says, as HAMi's webhook does for a pod
        cores = 100 if ("mem" not in spec and spec.get("mem_percent") in (None, 100)) else defaults.cores
    gpu = GpuRequest(count=count, mem_mib=mem_mib, mem_percent=mem_pct, cores=cores, mig_profile=profile,
                     mode=mode, devices=devices, priority=spec.get("priority"), core_policy=spec.get("policy"))
    return Request(owner=f"docker:{container_id}", containers=(ContainerRequest(name="main", gpu=gpu),))
