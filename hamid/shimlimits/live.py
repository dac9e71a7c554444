"""The live part of the containers' limits files, one GPU at a time: the
priority hold lists, whether another container is active, and the sharing
correction.

Owns the daemon's once-a-second pass over the containers that time-share each
GPU (:class:`LivePass`): what each container's file must say now, and writing
it (writer.py) only when it changed. The caller gathers the inputs (who the
containers on a GPU are, their priorities, their processes' host pids from
the host's pid map (hostpids.py), what each one's region says (charged GPU
time, last launch), and NVML's device-wide busy share and busy pids since the
previous pass); this module reads no region and asks no GPU, so the daemon
(NodeCore.priority_pass) and the GPU bench (bench/gpu/limits_bench.py) run the
very same pass.

What a container writes (its region) is never trusted with a decision about
another container. The pids in hold lists and the pids whose busy samples make
a neighbour active come from the host's pid map, never from a region. A
region's launch stamp may only make its neighbours *limited* (to the limit
each booked: harmless if false). A region's charge enters the sharing
correction only while it agrees with NVML (see _untrusted), and the
correction itself stays within 1 .. 1 + SHARE_BOUND, so that no report moves a
neighbour's limit down by more than the correction's own error, nor any
container's up at all.

Hold lists (HAMi's task priority: 0 high, 1 low, unset 1): each container's
file lists, per GPU, the host pids of the processes of the containers on that
GPU with a higher priority, never its own; the shim holds its launches while
one of them runs kernels.

Others active (policy default, HAMi's recent_kernel rule: a container's limit
applies while another container on the GPU launched kernels within
ACTIVE_WINDOW_S, however little GPU time it used): 1 in a container's file
while another container's host pids had a busy NVML sample, or its region's
launch stamp is, within the window, or a busy process of no container of ours
was seen within it; else 0.

The sharing correction (share_milli). Each shim charges its kernels a measured
cost and learns, while its process runs alone, how far that falls from NVML's
busy time for it (limiter.c, k_gap/k_all). While several processes time-share
the GPU, NVML reports every one of them at about the device's busy share (H200,
2026-11-26), so a container that never runs alone never learns: dynamic-shape
inference beside another was charged 38 % for about 70 % of the GPU. The
daemon sees what no shim sees: every container's charged GPU time (its region)
and NVML's device-wide busy time, which time slicing makes the sum of the
containers' true GPU time. While two or more containers are busy on a GPU, all
of them limited and no process of anyone else busy, the pass moves the GPU's
factor f so that the sum of the charges matches the busy time: f <- f *
(busy / sum of charges) (the charges already carry f; one step, within
STEP_MAX, see LEARN_RATE), and writes f into every
container's file on that GPU. The same f for all: one equation (the sum) per
pass cannot tell whose charge is off, and a factor per container would be a
guess; the limit-bound containers then keep their ratio to each other and
their sum is the GPU's true busy time. A pass learns only while the mix is
steady (the same busy containers as in the previous pass, each charging
within STEADY of its previous share): a container that starts or stops has
charged at launch what the GPU runs in the next pass. A new mix starts again
from 1 (a factor learned for other containers says nothing about these).
When fewer than two are busy, or the pass cannot know (NVML did not answer,
a process of nobody's ran, a busy container is not charged, a region is not
trusted), the files say none (0) and the shims' own feedback holds (the shim
learns only alone).

Containers nothing inside limits. A limited container whose busy process has
no installed shim mapped (``unshimmed``, the caller's reading of the kernel's
mappings), whose region charges nothing while it is busy (``uncharged``), or
that charged under half of NVML's busy share while alone on the GPU
(``under-charged``), or whose own region charges over its limit while the
limit applies (``over-limit``) is kept in ``bypassing`` and handed to the
bypass guard (bypass.py), which holds it to its limit by stopping its
processes. While containers share a GPU, NVML cannot tell their GPU time
apart, but the sum of their charges must still account for the device's
busy time: a GPU where it does not (``unaccounted``, see _accounted) is
logged and counted per GPU, and its correction is off.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from hamid.errors import HamidError
from hamid.logs import get_logger
from hamid.shimlimits.bypass import BypassGuard, Use
from hamid.shimlimits.codec import active_window_s, max_hold, share_range
from hamid.shimlimits.writer import write_hold_pids, write_others_active, write_share

log = get_logger("shimlimits")

# A container is busy on a GPU in a pass when it charged at least 2 % of the pass's time there: less is below
# NVML's resolution (whole percent over 1/6..1 s samples), so it neither proves sharing nor moves the sum.
BUSY_MIN = 0.02
# A pass moves f at most by this factor either way, whatever one reading said (a busy share read over a
# stretch that the regions' read did not cover exactly); halfway in log makes that a ratio of 2.25 seen.
STEP_MAX = 1.5
# How far (in log) a pass moves f towards the sum matching the busy time: all the way, within STEP_MAX. Halfway
# (the rate before) was for charges that ran ahead of the GPU; since the shims' schedules follow a GPU that
# falls behind them (limiter.c catch_up), a pass's charges are what the GPU ran, and on the H200 (2026-11-26,
# bench/gpu/results/limits/README.md) the full step held GEMM+GEMM and GEMM+inference at
# 30/70 within 5 points where halfway left the 70 % tenant 5-6 points short at the end of a 10 s run.
LEARN_RATE = 1.0
# NVML's busy share this low says nothing about how the charges compare (idle GPU, rounding): no pass learns.
BUSY_PCT_MIN = 5.0
# A pass learns only when every busy container's charged share is within this factor of its share in the
# previous pass (see _share_for); a limit-bound container's share moves by a few percent between passes.
STEADY = 1.5
# The sharing correction stays within 1 .. 1 + this (share_bounds): the time-slicing overhead a pair pays (7-8 % of
# the GPU on the H200, 2026-11-26: two unlimited tenants summed to 91-92 % of their alone rates), the
# correction's own error. Its sum cannot tell whose report is off, and a tenant may write any charge into
# its region: unbounded, a tenant charging itself a small steady amount drove the factor to 4.0 and a
# neighbour at 30 % down to 7.5 %; bounded, no report moves a neighbour's limit by more than this.
SHARE_BOUND = 0.08
# A region charging more than the device was busy by this many points over a pass is not believed.
OVER_BUSY_PTS = 5.0
# Alone on the GPU (its pids the only busy ones), NVML's busy share is the container's GPU time, and an honest
# shim's charges follow it (it learns its own correction alone): 0.95-1.06 of it in the median over 335 such
# passes recorded on the H100 and H200 (bench/gpu/results/isolation), under half of it in single passes only.
# A region charging under UNDER_RATIO of the busy time, the device at least UNDER_BUSY_PCT busy, is
# under-charged (the same DISAGREE_PASSES rule).
UNDER_RATIO = 0.5
UNDER_BUSY_PCT = 10.0
# A shim holds its container to its limit while the limit applies (force, or the others-active flag in its
# file since the previous pass): a region whose charges over OVER_LIMIT_PASSES such passes running average
# more than its limit + OVER_LIMIT_PTS says its own container runs past its limiter (``over-limit``; a region
# is its own container's, so this is no neighbour's word). The shim's schedule is the container's (all its
# processes') and bounds it to L*W + CREDIT_NS (500 ms) of charges over any W seconds (limiter.c): over 8
# passes at most 6.25 points over. Single passes say nothing: replayed over the recorded honest passes
# (bench/gpu/results/isolation, 1262 of 114 tenants), a shim whose limit had just begun to apply charged up
# to its limit + 27 in one pass and over + 10 three passes running, while the mean over any 8 such passes
# running was at most its limit + 0.8 (over 5: + 9.2).
OVER_LIMIT_PTS = 10.0
OVER_LIMIT_PASSES = 8
# A region is counted untrusted once it disagrees with NVML the same way this many passes running (see
# _share_for). Replayed over the 703 recorded passes of honest tenants in bench/gpu/results/isolation (H200
# 2026-11-29, H100 2026-12-07: GEMM, small kernels, generate(), dynamic shapes, training starting 0-3 s apart),
# one pass counted 82, two passes running 6 (queues filled at a tenant's start), three none.
DISAGREE_PASSES = 3
# While several containers share a GPU, NVML reads each busy process at about the device's busy share, so no
# region can be checked on its own; their sum can: time slicing makes the device's busy time the sum of the
# containers' GPU time, and honest shims' charges summed to 0.79-1.1 of it over any three passes running in
# the 116 such windows recorded (H100 2026-12-07, H200 2026-11-29: GEMM beside small kernels, generate(),
# dynamic shapes, the 20/30/50 trio; 0.60 in single passes). Under UNACCOUNTED_RATIO of it over
# UNACCOUNTED_PASSES passes running, the device at least UNDER_BUSY_PCT busy, a container on it runs kernels
# past its shim (``unaccounted``, counted per GPU: the sum cannot say whose).
UNACCOUNTED_RATIO = 0.6
UNACCOUNTED_PASSES = 3
# What the log says of a region not trusted, by reason
UNTRUSTED_SAYS = {
    "uncharged": "container busy on the GPU with nothing charged: its compute limit is not enforced (no shim in "
                 "its processes, or a region it froze); left out of the sharing correction",
    "over-limit": "container charged more GPU time than its compute limit while the limit applied: its "
                  "processes run past their shim's limiter; held to its limit from outside while the limit applies",
    "under-charged": "container alone on the GPU charged under half of what NVML saw it run: its region is not "
                     "its shim's; held to its limit from outside while the limit applies",
    "unshimmed": "container busy on the GPU with processes that have no shim mapped: its compute limit is not "
                 "enforced from inside, whatever its region says; left out of the sharing correction",
    None: "region not trusted: its charges left out of the sharing correction",
}
# HAMi's recent_kernel window (hamid_limits.h HAMID_LIMITS_ACTIVE_WINDOW_S): a container counts as active
# this long after its last kernels
ACTIVE_WINDOW_S = float(active_window_s())


@dataclass(frozen=True)
class Tenant:
    """One container's use of one GPU, as the caller read it for this pass."""

    limits: str  # the container's limits file on the host
    device: int  # the GPU's index in that file (the container's CUDA ordinal)
    priority: int = 1  # HAMi's: 0 high, 1 low (unset)
    pids: tuple[int, ...] = ()  # host pids of its processes on this GPU, from the host's pid map (hostpids.py)
    charged_ns: int | None = None  # its region's gpu_time_ns on this device (cumulative); None: no region yet
    charged: bool = True  # its shim charges its kernels here (a compute limit, policy not disable)
    last_kernel_ns: int | None = None  # its region's launch stamp (wall clock ns); None: none. Untrusted
    limit_pct: int = 0  # its compute limit on this device (its limits file), for the bypass guard
    # those of ``pids`` with none of the installed shim files mapped (the kernel's list of their mappings,
    # hostpids.maps_any): processes nothing inside limits, whatever their region says
    unshimmed: tuple[int, ...] = ()
    policy: str = "default"  # its limits file's sm_policy: force holds it to its limit alone too


