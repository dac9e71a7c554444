"""A node's identity is its own: what a holder of the gossip key can no longer say about another node.

The attack these replay (issue 38, item 1): with the shared gossip key, a member announced a live node
``dead`` as if the node had left, then sent a document under its name carrying the attacker's identity
key at version 2^63-1 (taken while the node was ``left``), then ``alive`` at incarnation + 2. Every
daemon then took peer calls signed by the attacker as that node, refused the real node's, and kept the
frozen document until it restarted. Now each node signs what it says about itself (alive, left, its
documents) with its own key, a name's key is pinned at first sight and changes only with the old key's
signature (``hamid identity rotate``) or after the old key has been silent for ``gossipIdentityResetAfter``
(a wiped node), and nothing an hour ahead of this node's clock is taken. Fake members: under Kubernetes
only Node names, and never more than ``gossipMaxMembers``.

Each test drives the real :class:`Membership` with the frames a peer would send (a fake ``send``), on
trio's virtual clock.
"""

from __future__ import annotations

import time

import trio

from hamid.gossip.codec import ALIVE, DEAD, LEFT, check_frame
from hamid.gossip.identity import Rotation, Signer
from hamid.gossip.membership import Membership
from hamid.gossip.params import GossipParams
from hamid.gossip.stats import Stats
from hamid.nodekey import NodeIdentity, load_rotation, rotate

U63_MAX = (1 << 63) - 1


class Speaker:
    """A node as others hear it: its statements signed by its own key (the code a daemon runs)."""

    def __init__(self, name: str, identity: NodeIdentity | None = None, rotation: Rotation | None = None,
                 addr: str | None = None) -> None:
        self.name, self.addr = name, addr or f"{name}:7946"
        self.signer = Signer(identity or NodeIdentity.generate(), rotation)
        self.inc = int(time.time())
        self.version = time.time_ns() // 1_000_000

    @property
    def pk(self) -> str:
        return self.signer.pk

    def alive(self, inc: int | None = None, addr: str | None = None) -> dict:
        inc, addr = inc or self.inc, addr or self.addr
        return {"t": "alive", "n": self.name, "a": addr, "i": inc, "cv": 0,
                "p": self.signer.alive(self.name, addr, inc)}

    def left(self, inc: int) -> dict:
        return {"t": "dead", "n": self.name, "i": inc, "by": self.name, "p": self.signer.left(self.name, inc)}

    def doc(self, version: int | None = None) -> dict:
        self.version = version or self.version + 1
        d = {"node": self.name, "version": self.version, "policy": "spread", "gpus": [], "profiles": {}}
        self.signer.sign_doc(d)
        return d


def frame(sender: str, *updates: dict, t: str = "gossip", **fields) -> dict:
    """A frame as the codec hands it over (checked by the real schema)."""
    return check_frame({"v": 1, "t": t, "f": sender, "a": f"{sender}:7946", "g": list(updates), **fields})


def caps(sender: str, *docs: dict) -> dict:
    return frame(sender, t="caps", docs=list(docs))


def observer(**params) -> Membership:
    """Node "a", as every daemon now runs it: with its own identity."""
    return Membership("a", "a:7946", GossipParams(**params), Stats(), lambda addr, msg: None,
                      signer=Signer(NodeIdentity.generate()))


