"""The simulated backend: named real models, real MIG tables, real conflicts.

Each GPU also has HAMi's link score to every other (from the catalog's
NVLink counts, else PCIe by NUMA node) and a health flag: GPUs named in
``unhealthy`` (or marked with :meth:`SimulatedBackend.set_healthy`) report
unhealthy, as NVML reports a GPU with uncorrected ECC errors.

A simulated node is a list of catalog models. GPU UUIDs are derived from the
node name and index, so they are stable across restarts and distinct across
simulated nodes. MIG instances that callers create are kept in a small JSON
file (when a state file is given) under an exclusive ``flock``, so that the
daemon and a runtime hook in another process see the same instances, with the
same placement conflicts NVML would report.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import uuid
from collections.abc import Iterable
from pathlib import Path

from .catalog import Model, lookup, model_keys
from .errors import DeviceError
from .types import BusyReading, GpuInfo, HostReading, MigInstance, MigPlacement

_NS = uuid.UUID("6b1f3c52-9a4e-4d8e-8f0e-5b7a1c2d3e4f")


def parse_simulate_spec(spec: str) -> list[Model]:
    """Parse ``MODEL[:COUNT][,MODEL[:COUNT]...]`` into a list of models."""
    if not spec or not spec.strip():
        raise DeviceError(f"simulate: empty inventory {spec!r}; expected MODEL[:COUNT][,MODEL[:COUNT]...] "
                          f"with MODEL one of {', '.join(model_keys())}")
    out: list[Model] = []
    for part in spec.split(","):
        part = part.strip()
        name, _, count_s = part.partition(":")
        model = lookup(name)
        if model is None:
            raise DeviceError(f"simulate: unknown model {name!r} in {spec!r}; accepted: {', '.join(model_keys())}")
        count = 1
        if count_s:
            if not count_s.isdigit() or not (1 <= int(count_s) <= 64):
                raise DeviceError(f"simulate: bad count {count_s!r} for {name!r} in {spec!r}; "
                                  "expected an integer from 1 to 64")
            count = int(count_s)
        out.extend([model] * count)
    return out


def gpu_uuid(node: str, index: int) -> str:
    return "GPU-" + str(uuid.uuid5(_NS, f"{node}/{index}"))


_UNHEALTHY_KEY = "unhealthy"  # in the state file, beside the MIG instances keyed by GPU UUID


class SimulatedBackend:
    """Simulated GPUs with MIG instance bookkeeping and NVML-like errors."""

    kind = "simulated"

    def __init__(self, models: list[Model], node_name: str, *, mig_enabled: bool = False,
                 state_file: Path | None = None, unhealthy: Iterable[int | str] = ()) -> None:
        self._models = models
        self._node = node_name
        self._mig_enabled = mig_enabled
        self._unhealthy = set()
        for sel in unhealthy:
            idx = self._index_of(sel)
            if idx is None:
                raise DeviceError(f"simulate: unhealthy GPU {sel!r} is not on node {node_name} "
                                  f"(it has GPUs 0-{len(models) - 1}, by index or UUID)")
            self._unhealthy.add(idx)
        self._state_file = Path(state_file) if state_file else None
        self._memory_state: dict[str, list[dict]] = {}

    @property
    def description(self) -> str:
        counts: dict[str, int] = {}
        for m in self._models:
            counts[m.key] = counts.get(m.key, 0) + 1
        return ",".join(f"{k}:{v}" for k, v in counts.items())

    # --- state -------------------------------------------------------------

    @contextlib.contextmanager
    def _locked_state(self):
        if self._state_file is None:
            yield self._memory_state
            return
        self._state_file.parent.mkdir(parents=True, exist_ok=True)
        lock_path = self._state_file.with_name(self._state_file.name + ".lock")
        fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            try:
                state = json.loads(self._state_file.read_text())
            except FileNotFoundError:
                state = {}
            before = json.dumps(state, sort_keys=True)
            yield state
            if json.dumps(state, sort_keys=True) != before:
                tmp = self._state_file.with_name(self._state_file.name + ".tmp")
                wfd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
                with os.fdopen(wfd, "w") as f:
                    json.dump(state, f)
                    f.flush()
                    os.fsync(f.fileno())
                os.replace(tmp, self._state_file)
        finally:
            os.close(fd)

    # --- inventory ---------------------------------------------------------

    def _index_of(self, sel: int | str) -> int | None:
        for i in range(len(self._models)):
            if sel == i or str(sel) == str(i) or sel == gpu_uuid(self._node, i):
                return i
        return None

    def _numa(self, index: int) -> int:
        return 0 if index < max(1, len(self._models) // 2) else 1

    def link_score(self, a: int, b: int) -> int:
        """HAMi's link score between GPUs ``a`` and ``b``: NVLinks x 100 when
        both are of one NVLink board model (catalog ``nvlinks``), otherwise
        PCIe through one CPU (20) or across CPUs (10), by simulated NUMA node."""
        ma, mb = self._models[a], self._models[b]
        if ma is mb and ma.nvlinks:
            return 100 * ma.nvlinks
        return 20 if self._numa(a) == self._numa(b) else 10

    def set_healthy(self, gpu: int | str, healthy: bool) -> None:
        """Mark a simulated GPU healthy or not (as an XID or ECC error would).
        With a state file the mark is kept there, so every backend over the
        same file (the daemon's, a test's) sees it on its next reading."""
        idx = self._index_of(gpu)
        if idx is None:
            raise DeviceError(f"no GPU {gpu!r} on node {self._node}")
        (self._unhealthy.discard if healthy else self._unhealthy.add)(idx)
        if self._state_file is not None:
            with self._locked_state() as state:
                marks = set(state.get(_UNHEALTHY_KEY, []))
                (marks.discard if healthy else marks.add)(idx)
                state[_UNHEALTHY_KEY] = sorted(marks)

    def readings(self) -> list[HostReading]:
        """A simulated GPU runs nothing: memory used and utilization read 0;
        temperature, power and ECC are not simulated (no series)."""
        return [HostReading(index=i, uuid=gpu_uuid(self._node, i), name=m.nvml_name, memory_used_bytes=0,
                            utilization_gpu=0, utilization_memory=0) for i, m in enumerate(self._models)]

    def busy(self) -> dict[str, BusyReading]:
        """Nothing is known of what a simulated GPU ran (its processes run on no GPU): no reading, so no
        sharing correction is ever learned from one."""
        return {}

    def gpus(self) -> list[GpuInfo]:
        with self._locked_state() as state:
            if self._state_file is not None and _UNHEALTHY_KEY in state:
                self._unhealthy = set(state[_UNHEALTHY_KEY])
            return [self._gpu(i, m, state) for i, m in enumerate(self._models)]

    def _gpu(self, index: int, model: Model, state: dict) -> GpuInfo:
        u = gpu_uuid(self._node, index)
        instances = tuple(
            MigInstance(d["profile"], MigPlacement(d["start"], d["size"]), d["gi"], d["ci"], d["uuid"])
            for d in state.get(u, [])
        )
        return GpuInfo(
            index=index,
            uuid=u,
            name=model.nvml_name,
            memory_mib=model.memory_mib,
            sm_count=model.sm_count,
            numa_node=self._numa(index),
            healthy=index not in self._unhealthy,
            mig_capable=model.mig_capable,
            mig_enabled=model.mig_capable and self._mig_enabled,
            memory_slices=model.memory_slices,
            compute_slices=model.compute_slices,
            mig_profiles=model.mig_profiles,
            mig_instances=instances,
            minor=index,
            links=tuple((gpu_uuid(self._node, j), self.link_score(index, j))
                        for j in range(len(self._models)) if j != index),
        )

    def _find(self, gpu: str, state: dict) -> GpuInfo:
        for i, m in enumerate(self._models):
            info = self._gpu(i, m, state)
            if gpu in (info.uuid, str(info.index)):
                return info
        raise DeviceError(f"no GPU {gpu!r} on node {self._node}")

    # --- MIG ---------------------------------------------------------------

    def create_mig_instance(self, gpu: str, profile_name: str, placement: MigPlacement) -> MigInstance:
        with self._locked_state() as state:
            info = self._find(gpu, state)
            if not info.mig_enabled:
                raise DeviceError(f"GPU {info.index} ({info.uuid}) is not in MIG mode; "
                                  "enable MIG on it first (hamid never switches MIG mode)")
            prof = info.profile(profile_name)
            if prof is None:
                raise DeviceError(f"GPU {info.index} ({info.name}) has no MIG profile {profile_name!r}; "
                                  f"accepted: {', '.join(p.name for p in info.mig_profiles)}")
            if placement not in prof.placements:
                raise DeviceError(f"INSUFFICIENT_RESOURCES: placement {placement} is not valid for {prof.name}; "
                                  f"possible: {', '.join(map(str, prof.placements))}")
            live = info.mig_instances
            if any(placement.overlaps(i.placement) for i in live):
                raise DeviceError(f"INSUFFICIENT_RESOURCES: placement {placement} overlaps a live instance on GPU {info.index}")
            if sum(1 for i in live if i.profile == prof.name) >= prof.max_instances:
                raise DeviceError(f"INSUFFICIENT_RESOURCES: {prof.name} already has {prof.max_instances} instance(s)")
            used_slices = sum(p.slices for i in live if (p := info.profile(i.profile)))
            if used_slices + prof.slices > info.compute_slices:
                raise DeviceError(f"INSUFFICIENT_RESOURCES: {prof.name} needs {prof.slices} compute slices, "
                                  f"{info.compute_slices - used_slices} free")
            gi = 1 + max([i.gi_id for i in live], default=0)
            # a new UUID for every instance, as the driver gives: never one an earlier instance had
            # (profiles of different sizes can share a placement start and a GPU instance id)
            inst = MigInstance(prof.name, placement, gi, 0, "MIG-" + str(uuid.uuid4()))
            state.setdefault(info.uuid, []).append(
                {"profile": inst.profile, "start": placement.start, "size": placement.size,
                 "gi": inst.gi_id, "ci": inst.ci_id, "uuid": inst.uuid})
            return inst

    def destroy_mig_instance(self, gpu: str, gi_id: int) -> bool:
        """Destroy a GPU instance; False when it was already gone (idempotent)."""
        with self._locked_state() as state:
            info = self._find(gpu, state)
            entries = state.get(info.uuid, [])
            kept = [d for d in entries if d["gi"] != gi_id]
            if len(kept) == len(entries):
                return False
            state[info.uuid] = kept
            return True

    def close(self) -> None:
        pass
