"""Who may speak for a member's name: signed statements and the key each name is pinned to.

What it owns: the bytes a node signs for its own membership statements
(``alive`` at an address and incarnation, ``left`` at an incarnation), for its
capacity documents and for a key rotation; the table of pinned keys (name ->
key, and since when that key has been silent); the rules that decide whether
a statement about a name is the named node's own; and the bound on how far
ahead of this node's clock an incarnation or a document version may be.
What it does not: the member table (``membership``), the key file
(:mod:`hamid.nodekey`).

The gossip keyring is shared by every daemon, so a frame that opens with it
proves only that *some* member sent it. What a member says about itself is
therefore signed with its own Ed25519 key (:mod:`hamid.nodekey`) and carried
with its proof (``p``: the key, the signature, and a rotation when the key
changed), so members relay it verbatim and each checks it:

- **First sight pins the key.** A name's first ``alive`` must be signed by the
  key it carries; that key is then the name's, here and in the known-members
  file (``known``), across restarts.
- **A key changes only with the old key's word** (``r``: the old key's
  signature over the new key, made by ``hamid identity rotate``), **or after
  the old key has been silent** for ``reset_after`` seconds: the name has been
  dead or left, and nothing signed by its key was heard, for that long. That
  is how a node whose state directory was wiped (a new key, no rotation)
  comes back under its name; it is also what a key holder can still do to a
  node that has been down that long (README, "Gossip security").
- **Only a node says it left.** ``dead`` with ``by`` the node itself must be
  signed by its pinned key; ``dead`` from another member is a failure
  verdict (SWIM's), which the live node refutes with a newer signed ``alive``.
- **Documents** carry the node's pinned key (``pk``) and its signature
  (``sig``) over the rest of the document.
- **Nothing from the future.** An incarnation more than :data:`MAX_AHEAD_S`
  seconds ahead of this node's wall clock, or a document version (in
  milliseconds) as far ahead, is refused: both start at the wall clock of the
  node's start (``membership``, ``cluster.capacity.new_version``) and grow by
  one per refutation or change, so only a forgery or a clock an hour wrong
  gets there, and an accepted 2^63-1 would freeze a name for good.
"""

from __future__ import annotations

import base64
import time
from dataclasses import dataclass
from typing import Any

import cbor2

from ..nodekey import NodeIdentity, rotation_bytes, valid_public_key, verify

# Incarnations are wall-clock seconds at a node's start plus one per refutation or leave; clocks of a group
# agree within seconds (NTP). An hour ahead is neither, and still far below what would freeze a name.
MAX_AHEAD_S = 3600
SIG_BYTES = 64


def alive_bytes(name: str, addr: str, inc: int, pk: str) -> bytes:
    return cbor2.dumps(["hamid-gossip-alive/1", name, addr, inc, pk])


def left_bytes(name: str, inc: int) -> bytes:
    return cbor2.dumps(["hamid-gossip-left/1", name, inc])


def doc_bytes(doc: dict) -> bytes:
    """A capacity document as signed: every field but ``sig``, in canonical CBOR (the same bytes after
    any number of relays, whatever order a relay's map keeps)."""
    return cbor2.dumps({k: v for k, v in doc.items() if k != "sig"}, canonical=True)


def inc_ahead(inc: int) -> bool:
    """Whether an incarnation is more than :data:`MAX_AHEAD_S` ahead of this node's clock."""
    return inc > time.time() + MAX_AHEAD_S


def version_ahead(version: int) -> bool:
    """Whether a document version (milliseconds) is more than :data:`MAX_AHEAD_S` ahead of this node's clock."""
    return version > (time.time() + MAX_AHEAD_S) * 1000


def valid_proof(p: Any) -> bool:
    """The shape of a proof as frames carry it: ``{"pk": key, "s": signature[, "r": [old key, signature]]}``."""
    if type(p) is not dict or not valid_public_key(p.get("pk")) or not _sig(p.get("s")):
        return False
    r = p.get("r")
    return r is None or (type(r) is list and len(r) == 2 and valid_public_key(r[0]) and _sig(r[1]))


def _sig(x: Any) -> bool:
    return type(x) is bytes and len(x) == SIG_BYTES


