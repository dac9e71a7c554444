"""The gossip service as the daemon runs it: listener, membership, capacity loop.

``GossipService.run`` is a nursery task: it binds the listener, starts the
membership loops, and every ``capacity_interval`` reads this node's view
(through ``read_view``, which the daemon makes a ledger read in a worker
thread) and publishes a new capacity document when its content changed. With
``read_stamp`` (the ledger's change stamp, cheap and non-blocking) the view is
read only when the stamp moved, so an idle node does no ledger read at all. On
cancellation it tells a few peers it is leaving (signed: only a node itself
may say it left). ``cluster_document`` is what the local API serves at
``/v1/cluster``. With ``state_dir`` it keeps the members it knows there
(:mod:`.known`) and, at start, dials them again: a restarted node finds the
group without a seed; its start-up line says how it will be found.
"""

from __future__ import annotations

import os
import random
from collections.abc import Callable

import trio

from ..errors import HamidError
from ..serving import ListenError
from ..logs import get_logger
from ..placement.view import NodeView
from ..cluster.capacity import doc_from_view, new_version, same_content
from .codec import Codec
from ..keyring import Keyring
from ..nodekey import NodeIdentity, load_rotation
from . import known as known_members
from .identity import Rotation, Signer
from .membership import Membership
from .params import GossipParams
from .stats import GossipCollector, Stats
from .relay import RelayTransport
from .transport import Faults, Transport, split_addr

log = get_logger("gossip")

FAULTS_ENV = "HAMID_GOSSIP_FAULTS"
ADMIT_WAIT_S = 10.0  # a list of Nodes arrives within a second; an API server down for longer must not hold gossip


