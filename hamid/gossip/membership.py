"""SWIM membership with Lifeguard's refinements, and capacity documents riding on it.

What it owns: the member table (name, address, incarnation, state), the
probe, gossip, push/pull and join/reconnect loops, the suspicion timers and
the local health score, and the table of peers' capacity documents. What it
does not: sockets and frames (``transport``), the ledger (the service hands
in this node's document).

- **Probes.** Every probe interval x (health + 1), the next member in a
  shuffled round-robin gets a ``ping``; no ``ack`` within the probe timeout
  sends ``preq`` to k random members, who ping it and relay the ``ack`` or
  answer ``nack``. No ack by the end of the interval: suspect it. A suspect
  target gets the ``suspect`` update with the ping (buddy system).
- **Suspicion.** A suspected member is dead after a timeout that starts at
  ``max`` and shrinks towards ``min`` with each independent confirmation
  (``params.suspicion_timeout``). Any ``alive`` with a higher incarnation ends it.
  A confirmation is a ``suspect`` update from another accuser (its ``by``).
  A push/pull that merely holds a suspicion is not one: it heard the same
  rumour, and counting it would let anti-entropy shrink every timeout to
  ``min`` before the refutation has spread. A suspicion learnt that way is
  spread with the accuser :data:`NO_ACCUSER`, which confirms nothing.
- **Refutation.** A node that hears itself suspected or dead takes an
  incarnation above it and spreads ``alive``; each refutation also raises its
  health score. Incarnations start at the wall-clock second, so a restarted
  node outranks what the group remembers of its previous life.
- **Local health (Lifeguard).** +1 per missed nack, per failed probe without
  helpers, per refutation, per probe tick the event loop ran late by more
  than the probe timeout and per probe it could not judge (below); -1 per
  successful probe; bounded by ``awareness_max - 1``. It stretches the probe
  interval and the probe timeout (Lifeguard's LHA-Probe).
- **A starved prober accuses nobody.** When this member's own event loop
  woke from a probe's wait later than :data:`LATE_FRACTION` of the probe
  timeout (its process was not scheduled: the node's cores kept busy by
  other work), an ack may be sitting unread: it waits one more probe
  timeout for it, and without it counts the probe as ``late`` (health +1),
  not as a failure, and suspects nobody. Likewise a suspicion whose
  deadline this member reaches late gets one more probe timeout before it
  declares the suspect dead. A machine whose cores are kept
  busy would otherwise have its daemon accuse live members, and a starved
  group accuse each other in a cascade (bench/gossip.py --burn: 98 false
  deaths of 100 at load 7 on 2 cores before this rule).
- **Dissemination.** Updates (``alive``, ``suspect``, ``dead``, ``cap``) are
  piggybacked on pings, acks and gossip frames to ``gossip_nodes`` random
  members every gossip interval, each at most ``retransmit_limit(n)`` times;
  every node re-queues the updates it learns. While nothing is queued the
  gossip loop sleeps.
- **Capacity documents** are pulled, not pushed: a ``cap`` update carries
  only (node, version); a member that lacks that version asks the frame's
  sender (``capreq``), who holds it, and spreads the notice only once the
  document arrived, so whoever announces a version can serve it. Each
  member receives each version about once instead of ``retransmit_limit``
  times (a document of 8 GPUs is ~2.3 KB, a notice ~30 bytes). A request is
  repeated for the same version only after ``DOC_RETRY`` seconds; one still
  missing then is asked again, up to ``DOC_TRIES`` times, of the member that
  announced it and then of random live members (who hold it by then: the
  epidemic is over in about a second), since a lost request or reply would
  otherwise wait for the next push/pull: minutes at thousands of members.
- **Anti-entropy.** Every push/pull interval (scaled with n), a full exchange
  of member states and document versions with one random member (in parts of
  at most half the frame limit each); newer documents are then fetched from
  whoever has them. Dead members are
  gossiped to for ``gossip_to_the_dead`` and reconnected to every
  ``reconnect_interval``, which heals partitions; while this member has no
  live peer it reconnects to up to :data:`ALONE_RECONNECTS` at a time (a
  restarted node finds the group again through the members it knew:
  :meth:`Membership.remember`).
- **Identity** (with a ``signer``: every daemon): what a member says about
  itself (alive, left) and its documents are taken only signed by the key its
  name is pinned to; incarnations and versions an hour ahead of this node's
  clock are refused (:mod:`hamid.gossip.identity`). A new name must also pass
  ``admit`` (under Kubernetes: a Node object's name) and fit under
  ``max_members``. Without a signer (simulations) statements are taken as
  they come.
"""

from __future__ import annotations

import itertools
import math
import random
import time
from collections.abc import Callable
from typing import Any
from dataclasses import dataclass, field

import cbor2
import trio

