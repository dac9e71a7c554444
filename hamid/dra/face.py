"""The DRA face: the node's DRA GPUs published as slices, and kubelet's prepare calls answered.

What runs (one trio task each, in the face's own nursery):

- **serving**: the registration and DRA service sockets (:mod:`.plugin`),
  started before anything else so kubelet can prepare as soon as the daemon is
  up; prepare and unprepare calls run one at a time (a claim's reservation is
  made whole before the next is looked at).
- **the pool**: recomputed after every change the node service announces and
  every ``health_interval`` (a GPU's health): the devices' health put on the
  board kubelet's ``NodeWatchResources`` streams read (:mod:`.health`), and
  the slices (:mod:`.slices`) written when they differ (:mod:`.publish`); an
  API server that cannot be reached is tried again, slower.

Which GPUs serve DRA: ``draDevices`` (``all``, or indexes and UUIDs); the
others are the device plugin's. A GPU is never offered through both: the
device plugin leaves the DRA GPUs out of what it advertises to kubelet.

Liveness for the reconciler: a claim reservation is gone when the API server
has no claim of that UID (deleted, or made again under the same name). A
claim kubelet still uses cannot be deleted (its finalizer holds it), so this
only frees what a lost unprepare left behind.
"""

from __future__ import annotations

import re
from typing import Any

import trio

from ..errors import HamidError
from ..kube.rest import AsyncKube, KubeApiError
from ..logs import get_logger
from ..node.dragpus import dra_gpus
from ..node.service import NodeService, Reservation
from ..placement.view import MigSlot
from ..request.model import Defaults
from . import names
from .api import dra_pb2 as pb
from .claims import ClaimError, parse_claim
from .plugin import CLAIM_DEADLINE_S, PluginServers
from .health import HealthBoard
from .prepare import ClaimPreparer, devices_by_name, owner_key
from .publish import SlicePublisher
from .slices import GpuFacts, Pool, pool

log = get_logger("dra")

CLAIMS = f"/apis/{names.GROUP_VERSION}/namespaces/{{ns}}/resourceclaims/{{name}}"
_SEMVER_PART = re.compile(r"[0-9]+")
HEALTH_TIMEOUT_MIN_S = 30
UNHEALTHY = "the device backend reports the GPU unhealthy"
_NAMESPACE = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")
_NAME = re.compile(r"[a-z0-9]([-a-z0-9.]*[a-z0-9])?")


def semver(driver: str | None) -> str | None:
    """NVIDIA's driver version (``580.95.05``) as a semantic version (``580.95.5``); None when unknown."""
    if not driver:
        return None
    parts = driver.strip().split(".")
    if not 1 <= len(parts) <= 3 or not all(_SEMVER_PART.fullmatch(p) for p in parts):
        return None
    parts += ["0"] * (3 - len(parts))
    return ".".join(str(int(p)) for p in parts)