@dataclass(frozen=True)
class GpuReading:
    """NVML's view of one GPU since the previous pass."""

    busy_pct: float | None  # device-wide busy share (nvmlDeviceGetSamples GPU utilization), mean; None: unknown
    busy_pids: frozenset[int] | None = None  # pids with busy samples (process utilization); None: unknown
    pid_busy: Mapping[int, float] | None = None  # pid -> its mean smUtil (%) over the pass; None: unknown


def next_factor(f: float, charged_ns: Sequence[float], interval_ns: float, busy_pct: float) -> float:
    """The factor after one shared pass: ``f`` moved (in log, LEARN_RATE of the way) towards making the sum of
    ``charged_ns`` (each already charged with ``f``) equal ``busy_pct`` of ``interval_ns``, each step within
    STEP_MAX, the result within share_bounds()."""
    total = sum(charged_ns)
    if total <= 0 or interval_ns <= 0:
        raise HamidError(f"next_factor: charges {list(charged_ns)} over {interval_ns} ns: nothing to compare")
    ratio = busy_pct / 100.0 * interval_ns / total
    step = min(STEP_MAX, max(1.0 / STEP_MAX, ratio ** LEARN_RATE))
    lo, hi = share_bounds()
    return min(hi, max(lo, f * step))


def share_bounds() -> tuple[float, float]:
    """The factors a pass may write: 1 up to 1 + SHARE_BOUND, within the file's range. Never under 1: a factor
    under 1 lets every container on the GPU run over its limit, and a tenant that inflates its own charges
    would buy that for all (on the H200, 2026-11-29, a small-kernel neighbour's charges over the busy time
    took a GEMM tenant's factor to its floor and the tenant 5-10 points over its limit)."""
    lo, hi = share_range()
    return max(lo / 1000.0, 1.0), min(hi / 1000.0, 1.0 + SHARE_BOUND)