from ..cluster.changes import ChangeLog
from ..logs import Throttle, get_logger
from ..nodekey import verify
from .broadcast import Broadcasts
from .codec import ALIVE, DEAD, LEFT, STATE_NAMES, SUSPECT
from .identity import Pins, Signer, alive_bytes, inc_ahead, left_bytes, valid_proof, version_ahead
from .params import GossipParams, suspicion_timeout
from .stats import Stats

log = get_logger("gossip")

DOC_RETRY = 1.0  # seconds before the same document version is asked for again (a lost request or reply)
STATE_PART_MAX = 4096  # member entries per push/pull frame (the capreq a part triggers may name each once)
DOC_TRIES = 5  # times a missing version is asked again unprompted; then the next notice or push/pull asks
# A wait that ended more than this fraction of the probe timeout after its time was run by a starved loop: a
# scheduled trio loop wakes within milliseconds of a timer, so half the timeout (250 ms by default) late means
# the process was not running for at least that long, long enough for an ack to lie unread in its socket.
LATE_FRACTION = 0.5
NO_ACCUSER = "*"  # ``by`` of a suspicion learnt by push/pull; not a valid node or host name
ALONE_RECONNECTS = 3  # dead members reconnected to per round while this member has no live peer
WARN_EVERY_S = 60.0  # a refusal of one kind is logged at warning at most this often (each is counted)


@dataclass
class Suspicion:
    start: float
    lo: float
    hi: float
    needed: int
    by: str
    confirmers: set[str] = field(default_factory=set)
    grace: float = 0.0  # added once when this member's loop reached the deadline late (a refutation unread)

    def confirm(self, by: str) -> bool:
        """Count ``by`` as an independent accuser; False when it is not one."""
        if self.by == NO_ACCUSER and by != NO_ACCUSER:
            self.by = by  # the accuser behind a rumour we first had by push/pull
            return False
        if by in (self.by, NO_ACCUSER) or by in self.confirmers or len(self.confirmers) >= self.needed:
            return False
        self.confirmers.add(by)
        return True

    @property
    def deadline(self) -> float:
        return self.start + self.grace + suspicion_timeout(self.lo, self.hi, len(self.confirmers), self.needed)


@dataclass(slots=True)  # one per member in every member's table: n x n objects across a group
class Member:
    name: str
    addr: str
    inc: int
    state: int = ALIVE
    since: float = 0.0  # trio clock of the last state change
    suspicion: Suspicion | None = None
    proof: dict | None = None  # its own signature over its last alive (or, when left, left) statement

    @property
    def state_name(self) -> str:
        return STATE_NAMES[self.state]


class _Waiter:
    __slots__ = ("event", "nacks")

    def __init__(self) -> None:
        self.event = trio.Event()
        self.nacks = 0


