"""Sizes and Kubernetes quantities, parsed strictly: one grammar (apimachinery's) for every reader
of a quantity (the request parser, the webhook, the leader's kube-scheduler filters)."""

from __future__ import annotations

import re
from fractions import Fraction
from functools import lru_cache
from typing import Any

from .model import RequestError, echo

# ASCII digits and the lower-case units the README documents, nothing else:
# ``\d`` would also take Arabic-Indic or full-width digits, which int() reads.
_SIZE = re.compile(r"([0-9]{1,9})([mgt]?)", re.ASCII)
_UNIT_MIB = {"": 1, "m": 1, "g": 1024, "t": 1024 * 1024}
SIZE_FORMS = ("an integer number of MiB (4096), or with a lower-case unit: 512m, 4g, 1t "
              "(binary: m=MiB, g=GiB, t=TiB; ASCII digits)")



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
    """A Kubernetes quantity that must be a whole, non-negative number (``3000``, ``4Gi``, ``1e3``)."""
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        raise RequestError(f"{what}: expected a whole number, got {value!r}")
    try:
        q = quantity(value)
    except ValueError:
        raise RequestError(f"{what}: expected a whole number (a Kubernetes quantity such as 3000), got "
                           f"{value!r}") from None
    if q.denominator != 1:
        raise RequestError(f"{what}: expected a whole number, got {value!r}")
    n = int(q)
    if n < 0:
        raise RequestError(f"{what}: expected a non-negative number, got {value!r}")
    if n > 1 << 40:
        raise RequestError(f"{what}: value {value!r} is out of range")
    return n


# apimachinery's grammar: <sign><digits>[.<digits>]<suffix>, suffix a binary SI prefix, a decimal SI
# prefix, or e/E and a signed integer. "1E" is exa, "1E3" is 1000, "1e" and "1K" are refused.
_QUANTITY = re.compile(r"([+-]?)([0-9]*)(?:\.([0-9]*))?(Ki|Mi|Gi|Ti|Pi|Ei|[numkMGTPE]|[eE][+-]?[0-9]+)?")
_BINARY = {"Ki": 10, "Mi": 20, "Gi": 30, "Ti": 40, "Pi": 50, "Ei": 60}
_DECIMAL = {"n": -9, "u": -6, "m": -3, "": 0, "k": 3, "M": 6, "G": 9, "T": 12, "P": 15, "E": 18}
_MAX = 2**63 - 1  # kube-scheduler counts in int64
NANO = 10**9


def quantity(text: Any) -> Fraction:
    """A Kubernetes quantity (``100m``, ``4Gi``, ``1.5e3``, ``2``) as an exact number.

    Accepted: apimachinery's grammar (an optional sign, digits with an
    optional fraction, then ``Ki Mi Gi Ti Pi Ei``, ``n u m k M G T P E`` or
    ``e``/``E`` and an integer exponent); a non-zero value is rounded away
    from zero to a whole nano (10^-9) as ``ParseQuantity`` does. Refused
    (``ValueError`` naming the value): anything else, including what the
    Python client's ``parse_quantity`` lets through (``1K``, ``1_000``,
    `` 1``, ``NaN``, ``1e3k``), and magnitudes beyond 2^63-1, which
    kube-scheduler's int64 accounting cannot hold. Python ints are taken
    as they are (JSON numbers).
    """
    return Fraction(nanos(text), NANO)


def nanos(text: Any) -> int:
    """:func:`quantity` in whole nanos (10^-9), the unit every parsed quantity is a multiple of, so that
    requests are summed and compared in integers."""
    if isinstance(text, bool) or not isinstance(text, (str, int)):
        raise ValueError(f"bad quantity {text!r}: a string such as '500m', '4Gi' or '1e3' is accepted")
    return _parse(str(text), repr(text))


@lru_cache(maxsize=4096)  # a cluster's pods repeat a few quantity strings
def _parse(s: str, shown: str) -> int:
    m = _QUANTITY.fullmatch(s)
    if m is None or not (m.group(2) or m.group(3)):
        raise ValueError(f"bad quantity {shown}: accepted is <number><suffix> with suffix one of Ki Mi Gi Ti Pi "
                         f"Ei, n u m k M G T P E, e<exponent>, or none (e.g. '500m', '4Gi', '1.5', '1e3')")
    sign, whole, frac, suffix = m.group(1), m.group(2), m.group(3) or "", m.group(4) or ""
    mantissa = int((whole + frac) or "0")
    if mantissa == 0:
        return 0
    if suffix in _BINARY:  # mantissa * 2^k / 10^len(frac), in nanos, rounded up
        nanos = -(-(mantissa * 2 ** _BINARY[suffix] * NANO) // 10 ** len(frac))
    else:
        exp = _DECIMAL[suffix] if suffix in _DECIMAL else int(suffix[1:])
        scale = exp - len(frac) + 9  # nanos = mantissa * 10^scale
        if len(str(mantissa)) - 1 + scale >= 19 + 9:  # at least 10^19 > 2^63-1
            raise ValueError(f"bad quantity {shown}: larger than 2^63-1, which kube-scheduler cannot count")
        if scale >= 0:
            nanos = mantissa * 10**scale
        elif -scale > len(str(mantissa)):  # below one nano: rounded up to 1n, as ParseQuantity does
            nanos = 1
        else:
            nanos = -(-mantissa // 10**-scale)
    if nanos > _MAX * NANO:
        raise ValueError(f"bad quantity {shown}: larger than 2^63-1, which kube-scheduler cannot count")
    return -nanos if sign == "-" else nanos