class GossipService:
    def __init__(self, name: str, listen: str, *, params: GossipParams, seeds: tuple[str, ...] = (),
                 advertise: str | None = None, keyring: Keyring | None = None,
                 read_view: Callable[[], NodeView] | None = None, faults: Faults | None = None,
                 view_in_thread: bool = True, read_stamp: Callable[[], object] | None = None,
                 peer_address: str | None = None, extender_address: str | None = None,
                 identity: NodeIdentity | None = None, state_dir: str | os.PathLike | None = None,
                 admit: Callable[[str], bool] | None = None, admit_ready: trio.Event | None = None,
                 relay: tuple[str, int | None] | None = None) -> None:
        """``peer_address``: this node's peer API (``peerAdvertise``), carried in
        its capacity document as ``peer`` so a leader knows where to commit;
        ``identity``: its identity key (:mod:`hamid.nodekey`): its statements and
        documents are signed with it (the public half carried as ``pk``), and
        every other member's must be signed by theirs; ``state_dir``: where the
        known members and a key rotation statement are kept; ``admit``: whether
        a name may be a member (under Kubernetes: a Node's name), answerable once
        ``admit_ready`` is set (the first list of Nodes): joining waits for it,
        at most :data:`ADMIT_WAIT_S`; ``relay``: (socket path, group) with ``frontDir``:
        ``hamid front`` listens on ``listen``, dials the peers and opens the frames, and
        this process serves it that socket (:mod:`.relay`) and opens no TCP port."""
        try:
            self.host, self.port = split_addr(listen)
            for s in seeds:
                split_addr(s)
            if advertise:
                split_addr(advertise)
        except ValueError as e:
            raise HamidError(f"gossip: {e}") from None
        if advertise is None and self.host in ("0.0.0.0", "::", ""):
            raise HamidError(f"gossip: listening on {listen} needs gossipAdvertise (the address peers dial)")
        if relay is not None and advertise is None and self.port == 0:
            raise HamidError(f"gossip: with frontDir hamid front listens on {listen}; its port must be named "
                             "(not 0) or gossipAdvertise set: the daemon tells its peers where it is")
        self.name = name
        self.params = params
        self.advertise = advertise
        self.keyring = keyring
        self.read_view = read_view
        self.peer_address = peer_address
        self.extender_address = extender_address  # the scheduling face's extender (hamid/scheduling), when served
        self.state_dir = state_dir
        signer = None
        if identity is not None:
            rot = load_rotation(state_dir, identity) if state_dir is not None else None
            signer = Signer(identity, Rotation(*rot) if rot is not None else None)
        self._saved_known: list | None = None
        self._admit_ready = admit_ready
        self.read_stamp = read_stamp
        self.view_in_thread = view_in_thread
        self.stats = Stats()
        if faults is None:
            try:
                faults = Faults.parse(os.environ.get(FAULTS_ENV))
            except ValueError as e:
                raise HamidError(str(e)) from None
        self.transport: Transport | RelayTransport
        if relay is not None:
            self.transport = RelayTransport(name, advertise or listen, relay[0], self.stats, group=relay[1],
                                            connect_timeout=params.connect_timeout,
                                            max_frame_bytes=params.max_frame_bytes, on_message=self._on_message)
        else:
            self.transport = Transport(name, advertise or listen, Codec(keyring, params.max_frame_bytes), self.stats,
                                       connect_timeout=params.connect_timeout, on_message=self._on_message,
                                       faults=faults)
        self.membership = Membership(name, self.transport.addr, params, self.stats, self.transport.send,
                                     seeds=tuple(seeds), forget=self.transport.forget, signer=signer,
                                     admit=admit)
        self._doc: dict | None = None
        self._stamp: object = None  # read_stamp() when _doc was built; None: unknown
        self._refresh = trio.Event()
        self.leave_on_exit = True  # False simulates a crash (tests, bench)

    @property
    def addr(self) -> str:
        return self.transport.addr

    def _on_message(self, msg: dict) -> None:
        self.membership.on_message(msg)

    def collector(self) -> GossipCollector:
        return GossipCollector(self.stats, self.membership.by_state, lambda: self.membership.health)

    async def run(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        try:
            async with trio.open_nursery() as nursery:
                try:
                    port = await nursery.start(self.transport.serve, self.host, self.port)
                except* ListenError as group:  # one line for the operator, not a traceback of groups
                    raise ListenError(str(group.exceptions[0])) from None
                if self.advertise is None and self.port == 0:  # an ephemeral port (tests, bench)
                    self.transport.addr = f"{self.host}:{port}"
                    self.membership.addr = self.membership.me.addr = self.transport.addr
                if self.read_view is not None:
                    await self.publish()
                remembered = 0
                if self.state_dir is not None:
                    remembered = self.membership.remember(known_members.load(self.state_dir))
                    self._saved_known = self.membership.known()
                if self._admit_ready is not None:  # else every member is refused until then, and found late
                    with trio.move_on_after(ADMIT_WAIT_S):
                        await self._admit_ready.wait()
                    if not self._admit_ready.is_set():
                        log.warning("gossip joins before the list of Nodes arrived: members are refused until it "
                                    "does (is the API server reachable?)", waited_s=ADMIT_WAIT_S)
                await nursery.start(self.membership.run)
                if self.read_view is not None:
                    nursery.start_soon(self._capacity_loop)
                if self.state_dir is not None:
                    nursery.start_soon(self._known_loop)
                log.info("gossip listening", addr=self.addr, seeds=list(self.membership.seeds),
                         encrypted=self.keyring is not None, signed=self.membership.signer is not None,
                         found_by=self._found_by(remembered))
                task_status.started(self.addr)
        finally:
            if self.state_dir is not None and self._saved_known is not None:
                self._save_known()
            if self.leave_on_exit:
                with trio.CancelScope(shield=True), trio.move_on_after(1.0):
                    await self._leave()
            if isinstance(self.transport, RelayTransport):
                with trio.CancelScope(shield=True):
                    await self.transport.aclose()

    def _found_by(self, remembered: int) -> str:
        """How this node will find the group, or be found (the start-up line says it)."""
        ways = []
        if self.membership.seeds:
            ways.append(f"joining through {len(self.membership.seeds)} seed(s)")
        if remembered:
            ways.append(f"rejoining the {remembered} member(s) it knew ({known_members.FILE_NAME} in the state dir)")
        if not ways:
            return (f"nobody yet: no seeds and no members known; other daemons find this one when they join "
                    f"it (--join {self.addr} there)")
        return "; ".join(ways)

    def _save_known(self) -> None:
        now = self.membership.known()
        if now == self._saved_known or self.state_dir is None:
            return
        try:
            known_members.save(self.state_dir, now)
            self._saved_known = now
        except OSError as e:  # the next round tries again; only a restart needs the file
            log.warning("cannot save the members this node knows", error=e.strerror)

    async def _known_loop(self) -> None:
        """Keep the known members' file current (when the table changed), every reconnect interval."""
        while True:
            await trio.sleep(self.params.reconnect_interval)
            self._save_known()

    async def _leave(self) -> None:
        peers = [m for m in self.membership.members.values() if m.name != self.name and m.state == 0]
        if not peers:
            return
        msg = {"t": "gossip", "g": [self.membership.leave_update()]}
        async with trio.open_nursery() as n:
            for m in random.sample(peers, min(3, len(peers))):
                n.start_soon(self.transport.send_now, m.addr, dict(msg))

    def identity_of(self, node: str) -> str | None:
        """The peer identity key ``node`` gossips while it is a live member, else None."""
        doc = self.membership.live_docs().get(node)
        return doc.get("pk") if doc is not None else None

    async def publish(self) -> None:
        """Read this node's view now and spread a new document if it changed
        (with ``read_stamp``: only if the stamp moved since the last read)."""
        read = self.read_view
        if read is None:
            return  # a member with no GPUs of its own to tell of
        stamp = self.read_stamp() if self.read_stamp is not None else None
        if stamp is not None and stamp == self._stamp and self._doc is not None:
            return
        if self.view_in_thread:
            view = await trio.to_thread.run_sync(read)
        else:
            view = read()
        doc = doc_from_view(view, 0)
        if self.peer_address:
            doc["peer"] = self.peer_address
        if self.extender_address:
            doc["extender"] = self.extender_address
        self._stamp = stamp  # taken before the read: a commit during it moves the stamp again
        if self._doc is not None and same_content(doc, self._doc):
            return
        doc["version"] = max(new_version(), self._doc["version"] + 1 if self._doc else 0)
        self._doc = doc
        self.membership.set_local_doc(doc)

    def poke(self) -> None:
        """Ask for a capacity read before the next interval (a commit happened)."""
        self._refresh.set()

    async def _capacity_loop(self) -> None:
        while True:
            with trio.move_on_after(self.params.capacity_interval):
                await self._refresh.wait()
            self._refresh = trio.Event()
            try:
                await self.publish()
            except Exception as e:  # a ledger read failing must not end gossip
                log.warning("gossip capacity read failed", error=str(e))

    def cluster_document(self) -> dict:
        """Every member known (alive, suspect, dead, left) with its capacity document
        (None for dead and left members: their capacity has left the view)."""
        now = trio.current_time()
        m = self.membership
        members = []
        for mem in sorted(m.members.values(), key=lambda x: x.name):
            live = mem.state in (0, 1)
            doc = m.docs.get(mem.name) if live else None
            members.append({"name": mem.name, "addr": mem.addr, "state": mem.state_name,
                            "incarnation": mem.inc, "self": mem.name == self.name,
                            "since_s": round(now - mem.since, 1), "capacity": doc})
        s = self.stats
        return {"node": self.name, "addr": self.addr, "incarnation": m.inc, "health": m.health,
                "encrypted": self.keyring is not None, "members": members,
                "stats": {"probes": dict(s.probes), "suspicions": s.suspicions, "refutations": s.refutations,
                          "bytes_sent": s.bytes_sent, "bytes_received": s.bytes_received,
                          "dropped": dict(s.dropped)}}
