"""The Docker face's own loop, in process (no dockerd): what following container starts costs.

Once a second it looks for Docker containers runc has started (``allocated``
-> ``running``). It reads those rows alone: on a Kubernetes node holding a
hundred pods it decoded every reservation each second, beside kubelet's calls.
"""

from __future__ import annotations

import trio
import trio.testing

import hamid.ledger.store as store
from hamid.docker.face import DockerFace
from hamid.ledger import Details
from hamid.node.identity import Owner
from hamid.request import parse_docker_env
from nodeharness import make_node


def test_a_started_container_is_marked_running_and_no_other_row_is_read(tmp_path, monkeypatch):
    d = make_node(tmp_path / "state", simulate="H100:2", deviceSplitCount=40)
    try:
        for i in range(30):  # a node's pods, allocated
            d.ledger.reserve(parse_docker_env({"HAMI_VGPU_SPEC": "mem=100m"}, f"p{i}"),
                             owner=Owner("pod", f"pod{i}", name=f"ns/p{i}"), prepare=lambda r: True)
        runc = tmp_path / "runc"
        for cid, started in (("c1", True), ("c2", False)):  # c2: created, its process not started yet
            (runc / cid).mkdir(parents=True)
            (runc / cid / "state.json").write_text("{}")
            if not started:
                (runc / cid / "exec.fifo").write_text("")
            d.ledger.reserve(parse_docker_env({"HAMI_VGPU_SPEC": "mem=100m"}, cid), owner=Owner("docker", cid),
                             details=Details(container_id=cid, runc_root=str(runc)), prepare=lambda r: True)
        face = DockerFace(d.service, poll_interval=0.2, net_interval=1.0, start_grace=5.0)
        decoded = []
        real_row = store._row
        monkeypatch.setattr(store, "_row", lambda r: decoded.append(r["owner"]) or real_row(r))

        async def main():
            async with trio.open_nursery() as nursery:
                nursery.start_soon(face._follow_starts)
                with trio.fail_after(30):
                    while d.ledger.get("docker:c1").state != "running":
                        await trio.sleep(0.5)
                nursery.cancel_scope.cancel()

        trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0.01))
        assert d.ledger.get("docker:c2").state == "allocated"
        assert decoded and not any(o.startswith("pod:") for o in decoded), sorted(set(decoded))[:5]
    finally:
        d.close()
