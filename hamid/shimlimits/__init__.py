"""hamid.shimlimits: the daemon's side of the shim's limits file.

Owns the container's limits file (format: shim/include/hamid_limits.h, read by
cffi from that same header): turning a :class:`ContainerLimits` into the file's
bytes and back, with every value checked, and writing it atomically. The
daemon writes one per container and mounts it read-only at
:data:`hamid.node.layout.LIMITS_IN_CONTAINER`; the shim then takes its limits from it and from
nothing else. The file's live part (priority hold lists, the sharing
correction, whether another container is active) is rewritten in place once a second by :mod:`.live` from what its
caller read. It never reads a region and never talks to the GPU.
"""

from hamid.shimlimits.codec import (
    ContainerLimits,
    DeviceLimits,
    LimitsFormatError,
    decode,
    encode,
    limits_size,
    max_hold,
)
from hamid.shimlimits.writer import write_hold_pids, write_limits_file, write_others_active, write_share

__all__ = [
    "ContainerLimits",
    "DeviceLimits",
    "LimitsFormatError",
    "decode",
    "encode",
    "limits_size",
    "max_hold",
    "write_hold_pids",
    "write_limits_file",
    "write_others_active",
    "write_share",
]