async def test_the_takeover_of_a_live_node_by_a_gossip_key_holder_is_refused():
    a, b, attacker = observer(), Speaker("b"), Speaker("b", addr="10.6.6.6:7946")  # the attacker poses as b
    a.on_message(frame("b", b.alive()))
    a.on_message(caps("b", b.doc()))
    assert a.members["b"].state == ALIVE and a.live_doc("b")["pk"] == b.pk

    # 1. "b left", said by someone else (unsigned, or signed by another key): b stays alive
    a.on_message(frame("x", {"t": "dead", "n": "b", "i": b.inc + 1, "by": "b"}))
    a.on_message(frame("x", attacker.left(b.inc + 1)))
    assert a.members["b"].state == ALIVE and a.stats.refused["unsigned-left"] == 2
    # 2. a document under b's name with the attacker's key, at the top version and at a plausible one
    a.on_message(caps("x", attacker.doc(U63_MAX)))
    a.on_message(caps("x", attacker.doc(b.version + 5)))
    assert a.live_doc("b")["pk"] == b.pk and a.stats.refused["ahead"] == 1 and a.stats.refused["doc-identity"] == 1
    # 3. alive at incarnation + 2 at the attacker's address, signed by the attacker's key
    a.on_message(frame("x", attacker.alive(b.inc + 2)))
    assert a.members["b"].addr == b.addr and a.members["b"].inc == b.inc and a.stats.refused["identity"] == 1

    # the same while b is dead by another member's verdict (SWIM's failure detection: anyone may say it)
    a.on_message(frame("c", {"t": "dead", "n": "b", "i": b.inc, "by": "c"}))
    assert a.members["b"].state == DEAD
    a.on_message(caps("x", attacker.doc(b.version + 9)))
    a.on_message(frame("x", attacker.alive(b.inc + 3)))
    assert a.members["b"].state == DEAD and a.stats.refused["identity"] == 2
    # the real b refutes with its own signature, and its next document is taken as ever
    a.on_message(frame("b", b.alive(b.inc + 1)))
    a.on_message(caps("b", b.doc()))
    assert a.members["b"].state == ALIVE and a.live_doc("b")["version"] == b.version
    assert a.live_doc("b")["pk"] == b.pk


async def test_what_is_said_about_this_node_by_others_does_not_move_its_incarnation():
    a = observer()
    me = a.inc
    impostor = Speaker("a")
    a.on_message(frame("x", impostor.alive(me + 5)))  # alive "a" signed by another key: not refuted, ignored
    a.on_message(frame("x", {"t": "dead", "n": "a", "i": me + 7, "by": "a"}))  # "a left", unsigned
    assert a.inc == me and a.stats.refused["identity-self"] == 1 and a.stats.refused["unsigned-left"] == 1
    # an accusation from the future would have had this node refute to 2^62 + 1, beyond anyone's bound
    a.on_message(frame("x", {"t": "suspect", "n": "a", "i": 1 << 62, "by": "x"}))
    assert a.inc == me and a.stats.refused["ahead"] == 1
    a.on_message(frame("c", {"t": "suspect", "n": "a", "i": me, "by": "c"}))  # a real suspicion is refuted
    assert a.inc == me + 1


async def test_fake_members_are_refused_by_name_by_signature_and_beyond_the_cap():
    nodes = {"b", "c", "d", "e"}
    a = Membership("a", "a:7946", GossipParams(max_members=4), Stats(), lambda addr, msg: None,
                   signer=Signer(NodeIdentity.generate()), admit=lambda n: n == "a" or n in nodes)
    a.on_message(frame("x", Speaker("gpu-farm-1").alive()))  # not a Node
    assert "gpu-farm-1" not in a.members and a.stats.refused["not-a-node"] == 1
    unsigned = Speaker("b").alive()
    del unsigned["p"]
    a.on_message(frame("x", unsigned))
    forged = Speaker("b").alive()
    forged["p"]["pk"] = Speaker("b").pk  # carries a key that did not sign it
    a.on_message(frame("x", forged))
    assert "b" not in a.members and a.stats.refused["unsigned"] == 1 and a.stats.refused["signature"] == 1
    a.on_message(caps("x", Speaker("b").doc()))  # a document of a name that never was a member
    assert "b" not in a.docs
    for name in ("b", "c", "d", "e"):
        a.on_message(frame(name, Speaker(name).alive()))
    assert set(a.members) == {"a", "b", "c", "d"} and a.stats.refused["cap"] == 1  # e: over the cap