@dataclass(frozen=True)
class LiveCounts:
    """What the live pass has counted since the daemon started, for /metrics."""

    untrusted: Mapping[str, int]  # reason -> passes in which a region was not trusted
    unaccounted: Mapping[str, int]  # GPU uuid -> passes in which its busy time was not accounted for
    bypass_stops: int  # passes in which the bypass guard held a container stopped
    memory_over_passes: int = 0  # passes in which a container was over its memory limit (memguard.py)
    memory_kills: int = 0  # processes with no shim the memory guard killed


@dataclass
class _Gpu:
    factor: float = 1.0
    mix: frozenset = frozenset()  # the busy containers (file, device) the factor was learned for
    rates: dict = field(default_factory=dict)  # (file, device) -> its charged share in the previous pass
    shared: bool = False
    busy_at: dict = field(default_factory=dict)  # (file, device) -> monotonic s its host pids were last busy
    stranger_at: float | None = None  # monotonic s a busy process of no container of ours was last seen
    # (charged ns, busy ns) of the last passes running in which the same containers shared the GPU, all of
    # them charged and trusted (see _accounted)
    summed: list = field(default_factory=list)
    summed_mix: frozenset = frozenset()
    unaccounted: bool = False  # the last pass found the GPU's busy time not accounted for
    short: bool = False  # this pass alone charged under UNACCOUNTED_RATIO of the busy time: it teaches nothing