@dataclass(frozen=True)
class Rotation:
    """The old key's word that ``new`` is its successor (``hamid identity rotate`` makes it)."""

    old: str
    sig: bytes


class Signer:
    """This node's side: signs its statements and documents with its identity key."""

    def __init__(self, identity: NodeIdentity, rotation: Rotation | None = None) -> None:
        self.identity = identity
        self.pk = identity.public_b64
        self.rotation = rotation

    def _proof(self, data: bytes) -> dict:
        p: dict[str, Any] = {"pk": self.pk, "s": self.identity.sign(data)}
        if self.rotation is not None:
            p["r"] = [self.rotation.old, self.rotation.sig]
        return p

    def alive(self, name: str, addr: str, inc: int) -> dict:
        return self._proof(alive_bytes(name, addr, inc, self.pk))

    def left(self, name: str, inc: int) -> dict:
        return self._proof(left_bytes(name, inc))

    def sign_doc(self, doc: dict) -> None:
        """Adds ``pk`` and ``sig`` (base64, as ``pk``: documents are shown as JSON by the local API)."""
        doc["pk"] = self.pk
        doc["sig"] = base64.b64encode(self.identity.sign(doc_bytes(doc))).decode()


@dataclass(slots=True)
class Pin:
    pk: str
    quiet_since: float | None  # trio clock since the name was last dead or left; None while it is alive


class Pins:
    """The key each member's name is pinned to, and the rules for statements about a name."""

    def __init__(self, reset_after: float) -> None:
        self.reset_after = reset_after
        self.keys: dict[str, Pin] = {}

    def get(self, name: str) -> str | None:
        pin = self.keys.get(name)
        return pin.pk if pin is not None else None

    def load(self, name: str, pk: str, now: float) -> None:
        """A key known from before this node's start (the known-members file): pinned, and silent only
        from now on, so a key change needs a full ``reset_after`` of this life."""
        if name not in self.keys and valid_public_key(pk):
            self.keys[name] = Pin(pk, now)

    def set_live(self, name: str, live: bool, now: float) -> None:
        pin = self.keys.get(name)
        if pin is None:
            return
        if live:
            pin.quiet_since = None
        elif pin.quiet_since is None:
            pin.quiet_since = now

    def drop(self, name: str) -> None:
        self.keys.pop(name, None)

    def check_alive(self, name: str, addr: str, inc: int, proof: Any, now: float) -> tuple[str | None, str]:
        """(None, how) when ``proof`` shows the ``alive`` is ``name``'s own, pinning its key (``how``:
        "pinned", "same", "rotated" or "reset"); else (why it is refused, "")."""
        if not valid_proof(proof):
            return "unsigned", ""
        pk = proof["pk"]
        if not verify(pk, proof["s"], alive_bytes(name, addr, inc, pk)):
            return "signature", ""
        pin = self.keys.get(name)
        if pin is None:
            self.keys[name] = Pin(pk, None)
            return None, "pinned"
        if pin.pk == pk:
            return None, "same"
        r = proof.get("r")
        if r is not None and r[0] == pin.pk and verify(pin.pk, r[1], rotation_bytes(pk)):
            pin.pk, pin.quiet_since = pk, None
            return None, "rotated"
        if pin.quiet_since is not None and now - pin.quiet_since >= self.reset_after:
            pin.pk, pin.quiet_since = pk, None
            return None, "reset"
        return "identity", ""

    def check_left(self, name: str, inc: int, proof: Any) -> bool:
        """Whether ``proof`` is ``name``'s pinned key saying it left at ``inc``."""
        pk = self.get(name)
        return (pk is not None and valid_proof(proof) and proof["pk"] == pk
                and verify(pk, proof["s"], left_bytes(name, inc)))

    def check_doc(self, name: str, doc: dict) -> str | None:
        """Why ``doc`` is not ``name``'s own document (signed by its pinned key), or None."""
        pk = self.get(name)
        if pk is None:
            return "unknown"
        try:
            raw = doc.get("sig")
            sig = base64.b64decode(raw, validate=True) if isinstance(raw, str) else None
        except ValueError:
            sig = None
        if doc.get("pk") != pk or sig is None or not _sig(sig) or not verify(pk, sig, doc_bytes(doc)):
            return "identity"
        return None