class DraFace:
    name = "dra"

    def __init__(self, node: NodeService, *, kubelet_dir: str, cdi_dir: str, api: Any, devices: str,
                 defaults: Defaults, health_interval: float = 5.0, driver_version: str | None = None) -> None:
        self.node = node
        self.door = node.door()
        self.kubelet_dir = kubelet_dir
        self.api = api
        self.kube: AsyncKube | None = None
        self.devices_spec = devices
        self.gpus: frozenset[str] = frozenset()
        self.defaults = defaults
        self.health_interval = health_interval
        self.driver_version = semver(driver_version)
        self.preparer = ClaimPreparer(self.door, cdi_dir)
        self.servers: PluginServers | None = None
        self.published = trio.Event()  # set after each publication (tests wait on it)
        self.publications = 0
        self.owner_liveness = {"claim": self._claim_alive} if api is not None else {}
        self._calls = trio.Lock()
        self._changed = trio.Event()
        # kubelet hears every device's health at least every health_interval; unheard for 4 of them: Unknown
        self.health = HealthBoard(node.name, refresh_s=health_interval,
                                  timeout_s=max(HEALTH_TIMEOUT_MIN_S, int(4 * health_interval)))

    # --- the pool ----------------------------------------------------------------------

    def pool_now(self) -> Pool:
        """The pool as the ledger and the GPUs' health say now (blocking: the service's threads).

        The other faces' share of a GPU is the ledger's own account of it (``mem_used``,
        ``cores_used``, ``mig_used``: an init container's peak counted once, as the ledger counts
        it) less what the claims hold: the scheduler counts the claims it allocated itself."""
        view = self.door.view()
        health = {g.uuid: g.healthy for g in self.door.gpus()}
        claims: dict[str, dict[str, Any]] = {}
        for r in self.door.reservations():
            if r.kind != "claim":
                continue
            for c in r.decision.containers:
                for d in c.devices:
                    f = claims.setdefault(d.uuid, {"mem": 0, "cores": 0, "excl": False, "mig": set(), "n": 0})
                    f["n"] += 1
                    if d.mig_profile and d.mig_placement is not None:
                        f["mig"].add(MigSlot(d.mig_profile, d.mig_placement))
                        continue
                    f["mem"] += d.mem_mib
                    f["cores"] += d.cores
                    f["excl"] = f["excl"] or d.cores >= 100
        facts = []
        for g in view.gpus:
            if g.uuid not in self.gpus:
                continue
            f = claims.get(g.uuid, {"mem": 0, "cores": 0, "excl": False, "mig": set(), "n": 0})
            ok = health.get(g.uuid, g.healthy)
            facts.append(GpuFacts(view=g, foreign_mem_mib=max(0, g.mem_used - f["mem"]),
                                  foreign_cores=max(0, g.cores_used - f["cores"]),
                                  foreign_exclusive=g.exclusive and not f["excl"],
                                  foreign_shares=max(0, g.shares_used - f["n"]),
                                  foreign_mig=tuple(m for m in g.mig_used if m not in f["mig"]),
                                  health_reason="" if ok else UNHEALTHY))
        return pool(facts, default_mem_mib=self.defaults.memory_mib, default_cores=self.defaults.cores,
                    driver_version=self.driver_version)

    def health_now(self) -> dict[str, str]:
        """Every device name of the DRA GPUs (those left out of the pool too) -> why it is
        unhealthy, "" when healthy (blocking: the service's threads)."""
        health = {g.uuid: g.healthy for g in self.door.gpus()}
        return {name: "" if health.get(g.uuid, g.healthy) else UNHEALTHY
                for name, (g, _, _) in devices_by_name(self.door.view().gpus).items() if g.uuid in self.gpus}

    async def _pool_loop(self, publisher: SlicePublisher | None, task_status=trio.TASK_STATUS_IGNORED) -> None:
        """After every change and every ``health_interval``: the devices' health on the board (kubelet's
        health streams), and the pool published where it changed (with an API server)."""
        task_status.started()
        delay = 1.0
        last: Pool | None = None  # what the server was last made to hold
        while True:
            self._changed = trio.Event()
            try:
                self.health.set(await self.node.run_blocking(self.health_now))
                p = await self.node.run_blocking(self.pool_now)
                if publisher is not None and p != last:
                    await publisher.publish(p)
                    last = p
            except (KubeApiError, HamidError) as e:  # the API server down, or RBAC: try again, slower
                log.warning("cannot publish the DRA pool; trying again", error=str(e)[:500])
                await trio.sleep(delay)
                delay = min(delay * 2, 60.0)
                continue
            delay = 1.0
            self.publications += 1
            self.published.set()
            self.published = trio.Event()
            with trio.move_on_after(self.health_interval):
                await self._changed.wait()

    def _on_change(self, event: str, key: str) -> None:
        if event != "conflict":
            self._changed.set()

    # --- prepare and unprepare ----------------------------------------------------------------

    async def _read_claim(self, claim: pb.Claim) -> dict:
        if not _NAMESPACE.fullmatch(claim.namespace) or not _NAME.fullmatch(claim.name) or len(claim.name) > 253:
            raise ClaimError(f"claim {claim.namespace[:64]!r}/{claim.name[:64]!r}: not a namespace and object name "
                             "(lowercase RFC 1123 label / subdomain)")
        if self.kube is None:
            raise ClaimError("no API server to read the claim from (kubernetes is not configured)")
        try:
            return await self.kube.request("GET", CLAIMS.format(ns=claim.namespace, name=claim.name))
        except KubeApiError as e:
            raise ClaimError(f"claim {claim.namespace}/{claim.name} cannot be read: {e}") from None

    async def _prepare_one(self, claim: pb.Claim) -> pb.NodePrepareResourceResponse:
        got = await self._read_claim(claim)
        alloc = parse_claim(got, node=self.node.name, uid=claim.uid)
        prepared = await self.node.run_blocking(self.preparer.prepare, alloc, self.gpus, event="admitted",
                                                key=owner_key(claim.uid))
        out = pb.NodePrepareResourceResponse()
        for d in prepared:
            dev = out.devices.add(request_names=[d.request], pool_name=self.node.name, device_name=d.device,
                                  cdi_device_ids=list(d.cdi_ids))
            if d.share_id:
                dev.share_id = d.share_id
        log.info("claim prepared", claim=f"{claim.namespace}/{claim.name}", uid=claim.uid,
                 devices=[d.device for d in prepared])
        return out

    async def prepare(self, claims: list[pb.Claim]) -> pb.NodePrepareResourcesResponse:
        resp = pb.NodePrepareResourcesResponse()
        deadline = trio.current_time() + CLAIM_DEADLINE_S  # the whole call, under kubelet's 45 s
        async with self._calls:
            for c in claims:
                try:
                    with trio.fail_at(deadline):
                        resp.claims[c.uid].CopyFrom(await self._prepare_one(c))
                except trio.TooSlowError:
                    resp.claims[c.uid].error = f"claim {c.namespace}/{c.name}: not prepared in {CLAIM_DEADLINE_S:g} s"
                except HamidError as e:
                    log.warning("claim not prepared", claim=f"{c.namespace}/{c.name}", error=str(e)[:500])
                    resp.claims[c.uid].error = str(e)
                except Exception as e:  # a bug must fail this claim, not the call (kubelet drops the whole answer)
                    log.exception("claim prepare failed", claim=f"{c.namespace}/{c.name}")
                    resp.claims[c.uid].error = f"internal error: {type(e).__name__}: {e}"[:1000]
        return resp

    async def unprepare(self, claims: list[pb.Claim]) -> pb.NodeUnprepareResourcesResponse:
        resp = pb.NodeUnprepareResourcesResponse()
        deadline = trio.current_time() + CLAIM_DEADLINE_S
        async with self._calls:
            for c in claims:
                try:
                    with trio.fail_at(deadline):
                        res = await self.node.release(owner_key(c.uid))
                    resp.claims[c.uid].SetInParent()
                    if res is not None:
                        log.info("claim unprepared", claim=f"{c.namespace}/{c.name}", uid=c.uid)
                except trio.TooSlowError:
                    resp.claims[c.uid].error = f"claim {c.namespace}/{c.name}: not released in {CLAIM_DEADLINE_S:g} s"
                except Exception as e:
                    log.exception("claim unprepare failed", claim=f"{c.namespace}/{c.name}")
                    resp.claims[c.uid].error = f"{type(e).__name__}: {e}"[:1000]
        return resp

    # --- liveness ------------------------------------------------------------------------------

    def _claim_alive(self, r: Reservation) -> bool:
        """For the reconciler (blocking): is the claim of ``r`` still at the API server, under its UID?
        An API server that cannot answer raises (the reservation is kept)."""
        from kubernetes.client import CustomObjectsApi
        from kubernetes.client.exceptions import ApiException

        ns, sep, name = (r.name or "").partition("/")
        if not sep:
            return True  # no name recorded: cannot prove it gone
        try:
            got = CustomObjectsApi(self.api).get_namespaced_custom_object(
                names.API_GROUP, names.API_VERSION, ns, "resourceclaims", name, _request_timeout=10)
        except ApiException as e:
            if e.status == 404:
                return False
            raise
        if not isinstance(got, dict):
            raise HamidError(f"the API server answered the read of claim {ns}/{name} with something that is not a "
                             "ResourceClaim")
        return (got.get("metadata") or {}).get("uid") == r.uid

    # --- the face ------------------------------------------------------------------------------

    async def run(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        view = await self.node.view()
        self.gpus = dra_gpus(self.devices_spec, view.gpus)
        token = trio.lowlevel.current_trio_token()
        self.door.use_loop(token)
        self.servers = PluginServers(self.kubelet_dir, token, self.prepare, self.unprepare, self.health)
        self.kube = AsyncKube.of(self.api) if self.api is not None else None
        # the devices on the board before kubelet can ask: a stream's first message lists them all (under load
        # kubelet's first question came before the pool loop's first reading, and heard of no device)
        self.health.set(await self.node.run_blocking(self.health_now))
        try:
            await trio.to_thread.run_sync(self.servers.start)
            log.info("serving kubelet as a DRA driver", driver=names.DRIVER, socket=self.servers.reg_path,
                     gpus=sorted(self.gpus))
            async with trio.open_nursery() as nursery:
                self.node.subscribe(self._on_change)
                await nursery.start(self._pool_loop,
                                    SlicePublisher(self.kube, self.node.name) if self.kube is not None else None)
                task_status.started()
        finally:
            with trio.CancelScope(shield=True):
                await trio.to_thread.run_sync(self.servers.stop)
                if self.kube is not None:
                    await self.kube.aclose()
