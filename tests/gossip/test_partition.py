"""A real partition and real packet loss, inside network namespaces this test makes.

Two namespaces joined by a veth pair, two daemons in each. Taking the veth
down splits the group: each half must see the other as dead, and heal
(refute and rejoin through the reconnect loop) once the link is back. Then 10%
of the packets into one namespace are dropped by iptables' statistic match
(``tc netem`` is missing from this kernel): no healthy member may be declared
dead. Needs root, ``ip`` (iproute2) and, for the loss part, ``iptables``.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time

import pytest

from gossipharness import FAST, Node, new_key, sees, start_all, wait_until

pytestmark = [pytest.mark.slow, pytest.mark.root]

if os.geteuid() != 0:
    pytest.skip("network namespaces need root", allow_module_level=True)
if shutil.which("ip") is None:
    pytest.skip("needs ip (Debian package iproute2)", allow_module_level=True)


def sh(*cmd: str) -> None:
    subprocess.run(cmd, check=True, capture_output=True, timeout=30)


@pytest.fixture
def two_namespaces():
    tag = f"{os.getpid() % 100000}"
    na, nb = f"hgA{tag}", f"hgB{tag}"
    va, vb = f"hga{tag}", f"hgb{tag}"
    net = 200 + os.getpid() % 50
    ipa, ipb = f"10.{net}.7.1", f"10.{net}.7.2"
    try:
        sh("ip", "netns", "add", na)
        sh("ip", "netns", "add", nb)
        sh("ip", "link", "add", va, "type", "veth", "peer", "name", vb)
        sh("ip", "link", "set", va, "netns", na)
        sh("ip", "link", "set", vb, "netns", nb)
        for ns, dev, ip in ((na, va, ipa), (nb, vb, ipb)):
            sh("ip", "-n", ns, "addr", "add", f"{ip}/24", "dev", dev)
            sh("ip", "-n", ns, "link", "set", dev, "up")
            sh("ip", "-n", ns, "link", "set", "lo", "up")
    except subprocess.CalledProcessError as e:
        for ns in (na, nb):
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)
        pytest.skip(f"cannot build namespaces here: {e.stderr.decode().strip()}")
    yield {"a": (na, va, ipa), "b": (nb, vb, ipb)}
    for ns in (na, nb):
        subprocess.run(["ip", "netns", "del", ns], capture_output=True)


def _deaths(nodes: list[Node]) -> list[str]:
    out = []
    for n in nodes:
        for line in n.log.read_text().splitlines():
            if '"gossip declaring dead"' in line or ('"gossip member"' in line and '"state": "dead"' in line):
                out.append(f"{n.name}: {line}")
    return out


def test_partition_heals_and_loss_kills_nobody(tmp_path, two_namespaces):
    (na, va, ipa), (nb, _vb, ipb) = two_namespaces["a"], two_namespaces["b"]
    key = new_key()
    cfg = dict(FAST, gossipProbeInterval=0.5, gossipProbeTimeout=0.25)
    a1 = Node(tmp_path, "a1", host=ipa, port=7101, keys=[key], netns=na, config=cfg)
    a2 = Node(tmp_path, "a2", host=ipa, port=7102, keys=[key], netns=na, config=cfg, join=(a1.addr,))
    b1 = Node(tmp_path, "b1", host=ipb, port=7101, keys=[key], netns=nb, config=cfg, join=(a1.addr,))
    b2 = Node(tmp_path, "b2", host=ipb, port=7102, keys=[key], netns=nb, config=cfg, join=(b1.addr,))
    nodes = start_all([a1, a2, b1, b2])
    everyone = {n.name: "alive" for n in nodes}
    try:
        for n in nodes:
            wait_until(lambda n=n: sees(n, everyone), 30, f"{n.name} to see everyone")

        # partition: each half sees the other dead, itself alive
        sh("ip", "-n", na, "link", "set", va, "down")
        split = {"a1": "alive", "a2": "alive", "b1": "dead", "b2": "dead"}
        mirror = {"a1": "dead", "a2": "dead", "b1": "alive", "b2": "alive"}
        for n, want in ((a1, split), (a2, split), (b1, mirror), (b2, mirror)):
            wait_until(lambda n=n, want=want: sees(n, want), 45, f"{n.name} to see the other half dead")
            cap = n.members()
            assert all(cap[m]["capacity"] is None for m, s in want.items() if s == "dead")

        # heal
        sh("ip", "-n", na, "link", "set", va, "up")
        for n in nodes:
            wait_until(lambda n=n: sees(n, everyone) and all(m["capacity"] for m in n.members().values()),
                       45, f"{n.name} to see everyone again after the partition")

        if shutil.which("iptables") is None:
            pytest.skip("partition healed; the loss part needs iptables (Debian package iptables)")
        before = len(_deaths(nodes))
        sh("ip", "netns", "exec", na, "iptables", "-A", "INPUT", "-m", "statistic", "--mode", "random",
           "--probability", "0.1", "-j", "DROP")
        try:
            end = time.monotonic() + 25
            while time.monotonic() < end:
                for n in nodes:
                    st = n.states()
                    assert "dead" not in st.values(), (n.name, st)
                time.sleep(0.5)
        finally:
            sh("ip", "netns", "exec", na, "iptables", "-F", "INPUT")
        assert len(_deaths(nodes)) == before, _deaths(nodes)[before:]
    finally:
        for n in nodes:
            n.stop()
