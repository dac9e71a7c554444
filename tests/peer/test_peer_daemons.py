"""Two ``hamid run`` processes, each with the peer API on, commit and release
on each other (the test holds the shared key, as each node's leader would),
and a caller without the key or replaying a recorded frame changes nothing."""

from __future__ import annotations

import base64
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
import trio

from simnodes import node_view

from hamid.keyring import Keyring
from hamid.localapi.client import LocalClient
from hamid.node.identity import Owner
from hamid.peer import PeerClient, PeerUnauthenticated, frames
from hamid.peer.server import FRAME_TYPE, PATH
from hamid.placement import place
from hamid.request import parse_docker_env

HAMID = [sys.executable, "-m", "hamid.cli.main"]


from netports import free_port  # noqa: E402 - ports outside the ephemeral range


class Daemon:
    def __init__(self, root: Path, name: str, key_file: Path | None) -> None:
        self.name, self.state = name, root / name
        self.state.mkdir(parents=True)
        self.peer = f"127.0.0.1:{free_port()}"
        cfg = root / f"{name}.yaml"
        cfg.write_text(f"peerListen: {self.peer}\n" + (f"gossipKeyFile: {key_file}\n" if key_file else ""))
        self.log = root / f"{name}.log"
        self.proc = subprocess.Popen([*HAMID, "run", "--config", str(cfg), "--state-dir", str(self.state),
                                      "--metrics-port", "0", "--node-name", name, "--simulate", "T4:2",
                                      "--log-format", "json"],
                                     stdout=subprocess.DEVNULL, stderr=open(self.log, "w"))

    def ready(self) -> "Daemon":
        deadline = time.time() + 30
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(f"{self.name} exited {self.proc.returncode}: {self.log.read_text()[-2000:]}")
            try:
                with LocalClient(self.state, timeout=2) as c:
                    c.status()
                with socket.create_connection(("127.0.0.1", int(self.peer.rsplit(":", 1)[1])), timeout=1):
                    return self
            except Exception:
                time.sleep(0.05)
        raise AssertionError(f"{self.name} did not come up: {self.log.read_text()[-2000:]}")

    def owners(self) -> list[str]:
        with LocalClient(self.state) as c:
            return [r["owner"] for r in c.reservations()]

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def proposal(node: str, uid: str, spec: str):
    request = parse_docker_env({"HAMI_VGPU_SPEC": spec}, uid)
    return Owner("pod", uid, f"default/{uid}"), place(request, [node_view(node, "T4:2")])


async def test_two_daemons_commit_and_release_on_each_other_through_the_peer_api(tmp_path):
    key_file = tmp_path / "gossip.keys"
    fd = os.open(key_file, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    os.write(fd, base64.b64encode(os.urandom(32)) + b"\n")
    os.close(fd)
    keys = Keyring.load(key_file)
    a, b = Daemon(tmp_path, "node-a", key_file), Daemon(tmp_path, "node-b", key_file)
    try:
        await trio.to_thread.run_sync(a.ready)
        await trio.to_thread.run_sync(b.ready)
        async with PeerClient(keys, name="node-a") as leader_a, PeerClient(keys, name="node-b") as leader_b:
            on_b = proposal("node-b", "uid-on-b", "mem=6g")
            on_a = proposal("node-a", "uid-on-a", "mem=3g")
            assert (await leader_a.commit(b.peer, *on_b))["owner"] == "pod:uid-on-b"
            assert (await leader_b.commit(a.peer, *on_a))["owner"] == "pod:uid-on-a"
            assert await trio.to_thread.run_sync(b.owners) == ["pod:uid-on-b"]
            assert await trio.to_thread.run_sync(a.owners) == ["pod:uid-on-a"]
            doc = await leader_a.status(b.peer, node="node-b")
            assert sum(g["memory_used_mib"] for g in doc["gpus"]) == 6144

            # a peer without the key is refused and changes nothing
            async with PeerClient(Keyring([os.urandom(32)])) as stranger:
                with pytest.raises(PeerUnauthenticated):
                    await stranger.release(b.peer, "pod:uid-on-b", node="node-b")
            assert await trio.to_thread.run_sync(b.owners) == ["pod:uid-on-b"]

            # a recorded release frame, replayed after a new commit, is refused
            msg = frames.new_request("release", {"key": "pod:uid-on-b"}, sender="node-a", to="node-b")
            frame = frames.encode_request(frames.Sealer(keys), msg)
            async with httpx.AsyncClient(trust_env=False) as http:
                first = await http.post(f"http://{b.peer}{PATH}", content=frame,
                                        headers={"content-type": FRAME_TYPE})
                assert first.status_code == 200 and await trio.to_thread.run_sync(b.owners) == []
                await leader_a.commit(b.peer, *on_b)
                again = await http.post(f"http://{b.peer}{PATH}", content=frame,
                                        headers={"content-type": FRAME_TYPE})
            answer = frames.decode_answer(frames.Sealer(keys), again.content, msg["id"])
            assert answer["error"] == "replay"
            assert await trio.to_thread.run_sync(b.owners) == ["pod:uid-on-b"]

            assert (await leader_b.release(a.peer, "pod:uid-on-a", node="node-a"))["released"] is True
            assert (await leader_a.release(b.peer, "pod:uid-on-b", node="node-b"))["released"] is True
            assert await trio.to_thread.run_sync(a.owners) == [] and await trio.to_thread.run_sync(b.owners) == []
    finally:
        a.stop()
        b.stop()


def test_a_daemon_without_a_key_does_not_start_the_peer_api(tmp_path):
    d = Daemon(tmp_path, "node-c", None)
    try:
        d.proc.wait(30)
    except subprocess.TimeoutExpired:
        d.stop()
        raise AssertionError("a daemon with peerListen and no key kept running")
    err = d.log.read_text()
    assert d.proc.returncode != 0 and "needs the gossip keyring" in err and "peerInsecure: true" in err, err
