"""The configuration schema. Every key, its default, and the reason for it.

The file is YAML with camelCase keys, the same names HAMi's device config and
``nodeconfig`` use where the meaning is the same, so a HAMi user's values carry
over. Global keys sit at the top; ``nodeconfig`` lists per-node overrides of
the node settings, matched on the node's name.

Example::

    deviceSplitCount: 10
    operatingMode: hami-core
    nodeconfig:
      - name: gpu-node-7
        operatingMode: mig
        filterDevices: {index: [3]}
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

_STRICT = ConfigDict(extra="forbid", populate_by_name=True, frozen=True, validate_default=True)

GPU_POLICIES = ("spread", "binpack")
NODE_POLICIES = ("binpack", "spread")


class FilterDevices(BaseModel):
    """GPUs this node must never hand out (not registered, refused on request)."""

    model_config = _STRICT
    uuid: tuple[str, ...] = ()
    """Exact GPU UUIDs (``GPU-...``) to leave alone."""
    index: tuple[int, ...] = ()
    """NVML indexes to leave alone."""

    @field_validator("index")
    @classmethod
    def _non_negative(cls, v):
        for i in v:
            if i < 0:
                raise ValueError(f"GPU index must be >= 0, got {i}")
        return v


class NodeSettings(BaseModel):
    """Settings that may differ per node (the ``nodeconfig`` keys)."""

    model_config = _STRICT

    deviceSplitCount: int = Field(10, ge=1, le=1024)
    """How many containers may share one GPU. 10 is HAMi's default: enough
    sharing for inference fleets without so many tenants that each one's
    share of memory becomes useless."""

    deviceMemoryScaling: float = Field(1.0, gt=0, le=100)
    """Multiplier on each GPU's physical memory for booking. 1.0 books exactly
    what exists; above 1 oversubscribes (the shim then cannot promise every
    tenant its limit at once)."""

    deviceCoreScaling: float = Field(1.0, gt=0, le=100)
    """Multiplier on each GPU's 100% of compute for booking. 1.0: the cores of
    all tenants add up to at most the whole GPU."""

    operatingMode: Literal["hami-core", "mig"] = "hami-core"
    """``hami-core``: share GPUs through the shim's memory and compute limits.
    ``mig``: carve MIG instances on demand (the GPU must already be in MIG
    mode; hamid never switches it). Shim mode is the default because every
    NVIDIA GPU supports it."""

    filterDevices: FilterDevices = FilterDevices()
    """GPUs to leave alone; empty by default (use every GPU)."""

    defaultMemory: int = Field(0, ge=0)
    """MiB given to a container that asks for GPUs but no memory. 0 means the
    whole card, HAMi's default, so a plain ``nvidia.com/gpu: 1`` behaves as it
    does without hamid."""

    defaultCores: int = Field(0, ge=0, le=100)
    """Percent of compute given to a container that names no cores. 0: no
    compute reservation (time-shared), HAMi's default."""

    defaultGPUNum: int = Field(1, ge=1, le=64)
    """GPUs given to a container that asks for memory or cores but no GPU
    count. 1, as in HAMi."""

    nodeSchedulerPolicy: Literal["binpack", "spread"] = "binpack"
    """How nodes are ranked. ``binpack`` fills busy nodes first, keeping whole
    nodes free for large jobs (HAMi's default)."""

    gpuSchedulerPolicy: Literal["spread", "binpack"] = "spread"
    """How GPUs within a node are ranked. ``spread`` puts tenants on the least
    busy GPU, which limits noisy neighbours (HAMi's default)."""

    simulate: str | None = None
    """Simulated inventory ``MODEL[:COUNT][,...]``. Unset: NVML when a driver
    is present, otherwise the default simulated inventory. The first log line
    says which."""


    @field_validator("simulate")
    @classmethod
    def _simulate_spec(cls, v):
        if v is not None:
            from ..devices.errors import DeviceError
            from ..devices.simulated import parse_simulate_spec

            try:
                parse_simulate_spec(v)
            except DeviceError as e:
                raise ValueError(str(e)) from None
        return v


class NodeOverride(NodeSettings):
    """One ``nodeconfig`` entry: a node name plus the settings it overrides."""

    name: str = Field(min_length=1)


class Config(NodeSettings):
    """The whole file: node settings plus daemon-wide keys."""

    nodeName: str | None = None
    """This node's name. Unset: ``$NODE_NAME`` (set by the DaemonSet), then
    the host name."""

    stateDir: str = "/var/lib/hamid"
    """Where the ledger, the local API socket and per-container directories
    live. Several daemons on one machine (tests) each get their own."""

    metricsPort: int = Field(9394, ge=0, le=65535)
    """Prometheus port; 9394 is HAMi's monitor port, so existing scrape
    configs keep working. 0 disables the metrics endpoint."""

    metricsAddress: str = "0.0.0.0"
    """Address the metrics endpoint binds to."""

    logFormat: Literal["auto", "json", "console"] = "auto"
    """``auto``: readable on a terminal, JSON lines otherwise."""

    logLevel: Literal["debug", "info", "warning", "error"] = "info"
    """``info`` logs each reservation and release: enough to audit, little
    enough to keep."""

    reconcileInterval: float = Field(30.0, gt=0, le=3600)
    """Seconds between reconciliations of the ledger against what really runs.
    30 s bounds how long a missed release holds capacity without costing
    measurable CPU."""

    nodeconfig: tuple[NodeOverride, ...] = ()
    """Per-node overrides, matched on the node's name."""