async def test_replayed_and_reordered_statements_change_nothing():
    a, b = observer(), Speaker("b")
    old_alive = b.alive()
    a.on_message(frame("b", old_alive))
    moved = b.alive(b.inc + 1, addr="b2:7946")  # b moved address
    a.on_message(frame("b", moved))
    a.on_message(frame("x", old_alive))  # the old address replayed
    assert (a.members["b"].addr, a.members["b"].inc) == ("b2:7946", b.inc + 1)
    left = b.left(b.inc + 2)
    a.on_message(frame("b", left))
    assert a.members["b"].state == LEFT
    a.on_message(frame("b", b.alive(b.inc + 10)))  # b restarted
    a.on_message(frame("x", left))  # its old leave replayed
    a.on_message(frame("x", moved))
    assert a.members["b"].state == ALIVE and a.members["b"].inc == b.inc + 10
    d6, d7 = b.doc(), b.doc()
    a.on_message(caps("b", d7))
    a.on_message(caps("x", d6))  # reordered: the older version arrives last
    assert a.live_doc("b")["version"] == d7["version"]
    # a push/pull that carries b's leave of the past and a forged entry changes nothing either
    a.on_message(frame("x", t="pp", seq=1, join=False, reply=True,
                       m=[["b", "b:7946", b.inc + 2, LEFT, 0, left["p"]],
                          ["b", "10.6.6.6:7946", b.inc + 11, ALIVE, 0, Speaker("b").alive(b.inc + 11)["p"]]]))
    assert a.members["b"].state == ALIVE and a.members["b"].inc == b.inc + 10


async def test_a_rotated_key_is_taken_with_the_old_keys_word(tmp_path):
    a = observer()
    old = NodeIdentity.load_or_create(tmp_path)
    b = Speaker("b", old)
    a.on_message(frame("b", b.alive()))
    a.on_message(caps("b", b.doc()))
    # hamid identity rotate: a new key file and the old key's signature over it; the restarted daemon carries it
    assert rotate(tmp_path) == (old.public_b64, NodeIdentity.load_or_create(tmp_path).public_b64)
    new = NodeIdentity.load_or_create(tmp_path)
    rot = load_rotation(tmp_path, new)
    assert rot is not None and rot[0] == old.public_b64
    b2 = Speaker("b", new, Rotation(*rot))
    a.on_message(frame("b", b2.alive(b.inc + 1)))
    a.on_message(caps("b", b2.doc(b.version + 10)))
    assert a.members["b"].inc == b.inc + 1 and a.live_doc("b")["pk"] == new.public_b64
    assert a.pins.get("b") == new.public_b64
    a.on_message(caps("b", b.doc(b.version + 20)))  # the old key no longer speaks for b
    assert a.live_doc("b")["pk"] == new.public_b64
    # a rotation statement for another key hands nothing over
    stray = Speaker("b", NodeIdentity.generate(), Rotation(*rot))
    a.on_message(frame("x", stray.alive(b.inc + 2)))
    assert a.pins.get("b") == new.public_b64 and a.stats.refused["identity"] == 1


async def test_a_wiped_node_comes_back_under_its_name_once_its_old_key_was_silent(autojump_clock):
    a = observer(identity_reset_after=600.0)
    b = Speaker("b")
    a.on_message(frame("b", b.alive()))
    a.on_message(frame("b", b.left(b.inc + 1)))  # reinstalled: it left, its state directory went
    wiped = Speaker("b")  # a new key, no rotation statement
    a.on_message(frame("b", wiped.alive(b.inc + 5)))
    assert a.members["b"].state == LEFT and a.stats.refused["identity"] == 1
    await trio.sleep(599)
    a.on_message(frame("b", wiped.alive(b.inc + 6)))
    assert a.members["b"].state == LEFT and a.stats.refused["identity"] == 2
    await trio.sleep(2)
    a.on_message(frame("b", wiped.alive(b.inc + 7)))
    assert a.members["b"].state == ALIVE and a.pins.get("b") == wiped.pk
    a.on_message(caps("b", wiped.doc()))
    assert a.live_doc("b")["pk"] == wiped.pk

    # a live node's silence is not counted from a false death it refuted
    c = Speaker("c")
    a.on_message(frame("c", c.alive()))
    a.on_message(frame("x", {"t": "dead", "n": "c", "i": c.inc, "by": "x"}))
    await trio.sleep(300)
    a.on_message(frame("c", c.alive(c.inc + 1)))  # c refutes
    await trio.sleep(300)
    a.on_message(frame("x", {"t": "dead", "n": "c", "i": c.inc + 1, "by": "x"}))
    await trio.sleep(301)
    a.on_message(frame("x", Speaker("c").alive(c.inc + 2)))
    assert a.pins.get("c") == c.pk and a.members["c"].state == DEAD