class Membership:
    def __init__(self, name: str, addr: str, params: GossipParams, stats: Stats,
                 send: Callable[[str, dict], None], *, seeds: tuple[str, ...] = (),
                 forget: Callable[[str], None] = lambda _a: None, signer: Signer | None = None,
                 admit: Callable[[str], bool] | None = None) -> None:
        """``signer``: this node's identity (hamid.gossip.identity); with it every statement about
        another member must be signed. ``admit``: whether a name may be a member at all."""
        if name == NO_ACCUSER:
            raise ValueError(f"gossip node name {name!r} is reserved; use the node's host or Kubernetes name")
        self.name = name
        self.addr = addr
        self.p = params
        self.stats = stats
        self._send_raw = send
        self._forget = forget
        self.seeds = tuple(s for s in seeds if s != addr)
        self.signer = signer
        self.admit = admit
        self.pins = Pins(params.identity_reset_after)
        self._warn: dict[str, Throttle] = {}  # refusal reason -> its log line's throttle
        self.inc = int(time.time())
        self.me = Member(name, addr, self.inc, ALIVE, 0.0)
        self.members: dict[str, Member] = {name: self.me}
        self.docs: dict[str, dict] = {}  # name -> newest capacity document known
        # names whose live document (live_doc) may have changed: readers (the leader's cluster view)
        # bring their state up to date from it instead of re-reading every member
        self.live_log = ChangeLog()
        # alive and suspect members, kept by every add and state change (n() is asked per frame sent);
        # recounted when the table's size differs from what the count saw (entries put in directly)
        self._n, self._counted_len = 1, 1
        self._suspects: set[str] = set()  # members in SUSPECT: the suspicion loop looks at these only
        self._names: list[str] = []  # the member table's names, for _sample
        self._names_key = (-1, -1)  # (table size, adds and removals) when _names was listed
        self._table_gen = 0  # members added or removed by this class
        self.health = 0
        self._gossip_wake = trio.Event()
        self.broadcasts = Broadcasts(on_add=self._wake_gossip)
        self._seq = itertools.count(random.randrange(1 << 30))
        self._waiters: dict[int, _Waiter] = {}
        self._probe_order: list[str] = []
        self._probe_at = 0
        self._susp_wake = trio.Event()
        self._doc_asked: dict[str, tuple[int, float, str, int]] = {}  # name -> (version asked for, when, of whom, tries)
        self._seeds_pending = set(self.seeds)  # seeds that never answered a push/pull yet
        self._nursery: trio.Nursery | None = None
        self.changes: list[tuple[float, str, str]] = []  # (time, member, state) for tests/bench hooks
        self.on_change: Callable[[str, str], None] | None = None

    # --- public -----------------------------------------------------------

    async def run(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            self.me.since = trio.current_time()
            self._broadcast_alive()
            nursery.start_soon(self._probe_loop)
            nursery.start_soon(self._gossip_loop)
            nursery.start_soon(self._push_pull_loop)
            nursery.start_soon(self._join_loop)
            nursery.start_soon(self._suspicion_loop)
            nursery.start_soon(self._doc_retry_loop)
            task_status.started()

    def set_local_doc(self, doc: dict) -> None:
        """This node's capacity document changed (its version must have grown); signed here."""
        if self.signer is not None:
            doc = dict(doc)
            self.signer.sign_doc(doc)
        self.docs[self.name] = doc
        self.live_log.mark(self.name)
        self.broadcasts.add((self.name, "cap"), {"t": "cap", "n": self.name, "v": doc["version"]})

    def n(self) -> int:
        """Alive and suspect members (us included). Every frame sent asks (the retransmit limit), so the
        count is kept as members come and change state instead of counted per frame (O(n) at 5,000)."""
        if len(self.members) != self._counted_len:
            self._n = sum(1 for m in self.members.values() if m.state in (ALIVE, SUSPECT))
            self._counted_len = len(self.members)
        return self._n

    def by_state(self) -> dict[str, int]:
        out = {s: 0 for s in STATE_NAMES.values()}
        for m in self.members.values():
            out[m.state_name] += 1
        return out

    def live_docs(self) -> dict[str, dict]:
        """Documents of alive and suspect members (a dead member's capacity leaves the view)."""
        return {n: d for n, d in self.docs.items()
                if n in self.members and self.members[n].state in (ALIVE, SUSPECT)}

    def live_doc(self, name: str) -> dict | None:
        """``name``'s document if it is in :meth:`live_docs`, else None (O(1))."""
        m = self.members.get(name)
        return self.docs.get(name) if m is not None and m.state in (ALIVE, SUSPECT) else None

    def live_changes(self, cursor: int | None) -> tuple[int, set[str] | None]:
        """(new cursor, names whose :meth:`live_doc` may have changed since ``cursor``);
        None instead of the names when ``cursor`` is None or too old: read :meth:`live_docs`."""
        view = self.live_log.frozen()
        return view.end, view.since(cursor)

    # --- sending helpers ---------------------------------------------------

    def _send(self, addr: str, msg: dict, extra: list[dict] | None = None) -> None:
        g = list(extra or ())
        g += self.broadcasts.take(self.p.retransmit_limit(self.n()), self.p.piggyback_bytes)
        if g:
            msg["g"] = g
        self._send_raw(addr, msg)

    def _broadcast_alive(self) -> None:
        self.me.inc = self.inc
        self.me.addr = self.addr
        doc = self.docs.get(self.name)
        msg = {"t": "alive", "n": self.name, "a": self.addr, "i": self.inc, "cv": doc["version"] if doc else 0}
        if self.signer is not None:
            self.me.proof = msg["p"] = self.signer.alive(self.name, self.addr, self.inc)
        self.broadcasts.add((self.name, "m"), msg)

    def leave_update(self) -> dict:
        """This node's ``dead`` about itself at a new incarnation (signed): it is leaving."""
        self.inc += 1
        msg = {"t": "dead", "n": self.name, "i": self.inc, "by": self.name}
        if self.signer is not None:
            msg["p"] = self.signer.left(self.name, self.inc)
        return msg

    def remember(self, known: list[tuple[str, str, str | None]]) -> int:
        """Members known from before this node's start ((name, address, key) from the state directory):
        put in the table as dead at incarnation 0, so the reconnect to the dead tries their addresses and
        any alive they sign outranks them, with their keys pinned. How many were taken (up to the cap)."""
        now = trio.current_time()
        taken = 0
        for name, addr, pk in known:
            if name in self.members or name == NO_ACCUSER or len(self.members) >= self.p.max_members:
                continue
            if self.signer is not None:
                if pk is None:
                    continue
                self.pins.load(name, pk, now)
            self.members[name] = Member(name, addr, 0, DEAD, now)
            self._counted_len += 1  # dead: not counted in n()
            self._table_gen += 1
            taken += 1
        return taken

    def known(self) -> list[tuple[str, str, str | None]]:
        """(name, address, pinned key) of every other member in the table, for the state directory."""
        return [(m.name, m.addr, self.pins.get(m.name)) for m in self.members.values() if m.name != self.name]

    def _refuse(self, reason: str, name: str, **detail) -> None:
        """Count (and log) an update about ``name`` that is not taken (see the module's "Identity")."""
        self.stats.refused[reason] += 1
        ready, held = self._warn.setdefault(reason, Throttle(WARN_EVERY_S)).ready()
        if ready:
            log.warning("gossip update refused", reason=reason, member=name, more_since_last=held, **detail)

    def _admissible(self, name: str) -> bool:
        """Whether a name not in the table (or back from dead) may be a member now."""
        if self.admit is not None and not self.admit(name):
            self._refuse("not-a-node", name, why="no Node object of this name")
            return False
        if name not in self.members and len(self.members) >= self.p.max_members:
            self._refuse("cap", name, max_members=self.p.max_members,
                         fix="raise gossipMaxMembers if the cluster has this many nodes")
            return False
        return True

    def _mine(self, proof: Any, data: bytes) -> bool:
        """Whether ``proof`` is this node's own signature over ``data``."""
        signer = self.signer
        return (signer is not None and valid_proof(proof) and proof["pk"] == signer.pk
                and verify(signer.pk, proof["s"], data))

    def _sample(self, k: int, ok: Callable[[Member], bool]) -> list[Member]:
        """Up to ``k`` distinct other members for which ``ok`` holds, uniformly at random, without
        listing every member: a gossip round or an indirect probe at 5,000 members costs a few draws,
        not a pass over the table. Falls back to listing them when few qualify."""
        key = (len(self.members), self._table_gen)
        if self._names_key != key:
            self._names, self._names_key = list(self.members), key
        names = self._names
        picked: dict[str, Member] = {}
        for _ in range(4 * k + 8):
            if len(picked) >= k:
                return list(picked.values())
            name = names[random.randrange(len(names))]
            m = self.members.get(name)
            if m is not None and name != self.name and name not in picked and ok(m):
                picked[name] = m
        pool = [m for m in self.members.values() if m.name != self.name and ok(m)]
        return random.sample(pool, min(len(pool), k))

    def _peers(self, *states: int) -> list[Member]:
        return [m for m in self.members.values() if m.name != self.name and m.state in states]

    def _set_state(self, m: Member, state: int) -> None:
        if m.state != state:
            self._n += (state in (ALIVE, SUSPECT)) - (m.state in (ALIVE, SUSPECT))
            m.state = state
            if state == SUSPECT:
                self._suspects.add(m.name)
            else:
                self._suspects.discard(m.name)
            m.since = trio.current_time()
            self.pins.set_live(m.name, state in (ALIVE, SUSPECT), m.since)
            self.live_log.mark(m.name)
            self.changes.append((time.monotonic(), m.name, STATE_NAMES[state]))
            if len(self.changes) > 1000:
                del self.changes[:500]
            log.info("gossip member", member=m.name, state=STATE_NAMES[state], incarnation=m.inc, addr=m.addr)
            if self.on_change is not None:
                self.on_change(m.name, STATE_NAMES[state])

    def _health(self, delta: int) -> None:
        self.health = max(0, min(self.p.awareness_max - 1, self.health + delta))

    # --- receiving ---------------------------------------------------------

    def on_message(self, msg: dict) -> None:
        for u in msg.get("g") or ():
            self._apply(u, msg["a"])
        t = msg["t"]
        if t == "ping":
            if msg["to"] == self.name:
                self._send(msg["a"], {"t": "ack", "seq": msg["seq"]})
        elif t == "ack":
            w = self._waiters.get(msg["seq"])
            if w is not None:
                w.event.set()
        elif t == "nack":
            w = self._waiters.get(msg["seq"])
            if w is not None:
                w.nacks += 1
        elif t == "preq":
            if self._nursery is not None:
                self._nursery.start_soon(self._relay_probe, msg)
        elif t == "pp":
            self._merge(msg)
            if not msg["reply"] and not msg.get("more"):  # answer a push once its last part arrived
                self._send_state(msg["a"], msg["seq"], msg["join"], reply=True)
            if msg["reply"]:
                self._seeds_pending.discard(msg["a"])
        elif t == "capreq":
            self._answer_capreq(msg)
        elif t == "caps":
            for d in msg["docs"]:
                self._apply_doc(d["node"], d)

    def _apply(self, u: dict, sender: str) -> None:
        t = u["t"]
        if t != "cap" and inc_ahead(u["i"]):
            self._refuse("ahead", u["n"], incarnation=u["i"], sender=sender)
            return
        if t == "alive":
            self._on_alive(u["n"], u["a"], u["i"], u["cv"], u["a"], proof=u.get("p"))
        elif t == "suspect":
            self._on_suspect(u["n"], u["i"], u["by"])
        elif t == "dead":
            self._on_dead(u["n"], u["i"], u["by"], u.get("p"))
        elif t == "cap":  # the sender holds this version: fetch it from there
            self._want_doc(u["n"], u["v"], sender)

    def _refute(self, inc: int) -> None:
        if inc >= self.inc:
            self.inc = inc + 1
        self.stats.refutations += 1
        self._health(+1)
        self._broadcast_alive()
        log.info("gossip refuting", incarnation=self.inc)

    def _on_alive(self, name: str, addr: str, inc: int, cv: int, doc_from: str, spread: bool = True,
                  proof: Any = None) -> None:
        if name == self.name:
            if self.signer is not None and not self._mine(proof, alive_bytes(name, addr, inc, self.signer.pk)):
                if valid_proof(proof) and proof["pk"] != self.signer.pk and inc >= self.inc:
                    # the group holds this name under another key: ours was reset (a wiped state directory)
                    # or a key holder poses as us; either way the members take our key only after that one
                    # has been silent for identity_reset_after (hamid.gossip.identity)
                    self._refuse("identity-self", name, their_key=proof["pk"], our_key=self.signer.pk,
                                 taken_after_s=self.p.identity_reset_after)
                return
            if inc > self.inc or (inc == self.inc and addr != self.addr):
                self._refute(inc)
            return
        m = self.members.get(name)
        if m is not None and inc <= m.inc:
            return
        if (m is None or m.state in (DEAD, LEFT)) and not self._admissible(name):
            return
        if self.signer is not None:
            why, how = self.pins.check_alive(name, addr, inc, proof, trio.current_time())
            if why is not None:
                self._refuse(why, name, incarnation=inc, addr=addr)
                return
            if how in ("rotated", "reset"):
                log.warning("gossip member's identity key changed", member=name, how=how, key=proof["pk"],
                            after_silent_s=self.p.identity_reset_after if how == "reset" else None)
                if self.docs.pop(name, None) is not None:  # signed by the old key: its next one comes
                    self.live_log.mark(name)
        if m is None:
            m = self.members[name] = Member(name, addr, inc, ALIVE, trio.current_time(), proof=proof)
            self._n += 1
            self._counted_len += 1
            self._table_gen += 1
            self.live_log.mark(name)
            self.changes.append((time.monotonic(), name, "alive"))
            log.info("gossip member", member=name, state="alive", incarnation=inc, addr=addr)
            if self.on_change is not None:
                self.on_change(name, "alive")
            self._probe_order.insert(random.randrange(len(self._probe_order) + 1), name)
        else:
            if m.addr != addr:
                self._forget(m.addr)
            m.addr, m.inc, m.suspicion, m.proof = addr, inc, None, proof
            self._set_state(m, ALIVE)
        if spread:
            msg = {"t": "alive", "n": name, "a": addr, "i": inc, "cv": cv}
            if proof is not None:
                msg["p"] = proof
            self.broadcasts.add((name, "m"), msg)
        self._want_doc(name, cv, doc_from)

    def _accused(self, name: str, inc: int):
        """The member a suspect/dead message is about, or None: stale, already
        gone, or about us (then refuted)."""
        if name == self.name:
            if inc >= self.inc:
                self._refute(inc)
            return None
        m = self.members.get(name)
        if m is None or inc < m.inc or m.state in (DEAD, LEFT):
            return None
        return m

    def _on_suspect(self, name: str, inc: int, by: str) -> None:
        m = self._accused(name, inc)
        if m is None:
            return
        if m.state == SUSPECT and m.suspicion is not None:
            if inc == m.inc and m.suspicion.confirm(by):
                self._susp_wake.set()
                self.broadcasts.add((name, "m"), {"t": "suspect", "n": name, "i": inc, "by": by})
            return
        m.inc = inc
        n = self.n()
        lo, hi = self.p.suspicion_bounds(n)
        m.suspicion = Suspicion(trio.current_time(), lo, hi, self.p.confirmations_needed(n), by)
        self._set_state(m, SUSPECT)
        if by == self.name:
            self.stats.suspicions += 1
        self.broadcasts.add((name, "m"), {"t": "suspect", "n": name, "i": inc, "by": by})
        self._susp_wake.set()

    def _on_dead(self, name: str, inc: int, by: str, proof: dict | None = None) -> None:
        if by == name and self.signer is not None:  # "I left": only the node itself says so
            ok = (self._mine(proof, left_bytes(name, inc)) if name == self.name
                  else self.pins.check_left(name, inc, proof))
            if not ok:
                self._refuse("unsigned-left", name, incarnation=inc)
                return
        m = self._accused(name, inc)
        if m is None:
            return
        m.inc, m.suspicion = inc, None
        if by == name:
            m.proof = proof
        self._set_state(m, LEFT if by == name else DEAD)
        msg = {"t": "dead", "n": name, "i": inc, "by": by}
        if by == name and proof is not None:
            msg["p"] = proof
        self.broadcasts.add((name, "m"), msg)
        self._forget(m.addr)

    # --- capacity documents ------------------------------------------------

    def _apply_doc(self, name: str, doc: dict) -> None:
        if name == self.name or doc["node"] != name:
            return
        have = self.docs.get(name)
        if have is not None and have["version"] >= doc["version"]:
            return
        if version_ahead(doc["version"]):
            self._refuse("ahead", name, version=doc["version"])
            return
        if self.signer is not None:
            why = self.pins.check_doc(name, doc) if name in self.members else "unknown"
            if why is not None:  # not signed by the key the member's name is pinned to
                self._refuse("doc-" + why, name, version=doc["version"])
                return
        self.docs[name] = doc
        self.live_log.mark(name)
        self._doc_asked.pop(name, None)
        self.broadcasts.add((name, "cap"), {"t": "cap", "n": name, "v": doc["version"]})

    def _should_ask(self, name: str, version: int, ask: str) -> bool:
        """Whether to request ``name``'s document at ``version`` now (and note that we did)."""
        if version == 0 or name == self.name:
            return False
        if self.signer is not None and name not in self.members:
            return False  # a document is taken only for a member (signed by its key): not asked for either
        have = self.docs.get(name)
        if have is not None and have["version"] >= version:
            return False
        now = trio.current_time()  # trio's clock: the same in the daemon, virtual in simulations
        asked = self._doc_asked.get(name)
        if asked is not None and asked[0] >= version and now - asked[1] < DOC_RETRY:
            return False
        self._doc_asked[name] = (version, now, ask, 0)
        return True

    def _want_doc(self, name: str, version: int, ask: str) -> None:
        if self._should_ask(name, version, ask):
            self._send_raw(ask, {"t": "capreq", "names": [name]})

    def _answer_capreq(self, msg: dict) -> None:
        batch: list[dict] = []
        size = 0
        budget = self.p.max_frame_bytes // 2
        for name in msg["names"]:
            d = self.docs.get(name)
            if d is None:
                continue
            s = len(cbor2.dumps(d))
            if batch and size + s > budget:
                self._send_raw(msg["a"], {"t": "caps", "docs": batch})
                batch, size = [], 0
            batch.append(d)
            size += s
        if batch:
            self._send_raw(msg["a"], {"t": "caps", "docs": batch})

    # --- push/pull -----------------------------------------------------------

    def _state_entries(self) -> list[list]:
        out = []
        for m in self.members.values():
            d = self.docs.get(m.name)
            out.append([m.name, m.addr, m.inc, m.state, d["version"] if d else 0, m.proof])
        return out

    def _merge(self, msg: dict) -> None:
        self.stats.push_pulls += 1
        want = []
        # A seed's answer to our join is the group's own state: learn it, but
        # do not gossip every member back to a group that knows them (one
        # such echo per join, n updates x retransmits, made joins a storm).
        spread = not (msg["join"] and msg["reply"])
        for entry in msg["m"]:
            name, addr, inc, state, cv = entry[:5]
            proof = entry[5] if len(entry) > 5 else None
            if inc_ahead(inc):
                self._refuse("ahead", name, incarnation=inc, sender=msg["a"])
                continue
            if state == ALIVE:
                self._on_alive(name, addr, inc, 0, msg["a"], spread, proof)
            elif state == LEFT:
                if name not in self.members and name != self.name:
                    continue
                self._on_dead(name, inc, name, proof)
            else:  # a remote suspect or dead: suspect it here (memberlist), accuser unknown
                if name not in self.members and name != self.name:
                    continue
                self._on_suspect(name, inc, NO_ACCUSER)
            if self._should_ask(name, cv, msg["a"]):
                want.append(name)
        if want:
            self._send_raw(msg["a"], {"t": "capreq", "names": want})

    def push_pull(self, addr: str, join: bool = False) -> int:
        seq = next(self._seq)
        self._send_state(addr, seq, join, reply=False)
        return seq

    def _send_state(self, addr: str, seq: int, join: bool, *, reply: bool) -> None:
        """Every member's state to ``addr``, in as many ``pp`` frames as half the frame limit allows
        (all but the last marked ``more``: the receiver answers a push after its last part). One frame
        held every member up to ~3,000 members with cloud node names; 5,000 needed ~360 KB."""
        budget = self.p.max_frame_bytes // 2
        parts: list[list[list]] = [[]]
        size = 0
        for e in self._state_entries():
            es = len(e[0].encode()) + len(e[1].encode()) + 32  # CBOR: headers and three integers, at most
            if e[5] is not None:
                es += 2 * 44 + 2 * 66 + 16 if "r" in e[5] else 44 + 66 + 12  # keys, signatures, map keys
            if parts[-1] and (size + es > budget or len(parts[-1]) >= STATE_PART_MAX):
                parts.append([])
                size = 0
            parts[-1].append(e)
            size += es
        for i, part in enumerate(parts):
            msg = {"t": "pp", "seq": seq, "join": join, "reply": reply, "m": part}
            if i < len(parts) - 1:
                msg["more"] = True
                self._send_raw(addr, msg)
            elif reply:
                self._send(addr, msg)  # the last part of an answer carries piggybacked updates, as before
            else:
                self._send_raw(addr, msg)

    # --- loops -------------------------------------------------------------

    def _next_target(self) -> Member | None:
        for _ in range(2):
            while self._probe_at < len(self._probe_order):
                name = self._probe_order[self._probe_at]
                self._probe_at += 1
                m = self.members.get(name)
                if m is not None and m.state in (ALIVE, SUSPECT):
                    return m
            self._probe_order = [m.name for m in self._peers(ALIVE, SUSPECT)]
            random.shuffle(self._probe_order)
            self._probe_at = 0
        return None

    async def _probe_loop(self) -> None:
        next_at = trio.current_time()
        while True:
            interval = self.p.probe_interval * (self.health + 1)
            now = trio.current_time()
            if now - next_at > self.p.probe_timeout:  # the loop itself ran late: we are the slow one
                self._health(+1)
            start = trio.current_time()
            target = self._next_target()
            if target is not None:
                await self._probe(target, start + interval)
            next_at = start + interval
            await trio.sleep_until(next_at)

    def _woke_late(self, due: float) -> bool:
        """Whether this member's loop ran a wait that ended at ``due`` late enough that an ack could have
        arrived unread (see "A starved prober accuses nobody"): by more than LATE_FRACTION of the probe
        timeout as the local health stretches it. So the excuse is bounded: a member that keeps running late
        raises its health, its timeouts grow, and a lag shorter than half of them no longer excuses a probe
        (a member that really died is still suspected by a busy group, later)."""
        return trio.current_time() - due > LATE_FRACTION * self.p.probe_timeout * (self.health + 1)

    async def _probe(self, m: Member, deadline: float) -> None:
        seq = next(self._seq)
        w = self._waiters[seq] = _Waiter()
        timeout = self.p.probe_timeout * (self.health + 1)
        try:
            extra = [{"t": "suspect", "n": m.name, "i": m.inc, "by": self.name}] if m.state == SUSPECT else None
            self._send(m.addr, {"t": "ping", "seq": seq, "to": m.name}, extra)
            due = trio.current_time() + timeout
            with trio.move_on_at(due):
                await w.event.wait()
            if w.event.is_set():
                self.stats.probes["ok"] += 1
                self._health(-1)
                return
            late = self._woke_late(due)
            helpers = self._sample(self.p.indirect_checks, lambda h: h.state == ALIVE and h.name != m.name)
            for h in helpers:
                self._send_raw(h.addr, {"t": "preq", "seq": seq, "to": m.name, "ta": m.addr, "nack": True})
            with trio.move_on_at(max(deadline, trio.current_time() + timeout)):
                await w.event.wait()
            if w.event.is_set():
                self.stats.probes["indirect"] += 1
                return
            if late or self._woke_late(max(deadline, due)):
                with trio.move_on_after(timeout):  # what came while this member was not running is read first
                    await w.event.wait()
                if w.event.is_set():
                    self.stats.probes["indirect"] += 1
                    return
                self._health(+1)
                self.stats.probes["late"] += 1
                log.debug("gossip probe not judged: this member ran late", member=m.name)
                return
            self._health((len(helpers) - w.nacks) if helpers else 1)
            self.stats.probes["failed"] += 1
            cur = self.members.get(m.name)
            if cur is m and m.state in (ALIVE, SUSPECT):
                log.debug("gossip probe failed", member=m.name)
                self._on_suspect(m.name, m.inc, self.name)
        finally:
            del self._waiters[seq]

    async def _relay_probe(self, req: dict) -> None:
        seq = next(self._seq)
        w = self._waiters[seq] = _Waiter()
        try:
            self._send_raw(req["ta"], {"t": "ping", "seq": seq, "to": req["to"]})
            with trio.move_on_after(self.p.probe_timeout):
                await w.event.wait()
        finally:
            del self._waiters[seq]
        if w.event.is_set():
            self._send_raw(req["a"], {"t": "ack", "seq": req["seq"]})
        elif req["nack"]:
            self._send_raw(req["a"], {"t": "nack", "seq": req["seq"]})

    def _wake_gossip(self) -> None:
        self._gossip_wake.set()

    async def _gossip_loop(self) -> None:
        # A ticker with a random phase (memberlist's), except that it sleeps
        # through the ticks while nothing is queued: an idle group neither
        # sends nor wakes for gossip; a queued update goes out on the next tick.
        iv = self.p.gossip_interval
        tick = trio.current_time() + random.uniform(0, iv)
        while True:
            if not len(self.broadcasts):
                self._gossip_wake = trio.Event()
                await self._gossip_wake.wait()
                now = trio.current_time()
                if tick < now:
                    tick += math.ceil((now - tick) / iv) * iv
            await trio.sleep_until(tick)
            now = trio.current_time()
            tick = tick + iv if tick + iv > now else now + iv  # a late round does not bunch the next ones
            if not len(self.broadcasts):
                continue
            targets = self._sample(self.p.gossip_nodes, lambda m: m.state in (ALIVE, SUSPECT) or (
                m.state == DEAD and now - m.since < self.p.gossip_to_the_dead))
            limit = self.p.retransmit_limit(self.n())
            for m in targets:
                g = self.broadcasts.take(limit, self.p.piggyback_bytes)
                if not g:
                    break
                self._send_raw(m.addr, {"t": "gossip", "g": g})

    async def _push_pull_loop(self) -> None:
        await trio.sleep(random.uniform(0.5, 1.5) * self.p.push_pull_interval)
        while True:
            peers = self._peers(ALIVE)
            if peers:
                self.push_pull(random.choice(peers).addr)
            await trio.sleep(self.p.push_pull_scaled(self.n()) * random.uniform(0.9, 1.1))

    async def _join_loop(self) -> None:
        delay = min(1.0, self.p.join_retry_max)
        while True:
            alive_addrs = {m.addr for m in self._peers(ALIVE, SUSPECT)}
            self._seeds_pending -= alive_addrs
            # until each seed has answered once (a seed may start after us), and whenever we are alone
            for s in (self.seeds if not alive_addrs else sorted(self._seeds_pending)):
                self.push_pull(s, join=True)
            now = trio.current_time()
            dead = [m for m in self._peers(DEAD, LEFT)]
            for m in dead:
                if now - m.since > self.p.dead_retention:
                    del self.members[m.name]
                    self._counted_len -= 1  # dead or left: not counted in n()
                    self._table_gen += 1
                    self.docs.pop(m.name, None)
                    self.pins.drop(m.name)
                    self.live_log.mark(m.name)
            dead = [m for m in dead if m.state == DEAD and m.name in self.members]
            # alone (a restarted node whose seeds are gone, or that had none): try several of the members
            # it knew, so one that still runs brings it the group; else one per round, as serf
            for m in random.sample(dead, min(len(dead), 1 if alive_addrs else ALONE_RECONNECTS)):
                self.push_pull(m.addr)
            if self._peers(ALIVE, SUSPECT) and not self._seeds_pending:
                delay = min(1.0, self.p.join_retry_max)
                await trio.sleep(self.p.reconnect_interval * random.uniform(0.8, 1.2))
            else:
                await trio.sleep(delay)
                delay = min(delay * 2, self.p.join_retry_max)

    async def _doc_retry_loop(self) -> None:
        """Ask again for document versions requested ``DOC_RETRY`` ago and still missing."""
        while True:
            await trio.sleep(DOC_RETRY)
            now = trio.current_time()
            again: dict[str, list[str]] = {}
            for name, (version, when, ask, tries) in list(self._doc_asked.items()):
                have = self.docs.get(name)
                if (have is not None and have["version"] >= version) or tries >= DOC_TRIES:
                    del self._doc_asked[name]
                elif now - when >= DOC_RETRY:
                    self._doc_asked[name] = (version, now, ask, tries + 1)
                    if tries:  # the announcer did not answer once more: any live member will do
                        other = self._sample(1, lambda m: m.state == ALIVE and m.name != name)
                        ask = other[0].addr if other else ask
                    again.setdefault(ask, []).append(name)
            for addr, names in again.items():
                self._send_raw(addr, {"t": "capreq", "names": names})

    async def _suspicion_loop(self) -> None:
        while True:
            now = trio.current_time()
            nearest = None
            for name in list(self._suspects):
                m = self.members.get(name)
                if m is None:
                    self._suspects.discard(name)
                    continue
                s = m.suspicion
                if m.state != SUSPECT or s is None:
                    continue
                if now >= s.deadline and not s.grace and self._woke_late(s.deadline):
                    # this member's loop ran late: the suspect's refutation may lie unread; read first
                    s.grace = now - s.deadline + self.p.probe_timeout
                    self._health(+1)
                if now >= s.deadline:
                    m.suspicion = None
                    self.stats.deaths += 1
                    log.info("gossip declaring dead", member=m.name, suspected_for=round(now - s.start, 2),
                             confirmations=len(s.confirmers))
                    self._on_dead(m.name, m.inc, self.name)
                elif nearest is None or s.deadline < nearest:
                    nearest = s.deadline
            self._susp_wake = trio.Event()
            with trio.move_on_at(nearest if nearest is not None else now + 3600):
                await self._susp_wake.wait()
