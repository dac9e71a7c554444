"""Whether the installed cbor2 decodes safely (a depth limit), for every CBOR reader.

Gossip frames and peer requests are CBOR from the network; both decode with
``max_depth``. cbor2 before 5.9 ignored or lacked it, so a deep frame was
"not CBOR" and every frame was dropped in silence; :func:`check_cbor2` probes
the installed one at start-up and names the fix.
"""

from __future__ import annotations

import cbor2

from .errors import HamidError

CBOR2_MIN = "5.9.0"  # the first cbor2 with loads(..., max_depth=); pyproject.toml pins the same


def check_cbor2() -> None:
    """Raise HamidError unless the installed cbor2 enforces ``max_depth``."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        installed = version("cbor2")
    except PackageNotFoundError:
        installed = "unknown"
    fix = f"install cbor2>={CBOR2_MIN} (pip install 'cbor2>={CBOR2_MIN}')"
    try:
        cbor2.loads(b"\x80", max_depth=2)
    except TypeError:
        raise HamidError(f"cbor2 {installed} has no max_depth for loads, which gossip needs to decode "
                         f"frames safely; {fix}") from None
    try:
        cbor2.loads(b"\x81" * 39 + b"\x80", max_depth=2)
    except cbor2.CBORDecodeError:
        return
    raise HamidError(f"cbor2 {installed} accepts 40 nested arrays with max_depth=2 (no depth limit); {fix}")