async def test_the_known_members_keep_their_keys_across_a_restart(tmp_path, autojump_clock):
    from hamid.gossip import known

    a, b = observer(), Speaker("b")
    a.on_message(frame("b", b.alive()))
    known.save(tmp_path, a.known())
    restarted = observer()
    assert restarted.remember(known.load(tmp_path)) == 1
    assert restarted.members["b"].state == DEAD and restarted.pins.get("b") == b.pk
    restarted.on_message(frame("x", Speaker("b").alive(b.inc + 1)))  # another key right after the restart
    assert restarted.members["b"].state == DEAD
    restarted.on_message(frame("b", b.alive()))  # b itself, at the incarnation it had
    assert restarted.members["b"].state == ALIVE


def test_hamid_identity_rotate_replaces_the_key_and_keeps_the_old_keys_word(tmp_path):
    import subprocess
    import sys

    old = NodeIdentity.load_or_create(tmp_path).public_b64
    p = subprocess.run([sys.executable, "-m", "hamid.cli.main", "identity", "rotate", "--state-dir", str(tmp_path)],
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    new = NodeIdentity.load_or_create(tmp_path)
    assert new.public_b64 != old and f"{old} -> {new.public_b64}" in p.stdout and "restart the daemon" in p.stdout
    assert load_rotation(tmp_path, new)[0] == old
    assert oct((tmp_path / "peer-identity.rotation").stat().st_mode & 0o777) == "0o600"
    missing = subprocess.run([sys.executable, "-m", "hamid.cli.main", "identity", "rotate", "--state-dir",
                              str(tmp_path / "nope")], capture_output=True, text=True, timeout=60)
    assert missing.returncode == 1 and "no state dir" in missing.stderr


def test_under_kubernetes_only_node_names_become_members(api_server, kubeconfig):
    """The daemon's admission rule (hamid/kube/nodes.py) against the API-server stand-in: a made-up
    name is refused, a Node's name is taken, and a Node created later is taken once the watch saw it."""
    from hamid.kube.client import api_client
    from hamid.kube.nodes import NodeNames

    def node(name: str) -> dict:
        return {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name}}

    api_server.create(node("gpu-1"))
    nodes = NodeNames(api_client(kubeconfig))

    async def main():
        a = Membership("a", "a:7946", GossipParams(), Stats(), lambda addr, msg: None,
                       signer=Signer(NodeIdentity.generate()), admit=nodes.is_node)
        async with trio.open_nursery() as nursery:
            await nursery.start(nodes.run)
            assert not nodes.is_node("gpu-1")  # before the first list: nobody (gossip waits for it)
            with trio.fail_after(20):
                await nodes.informer.synced.wait()
            a.on_message(frame("gpu-1", Speaker("gpu-1").alive()))
            a.on_message(frame("x", Speaker("gpu-farm-7").alive()))
            assert "gpu-1" in a.members and "gpu-farm-7" not in a.members and a.stats.refused["not-a-node"] == 1
            await trio.to_thread.run_sync(api_server.create, node("gpu-2"))
            with trio.fail_after(20):
                while not nodes.is_node("gpu-2"):
                    await trio.sleep(0.05)
            a.on_message(frame("gpu-2", Speaker("gpu-2").alive()))
            assert "gpu-2" in a.members
            nursery.cancel_scope.cancel()

    trio.run(main)
