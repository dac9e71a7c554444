"""Several real daemons on loopback: join, convergence, death, rejoin, keys.

Every node is a ``hamid run`` process with gossip on 127.0.0.1 (the FAST
parameters of gossipharness); assertions read each daemon's view through its
unix socket and the CLI, the way a user would.
"""

from __future__ import annotations

import pytest

import json
import subprocess

import httpx
from gossipharness import HAMID, Node, new_key, sees, start_all, wait_until
from hamid.localapi.client import LocalClient
from hamid.request import parse_docker_env


def _gpu_used(node: Node, member: str) -> int | None:
    cap = node.members()[member]["capacity"]
    if cap is None:
        return None
    return sum(g["use"][0] for g in cap["gpus"])


@pytest.mark.slow  # several seconds of real time: whole suite only (make test-fast skips it)
def test_join_converge_kill_and_rejoin(tmp_path):
    key = new_key()
    a = Node(tmp_path, "a", keys=[key], simulate="H100:2")
    b = Node(tmp_path, "b", keys=[key], join=(a.addr,), simulate="T4")
    c = Node(tmp_path, "c", keys=[key], join=(b.addr,), simulate="A100")  # joins through a non-seed
    d = Node(tmp_path, "d", keys=[key], join=(a.addr, c.addr), simulate="A30:2")
    nodes = start_all([d, c, b, a])  # seeds start last: joining retries until they answer
    try:
        everyone = {n.name: "alive" for n in nodes}
        for n in nodes:
            wait_until(lambda n=n: sees(n, everyone) and all(m["capacity"] for m in n.members().values()),
                       30, f"{n.name} to see every member with its capacity")

        # a change on b's ledger reaches every view
        req = parse_docker_env({"HAMI_VISIBLE_DEVICES": "0", "HAMI_VGPU_SPEC": "mem=4g,cores=30"}, "job1")
        with LocalClient(b.state) as cl:
            cl.reserve(req.to_dict(), "docker")
        for n in (a, c, d):
            wait_until(lambda n=n: _gpu_used(n, "b") == 4096, 15, f"{n.name} to see b's reservation")

        # the CLI: table and JSON, and plan on the live view
        st = subprocess.run([*HAMID, "status", "--state-dir", str(a.state), "--cluster", "-o", "json"],
                            capture_output=True, text=True, timeout=60)
        assert st.returncode == 0, st.stderr
        doc = json.loads(st.stdout)
        by = {m["name"]: m for m in doc["members"]}
        assert set(by) == {"a", "b", "c", "d"} and doc["members_by_state"] == {"alive": 4}
        assert by["b"]["gpus"][0]["memory_used_mib"] == 4096 and by["b"]["gpus"][0]["name"] == "Tesla T4"
        assert by["d"]["summary"]["gpus"] == 2 and doc["encrypted"] is True
        table = subprocess.run([*HAMID, "status", "--state-dir", str(a.state), "--cluster"],
                               capture_output=True, text=True, timeout=60).stdout
        assert "a (this node)" in table and "4096/15360 MiB" in table and "30/100%" in table
        wl = tmp_path / "wl.yaml"
        wl.write_text("kind: Docker\nname: big\nenv: {HAMI_VGPU_SPEC: mem=30g}\n")
        pl = subprocess.run([*HAMID, "plan", "--live", "--state-dir", str(c.state), "--workload", str(wl),
                             "-o", "json"], capture_output=True, text=True, timeout=60)
        assert pl.returncode == 0, pl.stderr + pl.stdout
        assert json.loads(pl.stdout)[0]["node"] in ("a", "c")  # only H100 and A100 have 30 GiB

        # a killed member is detected everywhere and its capacity leaves the view
        old_inc = a.members()["d"]["incarnation"]
        d.kill()
        for n in (a, b, c):
            wait_until(lambda n=n: n.members()["d"]["state"] == "dead", 30, f"{n.name} to see d dead")
            assert n.members()["d"]["capacity"] is None
        pl = subprocess.run([*HAMID, "plan", "--live", "--state-dir", str(a.state), "--workload", str(wl),
                             "-o", "json"], capture_output=True, text=True, timeout=60)
        assert "d" not in json.dumps(json.loads(pl.stdout)[0].get("reasons", {}))

        # restarted on the same state and port: back, with a higher incarnation
        d.start().ready()
        for n in (a, b, c):
            wait_until(lambda n=n: n.members()["d"]["state"] == "alive" and n.members()["d"]["capacity"],
                       30, f"{n.name} to see d back")
            assert n.members()["d"]["incarnation"] > old_inc

        # a clean stop is a leave, seen at once
        c.stop()
        for n in (a, b, d):
            wait_until(lambda n=n: n.members()["c"]["state"] in ("left", "dead"), 15, f"{n.name} to see c leave")
    finally:
        for n in nodes:
            n.stop()


def test_member_without_the_key_is_kept_out_and_keys_rotate(tmp_path, free_port):
    k1, k2 = new_key(), new_key()
    a = Node(tmp_path, "a", keys=[k1, k2])
    b = Node(tmp_path, "b", keys=[k2, k1], join=(a.addr,))  # sends with k2, a still opens it: rotation
    outsider = Node(tmp_path, "x", keys=[new_key()], join=(a.addr,))
    plain = Node(tmp_path, "p", keys=None, join=(a.addr,))
    nodes = start_all([a, b, outsider, plain])
    try:
        wait_until(lambda: sees(a, {"a": "alive", "b": "alive"}) and sees(b, {"a": "alive", "b": "alive"}),
                   30, "a and b to see each other")
        # the outsiders keep knocking (join retries); give them time, then check
        wait_until(lambda: a.cluster()["stats"]["dropped"].get("key", 0) >= 2, 20, "a to drop keyless frames")
        for n in (a, b):
            assert set(n.members()) == {"a", "b"}
        assert set(outsider.members()) == {"x"} and set(plain.members()) == {"p"}
    finally:
        for n in nodes:
            n.stop()


def test_gossip_metrics_on_the_daemon_registry(tmp_path, free_port):
    a = Node(tmp_path, "a", keys=[new_key()], metrics_port=free_port).start()
    try:
        a.ready()
        text = httpx.get(f"http://127.0.0.1:{free_port}/metrics").text
        assert 'hamid_gossip_members{state="alive"} 1.0' in text
        for name in ("hamid_gossip_probes_total", "hamid_gossip_suspicions_total", "hamid_gossip_refutations_total",
                     "hamid_gossip_sent_bytes_total", "hamid_gossip_received_bytes_total",
                     "hamid_gossip_dropped_frames_total", "hamid_gossip_health_score"):
            assert name in text, name
    finally:
        a.stop()
