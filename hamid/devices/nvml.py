"""The NVML backend: real GPUs through ``pynvml`` (package ``nvidia-ml-py``).

Reads the inventory (index, UUID, name, memory, SMs, NUMA node, health, MIG
capability and mode, the MIG profile table with its possible placements, the
live GPU instances, and HAMi's NVLink/PCIe link score between every pair), and creates and destroys MIG instances at an exact
placement. It never changes MIG mode, clocks or any other GPU setting.

Every call here blocks; the daemon runs them under ``trio.to_thread``.
"""

from __future__ import annotations

import ctypes
import itertools
import threading
from dataclasses import replace
from pathlib import Path

from .errors import DeviceError
from .types import BusyReading, GpuInfo, HostReading, MigInstance, MigPlacement, MigProfile

try:  # the module is a hard dependency, but the shared library may be absent
    import pynvml
except ImportError:  # pragma: no cover - nvidia-ml-py is in pyproject
    pynvml = None  # type: ignore[assignment]

# GPU-instance slice count -> compute-instance profile that spans the whole GI.
_CI_PROFILE_FOR_SLICES = {
    1: "NVML_COMPUTE_INSTANCE_PROFILE_1_SLICE",
    2: "NVML_COMPUTE_INSTANCE_PROFILE_2_SLICE",
    3: "NVML_COMPUTE_INSTANCE_PROFILE_3_SLICE",
    4: "NVML_COMPUTE_INSTANCE_PROFILE_4_SLICE",
    6: "NVML_COMPUTE_INSTANCE_PROFILE_6_SLICE",
    7: "NVML_COMPUTE_INSTANCE_PROFILE_7_SLICE",
    8: "NVML_COMPUTE_INSTANCE_PROFILE_8_SLICE",
}


def driver_present() -> bool:
    """True when NVML can be initialised on this machine."""
    if pynvml is None:
        return False
    try:
        pynvml.nvmlInit()
    except Exception:
        return False
    try:
        return pynvml.nvmlDeviceGetCount() > 0
    finally:
        pynvml.nvmlShutdown()


def _text(v) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)


def _nvml_error(e: Exception, what: str) -> DeviceError:
    return DeviceError(f"{what}: NVML says {e}")


