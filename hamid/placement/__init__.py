"""placement: pure functions that choose a node and GPUs for a request.

No I/O, no clocks, no globals: the same inputs give the same answer, so the
runtime hook, the local API, the extender and ``hamid plan`` all share one
engine. :mod:`.view` holds the node views the engine reads, :mod:`.fit` the
per-GPU checks, :mod:`.mig` MIG profile and placement choice, :mod:`.engine`
node and GPU ranking and multi-container pods, :mod:`.result` what comes out.
"""

from .engine import check, place
from .result import ContainerAssignment, Decision, DeviceAssignment, NoFit
from .view import GpuView, MigSlot, NodeView, gpu_view_from_info

__all__ = [
    "ContainerAssignment",
    "Decision",
    "DeviceAssignment",
    "GpuView",
    "MigSlot",
    "NoFit",
    "NodeView",
    "check",
    "gpu_view_from_info",
    "place",
]
