"""devices: inventory and health of the node's GPUs.

Owns the description of a GPU (:mod:`.types`), the catalog of real models used
by the simulated backend (:mod:`.catalog`), and the two backends behind one
interface (:mod:`.backend`): NVML through ``pynvml`` (:mod:`.nvml`) and the
simulated one (:mod:`.simulated`), which is the embedded default on machines
without a driver, not a test double. Nothing here knows about requests, the
ledger or placement.
"""

from .backend import DeviceBackend, DeviceError, open_backend
from .types import GpuInfo, MigInstance, MigPlacement, MigProfile

__all__ = [
    "DeviceBackend",
    "DeviceError",
    "GpuInfo",
    "MigInstance",
    "MigPlacement",
    "MigProfile",
    "open_backend",
]
