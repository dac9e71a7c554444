"""Sizes and Kubernetes quantities, parsed strictly."""

from __future__ import annotations

import re

from .model import RequestError

_SIZE = re.compile(r"^\s*(\d+)\s*([a-zA-Z]*)\s*$")
_UNIT_MIB = {
    "": 1, "m": 1, "mi": 1, "mb": 1, "mib": 1,
    "g": 1024, "gi": 1024, "gb": 1024, "gib": 1024,
    "t": 1024 * 1024, "ti": 1024 * 1024, "tb": 1024 * 1024, "tib": 1024 * 1024,
}
SIZE_FORMS = "an integer number of MiB (4096), or with a unit: 512m, 4g, 1t (binary: m=MiB, g=GiB, t=TiB)"

# Kubernetes quantity suffixes that keep an integer value.
_K8S = re.compile(r"^\s*(\d+)(Ki|Mi|Gi|Ti|k|M|G|T)?\s*$")
_K8S_MULT = {None: 1, "k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12,
             "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40}


def parse_size_mib(text: str, what: str) -> int:
    """``4096`` (MiB), ``512m``, ``4g``... to MiB. ``what`` names the field."""
    m = _SIZE.match(text)
    if not m or m.group(2).lower() not in _UNIT_MIB:
        raise RequestError(f"{what}: bad size {text!r}; accepted: {SIZE_FORMS}")
    mib = int(m.group(1)) * _UNIT_MIB[m.group(2).lower()]
    if mib <= 0:
        raise RequestError(f"{what}: size {text!r} must be more than 0")
    if mib > 1 << 30:
        raise RequestError(f"{what}: size {text!r} is larger than any GPU")
    return mib


def parse_k8s_int(value: object, what: str) -> int:
    """A Kubernetes quantity that must be a whole, non-negative number."""
    if isinstance(value, bool):
        raise RequestError(f"{what}: expected a whole number, got {value!r}")
    if isinstance(value, int):
        n = value
    elif isinstance(value, str):
        m = _K8S.match(value)
        if not m:
            raise RequestError(f"{what}: expected a whole number (a Kubernetes quantity such as 3000), got {value!r}")
        n = int(m.group(1)) * _K8S_MULT[m.group(2)]
    else:
        raise RequestError(f"{what}: expected a whole number, got {value!r}")
    if n < 0:
        raise RequestError(f"{what}: expected a non-negative number, got {value!r}")
    if n > 1 << 40:
        raise RequestError(f"{what}: value {value!r} is out of range")
    return n