@dataclass
class LivePass:
    """The pass's memory between runs: each GPU's factor, each file's last charge reading and what was written."""

    _gpus: dict[str, _Gpu] = field(default_factory=dict)
    _last: dict[tuple[str, int], tuple[float, int]] = field(default_factory=dict)  # (file, dev) -> (t, charged)
    _hold: dict[tuple[str, int], list[int]] = field(default_factory=dict)
    _share: dict[tuple[str, int], int] = field(default_factory=dict)
    _others: dict[tuple[str, int], bool] = field(default_factory=dict)
    _doubted: set = field(default_factory=set)  # (file, device) whose region was not trusted in the last pass
    _disagreed: dict = field(default_factory=dict)  # (file, device) -> (why it disagreed last pass, passes running)
    _had_pids: dict = field(default_factory=dict)  # (file, device) -> whether it had processes on the GPU last pass
    _over: dict = field(default_factory=dict)  # (file, device) -> its charges over its limit (points), passes running
    untrusted: Counter = field(default_factory=Counter)  # reason -> regions not trusted (passes), for /metrics
    unaccounted: Counter = field(default_factory=Counter)  # uuid -> passes its busy time was not accounted for
    # holds the containers in ``bypassing`` to their limits by stopping their processes (bypass.py); None: only
    # counted
    guard: BypassGuard | None = None
    # (file, device) -> why it is held (uncharged, unshimmed, under-charged, over-limit), until it is seen
    # charging as an honest shim does or it leaves: a stopped container charges nothing and shows nothing
    # busy, which is no reason to let it go. An over-limit one is held until it leaves: held, it charges under
    # its limit because it is stopped, not because its limiter works
    bypassing: dict = field(default_factory=dict)

    def counts(self) -> LiveCounts:
        """The pass's counts since start (a copy)."""
        return LiveCounts(dict(self.untrusted), dict(self.unaccounted),
                          self.guard.stops if self.guard is not None else 0)

    def held(self) -> dict[tuple[str, int], str]:
        """The containers (limits file, device index) the pass hands the bypass guard now, and why."""
        return dict(self.bypassing)

    def unaccounted_gpus(self) -> list[str]:
        """The GPUs whose last pass found the sharing containers' charges far short of the busy time."""
        return sorted(u for u, g in self._gpus.items() if g.unaccounted)

    def factor(self, uuid: str) -> float:
        """The GPU's learned factor (1.0 before any shared pass)."""
        return self._gpus.get(uuid, _Gpu()).factor

    def shared(self, uuid: str) -> bool:
        """Whether the last pass found the GPU shared and corrected it."""
        return self._gpus.get(uuid, _Gpu()).shared

    def run(self, now: float, gpus: Mapping[str, tuple[GpuReading, Sequence[Tenant]]], *,
            wall: float | None = None) -> int:
        """One pass at monotonic time ``now`` (s; ``wall``: the wall clock, s, for the regions' launch stamps)
        over ``gpus`` (uuid -> its reading and its tenants); writes what changed; returns how many live fields
        were written."""
        wall = time.time() if wall is None else wall
        written = 0
        seen: set[tuple[str, int]] = set()
        uses: list[Use] = []
        for uuid, (reading, tenants) in gpus.items():
            share = self._share_for(uuid, now, reading, tenants)
            active = self._active(uuid, now, wall, reading, tenants)
            for t in tenants:
                key = (t.limits, t.device)
                seen.add(key)
                own = set(t.pids)
                hold = sorted({p for o in tenants if o.priority < t.priority and o is not t
                               for p in o.pids if p not in own})[:max_hold()]
                if self._hold.get(key) != hold:
                    written += self._write(key, write_hold_pids, hold, self._hold)
                if self._share.get(key) != share:
                    written += self._write(key, write_share, share, self._share)
                stranger = self._gpus[uuid].stranger_at
                others = any(active.get((o.limits, o.device), False) for o in tenants if o is not t) or (
                    stranger is not None and now - stranger < ACTIVE_WINDOW_S)
                if self._others.get(key) != others:
                    written += self._write(key, write_others_active, others, self._others)
                if key in self.bypassing:
                    pid_busy = reading.pid_busy
                    uses.append(Use(key, t.limit_pct, t.policy == "force" or others, t.pids,
                                    None if pid_busy is None else sum(pid_busy.get(p, 0.0) for p in t.pids)))
        self.bypassing = {k: v for k, v in self.bypassing.items() if k in seen}
        if self.guard is not None:
            self.guard.run(now, uses)
        for key in [k for k in set(self._last) | set(self._hold) if k not in seen]:  # containers gone: forgotten
            self._last.pop(key, None)
            self._hold.pop(key, None)
            self._share.pop(key, None)
            self._others.pop(key, None)
            self._doubted.discard(key)
            self._disagreed.pop(key, None)
            self._had_pids.pop(key, None)
            self._over.pop(key, None)
            for g in self._gpus.values():
                g.busy_at.pop(key, None)
        return written

    def _active(self, uuid: str, now: float, wall: float, reading: GpuReading,
                tenants: Sequence[Tenant]) -> dict[tuple[str, int], bool]:
        """Which containers on the GPU launched kernels within ACTIVE_WINDOW_S: their host pids in NVML's busy
        samples (remembered), or their region's launch stamp (a container may claim activity it did not
        have: that only holds its neighbours to their own limits)."""
        g = self._gpus.setdefault(uuid, _Gpu())
        busy = reading.busy_pids or frozenset()
        ours: set[int] = set()
        out = {}
        for t in tenants:
            key = (t.limits, t.device)
            ours.update(t.pids)
            if busy & set(t.pids):
                g.busy_at[key] = now
            at = g.busy_at.get(key)
            stamp = t.last_kernel_ns is not None and 0 <= wall - t.last_kernel_ns / 1e9 < ACTIVE_WINDOW_S
            out[key] = stamp or (at is not None and now - at < ACTIVE_WINDOW_S)
        if busy - ours:
            g.stranger_at = now
        return out

    @staticmethod
    def _write(key: tuple[str, int], fn, value, memo: dict) -> int:
        try:
            fn(key[0], key[1], value)
        except HamidError as e:
            log.warning("live limits not written", limits=key[0], device=key[1], error=str(e))
            return 0
        memo[key] = value
        return 1

    def _share_for(self, uuid: str, now: float, reading: GpuReading, tenants: Sequence[Tenant]) -> int:
        """This pass's share_milli for the GPU's containers (0: none); learns the GPU's factor when it can."""
        g = self._gpus.setdefault(uuid, _Gpu())
        deltas: list[tuple[Tenant, int, float]] = []
        known = True
        doubted = set()
        for t in tenants:
            key = (t.limits, t.device)
            prev = self._last.get(key)
            # a process that left the GPU during the pass was charged for its last kernels before it left
            on_gpu, self._had_pids[key] = bool(t.pids) or self._had_pids.get(key, False), bool(t.pids)
            # NVML saw its processes busy although it has a compute limit: its shim must have charged something
            ran = t.charged and bool(reading.busy_pids and reading.busy_pids & set(t.pids))
            # its pids the only busy ones: NVML's busy share is its GPU time
            alone = ran and reading.busy_pids is not None and reading.busy_pids <= set(t.pids)
            # its limit applied through the whole pass: force, or the others-active flag its file said since the
            # previous pass (the shim reads it, not the daemon's view of this pass)
            applied = t.charged and t.limit_pct > 0 and (t.policy == "force" or self._others.get(key, False))
            over = self._over_limit(key, applied, t, prev, now)
            if t.charged_ns is not None:
                self._last[key] = (now, t.charged_ns)
            if t.charged_ns is None or prev is None or now <= prev[0]:
                known = False  # no region (no shim yet, or none at all) or a new container: no interval yet
                why = "uncharged" if ran and t.charged_ns is None else None
            else:
                why = self._untrusted(t.charged_ns - prev[1], (now - prev[0]) * 1e9, reading, on_gpu, ran, alone)
            if over and why is None:
                why = "over-limit"  # over a window already: counted at once
            if t.charged and reading.busy_pids and reading.busy_pids & set(t.unshimmed):
                why = "unshimmed"  # the kernel's word, not a reading that may trail: counted at once
            # One pass's disagreement only keeps the pass from learning: an honest shim charges a launch when it
            # is made, a queue launched late in one pass runs in the next, and a process that left the GPU was
            # charged before it left. The same disagreement DISAGREE_PASSES passes running, or a count going
            # back, is a forgery: logged and counted.
            was, n = self._disagreed.get(key, (None, 0))
            n = (n + 1 if was == why else 1) if why else 0
            self._disagreed[key] = (why, n)
            agrees = why is None and not t.unshimmed and prev is not None and t.charged_ns is not None and \
                t.charged_ns > prev[1]
            # let go: no compute limit now, or charging as an honest shim does (an under-charger: seen so alone,
            # where NVML can tell)
            if not t.charged or (agrees and self.bypassing.get(key) != "over-limit" and (
                    alone or self.bypassing.get(key) != "under-charged")):
                self.bypassing.pop(key, None)
            if why:
                known = False
                if why not in ("went-back", "unshimmed", "over-limit") and n < DISAGREE_PASSES:
                    continue
                held = key in self.bypassing  # said when it was first counted; its stops are the guard's
                if why in ("uncharged", "unshimmed", "under-charged", "over-limit") and t.limit_pct > 0:
                    self.bypassing[key] = why
                doubted.add(key)
                self.untrusted[why] += 1
                if key not in self._doubted and not held:
                    log.warning(UNTRUSTED_SAYS.get(why, UNTRUSTED_SAYS[None]), gpu=uuid, limits=t.limits,
                                device=t.device, reason=why, pids=list(t.pids),
                                charged_ms=None if prev is None or t.charged_ns is None
                                else round((t.charged_ns - prev[1]) / 1e6, 1),
                                busy_pct=reading.busy_pct)
                continue
            if prev is None or t.charged_ns is None or now <= prev[0]:
                continue
            deltas.append((t, t.charged_ns - prev[1], (now - prev[0]) * 1e9))
        self._doubted = (self._doubted - {(t.limits, t.device) for t in tenants}) | doubted  # warned once a spell
        if self._accounted(uuid, g, reading, tenants, deltas) is False:
            # the correction's sum would learn the missing time and charge it to every honest neighbour
            g.shared, g.mix, g.factor, g.rates = False, frozenset(), 1.0, {}
            return 0
        busy = [(t, d, iv) for t, d, iv in deltas if d >= BUSY_MIN * iv]
        # each container's rate of raw charges: what it charged over the factor its file said during the pass
        # (written by the previous pass; 0: none, the shim's own charges). A new factor moves every charge,
        # and the steadiness below must see the containers' work, not the factor's own step (an unheld
        # container's charges grow with the factor: after a step of 1.5 the next pass was never steady, and
        # the H200's dynamic-shape pairs took a pass longer to settle: 1.0, 1.5, 1.5, 1.61)
        rates = {(t.limits, t.device): d / iv / ((self._share.get((t.limits, t.device)) or 1000) / 1000)
                 for t, d, iv in deltas}
        prev_rates, g.rates = g.rates, rates
        ours = {p for t in tenants for p in t.pids}
        strangers = reading.busy_pids is None or bool(reading.busy_pids - ours)
        g.shared = False
        if len(busy) < 2:
            return 0
        if (not known or strangers or reading.busy_pct is None or reading.busy_pct < BUSY_PCT_MIN
                or not all(t.charged for t, _, _ in busy)):
            return 0
        mix = frozenset((t.limits, t.device) for t, _, _ in busy)
        if mix != g.mix:  # another mix: the factor learned for the last one says nothing about this one
            g.mix, g.factor = mix, 1.0
        # Steady: every busy container's raw charges within STEADY of its rate in the previous pass. A container
        # that starts or stops (or pauses) charges at launch what the GPU runs later, often in the next pass:
        # such a pass compares charges and busy time of different work (measured on the H200: the pass after
        # a tenant stopped saw 24 % charged against 99 % busy).
        steady = all(k in prev_rates and prev_rates[k] > 0 and 1 / STEADY <= r / prev_rates[k] <= STEADY
                     for k, r in rates.items() if k in mix)
        g.shared = True
        # a pass that charged far less than the GPU ran is what an under-charger looks like before its window
        # fills: learning from it would charge the missing time to every honest neighbour
        if steady and not g.short:
            interval = max(iv for _, _, iv in deltas)
            was = g.factor
            g.factor = next_factor(g.factor, [d * interval / iv for _, d, iv in deltas], interval,
                                   reading.busy_pct)
            log.debug("sharing correction", gpu=uuid, busy_pct=round(reading.busy_pct, 1), busy=len(busy),
                      charged_pct=round(100 * sum(d / iv for _, d, iv in deltas), 1),
                      factor=f"{was:.3f}->{g.factor:.3f}")
        return round(g.factor * 1000)

    def _over_limit(self, key: tuple[str, int], applied: bool, t: Tenant, prev: tuple[float, int] | None,
                    now: float) -> bool:
        """Whether the container's own charges averaged over its limit + OVER_LIMIT_PTS through the last
        OVER_LIMIT_PASSES passes, its limit applying in each."""
        if not applied or prev is None or t.charged_ns is None or now <= prev[0] or t.charged_ns < prev[1]:
            self._over.pop(key, None)
            return False
        pts = 100.0 * (t.charged_ns - prev[1]) / ((now - prev[0]) * 1e9) - t.limit_pct
        run = [*self._over.get(key, []), pts][-OVER_LIMIT_PASSES:]
        self._over[key] = run
        return len(run) == OVER_LIMIT_PASSES and sum(run) / len(run) > OVER_LIMIT_PTS

    def _accounted(self, uuid: str, g: _Gpu, reading: GpuReading, tenants: Sequence[Tenant],
                   deltas: Sequence[tuple[Tenant, int, float]]) -> bool | None:
        """Whether the containers sharing the GPU charged its busy time (None: this pass cannot say). Only
        while two or more of them are busy (their host pids in NVML's busy samples), every busy one charged
        and trusted this pass, no stranger busy and the device at least UNDER_BUSY_PCT busy; judged over
        UNACCOUNTED_PASSES such passes running with the same busy containers."""
        busy_pids = reading.busy_pids
        on = frozenset((t.limits, t.device) for t in tenants if busy_pids and busy_pids & set(t.pids))
        have = {(t.limits, t.device): d / iv for t, d, iv in deltas}
        ours = {p for t in tenants for p in t.pids}
        charged = {(t.limits, t.device) for t in tenants if t.charged}
        if (busy_pids is None or reading.busy_pct is None or reading.busy_pct < UNDER_BUSY_PCT
                or busy_pids - ours or len(on) < 2 or not on <= charged or not on <= have.keys()):
            g.summed, g.unaccounted, g.short = [], False, False
            return None
        if on != g.summed_mix:
            g.summed, g.summed_mix = [], on
        interval = max(iv for _, _, iv in deltas)
        g.summed = [*g.summed, (sum(have.values()) * interval, reading.busy_pct / 100.0 * interval)]
        g.short = g.summed[-1][0] < UNACCOUNTED_RATIO * g.summed[-1][1]
        g.summed = g.summed[-UNACCOUNTED_PASSES:]
        if len(g.summed) < UNACCOUNTED_PASSES:
            return None
        charged_ns, busy_ns = (sum(x) for x in zip(*g.summed))
        if charged_ns >= UNACCOUNTED_RATIO * busy_ns:
            g.unaccounted = False
            return True
        self.unaccounted[uuid] += 1
        if not g.unaccounted:
            log.warning("GPU time not accounted for: the containers sharing this GPU charged far less than NVML "
                        "saw it busy, so one of them may run kernels past its shim (NVML cannot tell which while "
                        "they share); the sharing correction is off on this GPU until their charges add up again",
                        gpu=uuid, charged_of_busy=round(charged_ns / busy_ns, 2),
                        busy_pct=round(reading.busy_pct, 1), passes=UNACCOUNTED_PASSES,
                        limits=sorted(k[0] for k in on))
        g.unaccounted = True
        return False

    @staticmethod
    def _untrusted(delta: int, interval_ns: float, reading: GpuReading, on_gpu: bool, ran: bool,
                   alone: bool = False) -> str | None:
        """Why the region's charge over the pass disagrees with NVML (a reason for /metrics), or None. A
        cumulative count that went back; nothing charged while NVML saw the container's processes busy
        (it has a compute limit: no shim, or a frozen region); more GPU time than the device was busy;
        charges while none of the container's processes was on the GPU in this pass or the last (the
        host's pid map of NVML's processes)."""
        if delta < 0:
            return "went-back"
        if delta == 0 and ran:
            return "uncharged"
        if reading.busy_pct is not None and delta > (reading.busy_pct + OVER_BUSY_PTS) / 100.0 * interval_ns:
            return "over-busy"
        if (alone and reading.busy_pct is not None and reading.busy_pct >= UNDER_BUSY_PCT
                and delta < UNDER_RATIO * reading.busy_pct / 100.0 * interval_ns):
            return "under-charged"
        if delta >= BUSY_MIN * interval_ns and not on_gpu:
            return "no-process"
        return None
