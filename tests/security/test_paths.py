"""Nothing a caller sends names a path the node acts on.

A holder of the peer key (every daemon pod holds it) once deleted any file on
any node as root: a peer ``commit`` stored whatever ``details`` it sent, and
``release`` then unlinked the paths in ``details["extra_files"]`` and removed
the directories named by ``details["container_slots"]`` (``../`` escaping the
state directory). Each entry point is tried with ``../``, absolute paths and
symbolic links, and the host is checked untouched.
"""

from __future__ import annotations

import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "peer"))

from peerharness import LedgerNode, new_keyring, serving  # noqa: E402

from hamid.node import layout  # noqa: E402
from hamid.node.identity import Owner, OwnerError  # noqa: E402
from hamid.peer import PeerClient, PeerFace, PeerProtocolError  # noqa: E402


def _victims(tmp_path):
    """A file, a directory with a file in it, and a symbolic link to the directory, outside any state dir."""
    victim_file = tmp_path / "victim-file"
    victim_file.write_text("keep me")
    victim_dir = tmp_path / "victim-dir"
    victim_dir.mkdir()
    (victim_dir / "inside").write_text("keep me too")
    return victim_file, victim_dir


def _intact(victim_file, victim_dir):
    assert victim_file.read_text() == "keep me"
    assert (victim_dir / "inside").read_text() == "keep me too"


@pytest.mark.parametrize("details", [
    {"extra_files": ["{file}"]},
    {"container_slots": {"main": "../../victim-dir"}},
    {"container_slots": {"main": "{dir}"}},
    {"slots": {"main": {}}},
    {"runc_root": "/"},
])
async def test_a_peer_cannot_make_the_node_delete_a_path(tmp_path, details):
    victim_file, victim_dir = _victims(tmp_path)
    details = {k: (v if not isinstance(v, (list, dict, str)) else
                   eval(repr(v).replace("{file}", str(victim_file)).replace("{dir}", str(victim_dir))))
               for k, v in details.items()}
    keys = new_keyring(tmp_path)
    b = LedgerNode(tmp_path, "node-b")
    async with serving(PeerFace(b, keys, "127.0.0.1:0")) as (addr,), PeerClient(keys) as client:
        owner, decision = b.propose("evil")
        with pytest.raises(PeerProtocolError, match="may not be set by a caller") as e:
            await client.commit(addr, owner, decision, details=details)
        assert e.value.kind == "bad-request" and b.owners() == []
        # what a leader really sends is still accepted, and its release touches nothing outside
        await client.commit(addr, owner, decision, details={"placed_by": "gate", "attempt": "a" * 32})
        await client.release(addr, owner.key, node="node-b")
    _intact(victim_file, victim_dir)
    assert b.owners() == []


async def test_a_peer_cannot_name_a_container_that_escapes_the_state_directory(tmp_path):
    victim_file, victim_dir = _victims(tmp_path)
    keys = new_keyring(tmp_path)
    b = LedgerNode(tmp_path, "node-b")
    state = tmp_path / "node-b"
    # the slot of pod uid "x" container "../../../victim-dir" would be containers/x_../../../victim-dir
    (state / "containers" / "x_..").mkdir(parents=True)
    async with serving(PeerFace(b, keys, "127.0.0.1:0")) as (addr,), PeerClient(keys) as client:
        owner, decision = b.propose("x")
        bad = decision.to_dict()
        bad["containers"][0]["name"] = "../../../victim-dir"
        with pytest.raises(PeerProtocolError, match="container name") as e:
            await client.call(addr, "commit", {"owner": owner.to_dict(), "decision": bad}, to="node-b")
        assert e.value.kind == "bad-request" and b.owners() == []
    _intact(victim_file, victim_dir)


def test_release_of_a_poisoned_row_deletes_nothing_outside_the_nodes_own_directories(tmp_path):
    """A row written before these checks (or by a bug) names paths: release
    still removes only the node's own entries, and still finishes."""
    victim_file, victim_dir = _victims(tmp_path)
    b = LedgerNode(tmp_path, "node-b")
    cdi = tmp_path / "cdi"
    cdi.mkdir()
    b.core.own_file_dir(str(cdi))
    (cdi / "hamid.io-vgpu-ok.json").write_text("{}")
    link_dir = cdi / "linked"
    os.symlink(victim_dir, link_dir)
    owner, decision = b.propose("poisoned")
    from hamid.ledger import Details

    b.ledger.commit(owner, decision, details=Details.from_dict({  # a row as a poisoned ledger would hold it
        "extra_files": [str(victim_file), str(cdi / ".." / "victim-file"), str(link_dir / "inside"),
                        str(cdi / "hamid.io-vgpu-ok.json")],
        "container_slots": {decision.containers[0].name: "../../victim-dir"}}))
    assert b.core.release(owner.key) is not None
    _intact(victim_file, victim_dir)
    assert not (cdi / "hamid.io-vgpu-ok.json").exists()  # the face's own file is still cleaned up
    assert b.owners() == []


@pytest.mark.parametrize("name", ["..", ".", "../x", "a/b", "/etc", "", "x\0y", ".hidden", "a" * 256, 7])
def test_every_derived_name_is_one_path_component(name):
    with pytest.raises(layout.LayoutError):
        layout.component(name)
    with pytest.raises(layout.LayoutError):
        layout.region_dir("/var/lib/hamid", name)


def test_pod_slots_are_checked_where_they_are_made():
    assert layout.slot("pod", "uid-1", "main") == "uid-1_main"
    with pytest.raises(layout.LayoutError):
        layout.slot("pod", "uid-1", "../../etc")
    with pytest.raises(OwnerError):
        Owner("pod", "../x")