class NvmlBackend:
    kind = "nvml"

    def __init__(self) -> None:
        if pynvml is None:
            raise DeviceError("nvidia-ml-py is not installed")
        try:
            pynvml.nvmlInit()
        except pynvml.NVMLError as e:
            raise _nvml_error(e, "cannot initialise NVML") from e
        self._lock = threading.Lock()  # NVML MIG calls are serialised per process
        self.description = _text(pynvml.nvmlSystemGetDriverVersion())
        self._last: dict[int, GpuInfo] = {}  # the last good reading of each index (a lost GPU keeps its UUID)
        self._xid_bad: dict[str, float] = {}  # uuid -> monotonic time of its last critical XID
        self._busy_ts: dict[str, tuple[int, int]] = {}  # uuid -> the last device / process sample seen (busy)
        self._events: threading.Thread | None = None
        self._closing = threading.Event()

    def close(self) -> None:
        self._closing.set()
        if self._events is not None:
            self._events.join(timeout=2)
        try:
            pynvml.nvmlShutdown()
        except Exception:
            pass

    # --- inventory ---------------------------------------------------------

    def readings(self) -> list[HostReading]:
        """Each GPU's use now (metrics); a value NVML does not answer is None."""

        def ask(fn, *args):
            try:
                return fn(*args)
            except pynvml.NVMLError:
                return None

        out = []
        with self._lock:
            for i in range(pynvml.nvmlDeviceGetCount()):
                h = ask(pynvml.nvmlDeviceGetHandleByIndex, i)
                if h is None:
                    continue
                mem = ask(pynvml.nvmlDeviceGetMemoryInfo, h)
                util = ask(pynvml.nvmlDeviceGetUtilizationRates, h)
                power = ask(pynvml.nvmlDeviceGetPowerUsage, h)  # milliwatts
                out.append(HostReading(
                    index=i, uuid=_text(ask(pynvml.nvmlDeviceGetUUID, h) or ""),
                    name=_text(ask(pynvml.nvmlDeviceGetName, h) or ""),
                    memory_used_bytes=None if mem is None else int(mem.used),
                    utilization_gpu=None if util is None else int(util.gpu),
                    utilization_memory=None if util is None else int(util.memory),
                    temperature_c=ask(pynvml.nvmlDeviceGetTemperature, h, pynvml.NVML_TEMPERATURE_GPU),
                    power_w=None if power is None else power / 1000.0,
                    ecc_uncorrected=ask(pynvml.nvmlDeviceGetTotalEccErrors, h,
                                        pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, pynvml.NVML_VOLATILE_ECC)))
        return out

    def busy(self) -> dict[str, BusyReading]:
        """Per GPU (UUID), since the previous call: the mean of NVML's device utilization samples
        (nvmlDeviceGetSamples, GPU utilization: the share of each sample period a kernel ran) and the pids of
        its process utilization samples with smUtil > 0, and the pids of the processes with a context on it. A
        GPU that answers neither, or had no sample since, is left out (nothing known)."""
        out: dict[str, BusyReading] = {}
        with self._lock:
            for i in range(pynvml.nvmlDeviceGetCount()):
                try:
                    h = pynvml.nvmlDeviceGetHandleByIndex(i)
                    uuid = _text(pynvml.nvmlDeviceGetUUID(h))
                    last_dev, last_proc = self._busy_ts.get(uuid, (0, 0))
                    _, samples = pynvml.nvmlDeviceGetSamples(h, pynvml.NVML_GPU_UTILIZATION_SAMPLES, last_dev)
                    try:
                        procs = pynvml.nvmlDeviceGetProcessUtilization(h, last_proc)
                    except pynvml.NVMLError_NotFound:
                        procs = []  # no process sample since: nobody busy
                except pynvml.NVMLError:
                    continue
                try:  # who is on the GPU (the host's pid map says whose they are: hamid/shimlimits/hostpids.py)
                    running = pynvml.nvmlDeviceGetComputeRunningProcesses(h)
                    on = frozenset(p.pid for p in running)
                    # usedGpuMemory is None where NVML has no figure (NVML_VALUE_NOT_AVAILABLE)
                    mem: dict[int, int] | None = {p.pid: int(p.usedGpuMemory) for p in running
                                                  if isinstance(p.usedGpuMemory, int)}
                except pynvml.NVMLError:
                    on, mem = None, None
                fresh = [s for s in samples if s.timeStamp > last_dev]
                self._busy_ts[uuid] = (max([last_dev, *(s.timeStamp for s in samples)]),
                                       max([last_proc, *(p.timeStamp for p in procs)]))
                if not fresh or not last_dev:  # the first call only sets where the next one starts
                    continue
                per_pid: dict[int, list[int]] = {}
                for p in procs:
                    per_pid.setdefault(p.pid, []).append(p.smUtil)
                out[uuid] = BusyReading(busy_pct=sum(s.sampleValue.uiVal for s in fresh) / len(fresh),
                                        busy_pids=frozenset(p.pid for p in procs if p.smUtil > 0), pids=on,
                                        pid_busy={pid: sum(v) / len(v) for pid, v in per_pid.items()}, pid_mem=mem)
        return out

    def gpus(self) -> list[GpuInfo]:
        with self._lock:
            infos = []
            for i in range(pynvml.nvmlDeviceGetCount()):
                try:
                    info = self._read(i)
                except pynvml.NVMLError as e:  # a GPU that stopped answering (lost, fallen off the bus)
                    last = self._last.get(i)
                    if last is None:
                        raise _nvml_error(e, f"cannot read GPU {i}") from e
                    info = replace(last, healthy=False)
                else:
                    self._last[i] = info
                if self._xid_recent(info.uuid):
                    info = replace(info, healthy=False)
                infos.append(info)
            return self._with_links(infos)

    # --- health: critical XID events ------------------------------------------

    # XIDs an application causes, not the GPU (NVIDIA's device plugin skips the
    # same ones): 13 graphics engine exception, 31 memory page fault, 43 GPU
    # stopped processing, 45 preemptive cleanup, 68 video processor exception,
    # 109 context switch timeout.
    APP_XIDS = frozenset({13, 31, 43, 45, 68, 109})
    XID_HOLD_S = 300.0  # a GPU stays unhealthy this long after its last critical XID

    def _xid_recent(self, uuid: str) -> bool:
        import time

        at = self._xid_bad.get(uuid)
        return at is not None and time.monotonic() - at < self.XID_HOLD_S

    def watch_health_events(self) -> None:
        """Start a thread that waits on NVML's critical-XID and ECC events and
        marks the GPU unhealthy (for ``XID_HOLD_S`` after the last one). Idempotent."""
        if self._events is not None:
            return
        try:
            evset = pynvml.nvmlEventSetCreate()
            kinds = pynvml.nvmlEventTypeXidCriticalError | pynvml.nvmlEventTypeDoubleBitEccError
            for i in range(pynvml.nvmlDeviceGetCount()):
                h = pynvml.nvmlDeviceGetHandleByIndex(i)
                try:
                    pynvml.nvmlDeviceRegisterEvents(h, kinds, evset)
                except pynvml.NVMLError:  # not supported on this GPU: ECC and loss are still read
                    continue
        except pynvml.NVMLError:
            return
        self._events = threading.Thread(target=self._event_loop, args=(evset,), name="hamid-nvml-events",
                                        daemon=True)
        self._events.start()

    def _event_loop(self, evset) -> None:
        import time

        try:
            while not self._closing.is_set():
                try:
                    ev = pynvml.nvmlEventSetWait_v2(evset, 1000)
                except pynvml.NVMLError_Timeout:
                    continue
                except pynvml.NVMLError:
                    time.sleep(1.0)
                    continue
                xid = int(ev.eventData)
                if ev.eventType == pynvml.nvmlEventTypeXidCriticalError and xid in self.APP_XIDS:
                    continue
                try:
                    uuid = _text(pynvml.nvmlDeviceGetUUID(ev.device))
                except pynvml.NVMLError:
                    continue
                self._xid_bad[uuid] = time.monotonic()
        finally:
            try:
                pynvml.nvmlEventSetFree(evset)
            except Exception:
                pass

    # --- topology: HAMi's link scores ------------------------------------------

    def _with_links(self, infos: list[GpuInfo]) -> list[GpuInfo]:
        """Each GPU with its link score to every other: n NVLinks x 100, else
        the PCIe distance HAMi uses (60 same board, 50 one switch, 40 several
        switches, 30 one host bridge, 20 one CPU, 10 across CPUs). A pair NVML
        cannot describe scores 0 (unknown), which topology-aware ranks last."""
        if len(infos) < 2:
            return infos
        handles = [pynvml.nvmlDeviceGetHandleByIndex(g.index) for g in infos]
        buses = [self._bus(h) for h in handles]
        direct: list[dict[int, int]] = []
        switched: list[int] = []
        for h in handles:
            d, sw = self._nvlink_peers(h, buses)
            direct.append(d)
            switched.append(sw)
        scores = {}
        for i, j in itertools.combinations(range(len(infos)), 2):
            n = direct[i].get(j, 0) or direct[j].get(i, 0)
            if not n and switched[i] and switched[j] and self._p2p_nvlink(handles[i], handles[j]):
                n = min(switched[i], switched[j])  # through NVSwitch: each GPU's links reach every peer
            scores[i, j] = scores[j, i] = 100 * n if n else self._pcie_score(handles[i], handles[j])
        return [replace(g, links=tuple((infos[j].uuid, scores[i, j]) for j in range(len(infos)) if j != i))
                for i, g in enumerate(infos)]

    @staticmethod
    def _bus(h) -> str:
        try:
            return _text(pynvml.nvmlDeviceGetPciInfo(h).busId).lower()[-12:]
        except pynvml.NVMLError:
            return ""

    @staticmethod
    def _nvlink_peers(h, buses: list[str]) -> tuple[dict[int, int], int]:
        """Active NVLinks of ``h``: per peer GPU (by position) and to NVSwitches."""
        peers: dict[int, int] = {}
        switched = 0
        for link in range(pynvml.NVML_NVLINK_MAX_LINKS):
            try:
                if pynvml.nvmlDeviceGetNvLinkState(h, link) != pynvml.NVML_FEATURE_ENABLED:
                    continue
            except pynvml.NVMLError:
                continue  # no such link, or NVLink not supported
            try:
                if pynvml.nvmlDeviceGetNvLinkRemoteDeviceType(h, link) == pynvml.NVML_NVLINK_DEVICE_TYPE_SWITCH:
                    switched += 1
                    continue
            except (pynvml.NVMLError, AttributeError):
                pass
            try:
                remote = _text(pynvml.nvmlDeviceGetNvLinkRemotePciInfo(h, link).busId).lower()[-12:]
            except pynvml.NVMLError:
                continue
            if remote in buses:
                k = buses.index(remote)
                peers[k] = peers.get(k, 0) + 1
        return peers, switched

    @staticmethod
    def _p2p_nvlink(a, b) -> bool:
        try:
            return pynvml.nvmlDeviceGetP2PStatus(a, b, pynvml.NVML_P2P_CAPS_INDEX_NVLINK) == pynvml.NVML_P2P_STATUS_OK
        except pynvml.NVMLError:
            return False

    _PCIE_SCORE = {0: 60, 10: 50, 20: 40, 30: 30, 40: 20, 50: 10}  # NVML_TOPOLOGY_* -> HAMi's score

    @classmethod
    def _pcie_score(cls, a, b) -> int:
        try:
            return cls._PCIE_SCORE.get(int(pynvml.nvmlDeviceGetTopologyCommonAncestor(a, b)), 0)
        except pynvml.NVMLError:
            return 0

    def _read(self, index: int) -> GpuInfo:
        h = pynvml.nvmlDeviceGetHandleByIndex(index)
        uuid = _text(pynvml.nvmlDeviceGetUUID(h))
        name = _text(pynvml.nvmlDeviceGetName(h))
        healthy = True
        try:
            mem = pynvml.nvmlDeviceGetMemoryInfo(h).total // (1024 * 1024)
        except pynvml.NVMLError:
            mem, healthy = 0, False
        mig_capable, mig_enabled = False, False
        try:
            cur, _pending = pynvml.nvmlDeviceGetMigMode(h)
            mig_capable, mig_enabled = True, cur == pynvml.NVML_DEVICE_MIG_ENABLE
        except pynvml.NVMLError:
            pass
        profiles = self._profiles(h) if mig_capable else ()
        sm = self._sm_count(h, profiles)
        instances = self._instances(h, profiles) if mig_enabled else ()
        try:
            minor = pynvml.nvmlDeviceGetMinorNumber(h)
        except pynvml.NVMLError:
            minor = None
        mem_slices = max((p.end for pr in profiles for p in pr.placements), default=0)
        compute_slices = max((pr.slices for pr in profiles), default=0)
        return GpuInfo(
            index=index, uuid=uuid, name=name, memory_mib=mem, sm_count=sm,
            numa_node=self._numa(h), healthy=healthy and self._ecc_ok(h),
            mig_capable=mig_capable and bool(profiles), mig_enabled=mig_enabled,
            memory_slices=mem_slices, compute_slices=compute_slices,
            mig_profiles=profiles, mig_instances=instances, minor=minor,
        )

    @staticmethod
    def _sm_count(h, profiles) -> int:
        try:
            return int(pynvml.nvmlDeviceGetAttributes(h).multiprocessorCount)
        except (pynvml.NVMLError, AttributeError):
            return max((p.sm_count for p in profiles), default=0)

    @staticmethod
    def _numa(h) -> int | None:
        try:
            bus = _text(pynvml.nvmlDeviceGetPciInfo(h).busId).lower()
            # NVML prints an 8-digit domain; sysfs uses 4.
            bus = bus[-12:] if len(bus) > 12 else bus
            raw = Path(f"/sys/bus/pci/devices/{bus}/numa_node").read_text().strip()
            return max(0, int(raw))
        except Exception:
            return None

    @staticmethod
    def _ecc_ok(h) -> bool:
        try:
            n = pynvml.nvmlDeviceGetTotalEccErrors(
                h, pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, pynvml.NVML_VOLATILE_ECC)
            return n == 0
        except pynvml.NVMLError:
            return True  # ECC not supported or disabled: no signal, not a fault

    @staticmethod
    def _profiles(h) -> tuple[MigProfile, ...]:
        out: list[MigProfile] = []
        for p in range(pynvml.NVML_GPU_INSTANCE_PROFILE_COUNT):
            try:
                info = pynvml.nvmlDeviceGetGpuInstanceProfileInfo(h, p)
            except pynvml.NVMLError:
                continue  # profile absent on this GPU
            placements: tuple[MigPlacement, ...] = ()
            try:
                count = ctypes.c_uint(0)
                pynvml.nvmlDeviceGetGpuInstancePossiblePlacements(h, info.id, None, ctypes.byref(count))
                arr = (pynvml.c_nvmlGpuInstancePlacement_t * count.value)()
                pynvml.nvmlDeviceGetGpuInstancePossiblePlacements(h, info.id, arr, ctypes.byref(count))
                placements = tuple(MigPlacement(a.start, a.size) for a in arr[: count.value])
            except pynvml.NVMLError:
                pass
            # NVML names profiles "MIG 1g.10gb"; users and nvidia-smi say "1g.10gb".
            name = _text(getattr(info, "name", b"")).removeprefix("MIG ").strip()
            name = name or f"{info.sliceCount}g.{info.memorySizeMB // 1024}gb"
            out.append(MigProfile(
                name=name, profile_id=int(info.id), memory_mib=int(info.memorySizeMB),
                slices=int(info.sliceCount), max_instances=int(info.instanceCount),
                sm_count=int(info.multiprocessorCount), placements=placements))
        return tuple(out)

    @staticmethod
    def _instances(h, profiles) -> tuple[MigInstance, ...]:
        out: list[MigInstance] = []
        for prof in profiles:
            count = ctypes.c_uint(0)
            arr = (pynvml.c_nvmlGpuInstance_t * max(1, prof.max_instances))()
            try:
                pynvml.nvmlDeviceGetGpuInstances(h, prof.profile_id, arr, ctypes.byref(count))
            except pynvml.NVMLError:
                continue
            for gi in arr[: count.value]:
                info = pynvml.nvmlGpuInstanceGetInfo(gi)
                ci_id, mig_uuid = NvmlBackend._first_ci(gi, prof)
                out.append(MigInstance(prof.name, MigPlacement(info.placement.start, info.placement.size),
                                       int(info.id), ci_id, mig_uuid))
        return tuple(out)

    @staticmethod
    def _ci_profile(gi, slices: int):
        const = getattr(pynvml, _CI_PROFILE_FOR_SLICES.get(slices, ""), None)
        if const is None:
            raise DeviceError(f"no compute-instance profile for a {slices}-slice GPU instance")
        return pynvml.nvmlGpuInstanceGetComputeInstanceProfileInfo(
            gi, const, pynvml.NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED)

    @staticmethod
    def _first_ci(gi, prof: MigProfile) -> tuple[int, str]:
        try:
            ci_prof = NvmlBackend._ci_profile(gi, prof.slices)
            arr = (pynvml.c_nvmlComputeInstance_t * 8)()
            count = ctypes.c_uint(0)
            pynvml.nvmlGpuInstanceGetComputeInstances(gi, ci_prof.id, arr, ctypes.byref(count))
            if count.value:
                info = pynvml.nvmlComputeInstanceGetInfo(arr[0])
                return int(info.id), _text(pynvml.nvmlDeviceGetUUID(info.device))
        except (pynvml.NVMLError, DeviceError):
            pass
        return -1, ""

    def _handle(self, gpu: str):
        try:
            if gpu.startswith("GPU-"):
                return pynvml.nvmlDeviceGetHandleByUUID(gpu)
            return pynvml.nvmlDeviceGetHandleByIndex(int(gpu))
        except (pynvml.NVMLError, ValueError) as e:
            raise _nvml_error(e, f"no GPU {gpu!r}") from e

    # --- MIG ---------------------------------------------------------------

    def create_mig_instance(self, gpu: str, profile_name: str, placement: MigPlacement) -> MigInstance:
        with self._lock:
            h = self._handle(gpu)
            cur, _ = pynvml.nvmlDeviceGetMigMode(h)
            if cur != pynvml.NVML_DEVICE_MIG_ENABLE:
                raise DeviceError(f"GPU {gpu} is not in MIG mode; enable MIG on it first "
                                  "(hamid never switches MIG mode)")
            prof = next((p for p in self._profiles(h) if p.name == profile_name), None)
            if prof is None:
                raise DeviceError(f"GPU {gpu} has no MIG profile {profile_name!r}")
            pl = pynvml.c_nvmlGpuInstancePlacement_t()
            pl.start, pl.size = placement.start, placement.size
            try:
                gi = pynvml.nvmlDeviceCreateGpuInstanceWithPlacement(h, prof.profile_id, ctypes.byref(pl))
            except pynvml.NVMLError as e:
                raise _nvml_error(e, f"creating {profile_name} at {placement} on GPU {gpu}") from e
            try:
                ci_prof = self._ci_profile(gi, prof.slices)
                ci = pynvml.nvmlGpuInstanceCreateComputeInstance(gi, ci_prof.id)
                info = pynvml.nvmlComputeInstanceGetInfo(ci)
                mig_uuid = _text(pynvml.nvmlDeviceGetUUID(info.device))
                gi_info = pynvml.nvmlGpuInstanceGetInfo(gi)
            except Exception as e:
                try:  # roll back the GPU instance
                    pynvml.nvmlGpuInstanceDestroy(gi)
                except pynvml.NVMLError:
                    pass
                raise DeviceError(f"creating the compute instance for {profile_name} on GPU {gpu}: {e}") from e
            return MigInstance(profile_name, placement, int(gi_info.id), int(info.id), mig_uuid)

    def destroy_mig_instance(self, gpu: str, gi_id: int) -> bool:
        with self._lock:
            h = self._handle(gpu)
            try:
                gi = pynvml.nvmlDeviceGetGpuInstanceById(h, gi_id)
            except pynvml.NVMLError_NotFound:
                return False
            except pynvml.NVMLError as e:
                raise _nvml_error(e, f"looking up GPU instance {gi_id} on {gpu}") from e
            for slices in sorted({int(s) for s in _CI_PROFILE_FOR_SLICES}):
                try:
                    ci_prof = self._ci_profile(gi, slices)
                    arr = (pynvml.c_nvmlComputeInstance_t * 8)()
                    count = ctypes.c_uint(0)
                    pynvml.nvmlGpuInstanceGetComputeInstances(gi, ci_prof.id, arr, ctypes.byref(count))
                except (pynvml.NVMLError, DeviceError):
                    continue
                for ci in arr[: count.value]:
                    try:
                        pynvml.nvmlComputeInstanceDestroy(ci)
                    except pynvml.NVMLError_NotFound:
                        pass
            try:
                pynvml.nvmlGpuInstanceDestroy(gi)
            except pynvml.NVMLError_NotFound:
                return False
            except pynvml.NVMLError as e:
                raise _nvml_error(e, f"destroying GPU instance {gi_id} on {gpu}") from e
            return True
