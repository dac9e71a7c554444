"""The backend interface and the choice between NVML and simulation."""

from __future__ import annotations

from pathlib import Path
from typing import Protocol

from .errors import DeviceError
from .types import BusyReading, GpuInfo, HostReading, MigInstance, MigPlacement


class DeviceBackend(Protocol):
    """What every device backend offers. Calls may block (NVML does)."""

    kind: str  # "nvml" or "simulated"
    @property
    def description(self) -> str: ...  # driver version, or the simulated inventory

    def gpus(self) -> list[GpuInfo]: ...

    def readings(self) -> list[HostReading]: ...

    def busy(self) -> dict[str, BusyReading]: ...  # by GPU UUID, since the previous call; unknown GPUs left out

    def create_mig_instance(self, gpu: str, profile_name: str, placement: MigPlacement) -> MigInstance: ...

    def destroy_mig_instance(self, gpu: str, gi_id: int) -> bool: ...

    def close(self) -> None: ...


DEFAULT_SIMULATION = "H100-80GB-HBM3:2,A100-SXM4-40GB:1,T4:1"


def open_backend(*, simulate: str | None, node_name: str, mig_enabled: bool = False,
                 state_dir: Path | None = None) -> DeviceBackend:
    """NVML when a driver is present and no simulation is asked for; else simulated.

    ``simulate`` is ``MODEL[:COUNT][,...]``; ``None`` means "auto": NVML if a
    driver answers, otherwise the default simulated inventory.
    """
    from . import nvml, simulated

    if simulate is None and nvml.driver_present():
        return nvml.NvmlBackend()
    models = simulated.parse_simulate_spec(simulate or DEFAULT_SIMULATION)
    state_file = Path(state_dir) / "simulated-mig.json" if state_dir else None
    return simulated.SimulatedBackend(models, node_name, mig_enabled=mig_enabled, state_file=state_file)


__all__ = ["DeviceBackend", "DeviceError", "DEFAULT_SIMULATION", "open_backend"]
