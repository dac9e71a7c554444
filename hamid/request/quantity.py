"""Sizes and Kubernetes quantities, parsed strictly."""

from __future__ import annotations

import re

from .model import RequestError, echo

# ASCII digits and the lower-case units the README documents, nothing else:
# ``\d`` would also take Arabic-Indic or full-width digits, which int() reads.
_SIZE = re.compile(r"([0-9]{1,9})([mgt]?)", re.ASCII)
_UNIT_MIB = {"": 1, "m": 1, "g": 1024, "t": 1024 * 1024}
SIZE_FORMS = ("an integer number of MiB (4096), or with a lower-case unit: 512m, 4g, 1t "
              "(binary: m=MiB, g=GiB, t=TiB; ASCII digits)")

# Kubernetes quantity suffixes that keep an integer value.
_K8S = re.compile(r"^\s*([0-9]+)(Ki|Mi|Gi|Ti|k|M|G|T)?\s*$", re.ASCII)
_K8S_MULT = {None: 1, "k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12,
             "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40}


def parse_size_mib(text: str, what: str) -> int:
    """``4096`` (MiB), ``512m``, ``4g``... to MiB. ``what`` names the field."""
    m = _SIZE.fullmatch(text.strip(" "))
    if not m:
        raise RequestError(f"{what}: bad size {echo(text)}; accepted: {SIZE_FORMS}")
    mib = int(m.group(1)) * _UNIT_MIB[m.group(2)]
    if mib <= 0:
        raise RequestError(f"{what}: size {echo(text)} must be more than 0")
    if mib > 1 << 30:
        raise RequestError(f"{what}: size {echo(text)} is larger than any GPU")
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
