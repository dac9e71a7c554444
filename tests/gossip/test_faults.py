"""Frame-level loss and delay through the transport's own fault hook.

Over TCP a lost packet is a late one, so loss is also injected where SWIM
would see it: whole frames dropped or held back. In-process instances on
loopback, small fast parameters.
"""

from __future__ import annotations

import os

import pytest
import trio

from hamid.keyring import Keyring
from hamid.gossip.params import GossipParams
from hamid.gossip.service import GossipService
from hamid.gossip.transport import Faults
from hamid.placement.view import GpuView, NodeView

P = GossipParams(probe_interval=0.4, probe_timeout=0.2, gossip_interval=0.1, push_pull_interval=3,
                 reconnect_interval=1, capacity_interval=0.3, connect_timeout=2)


def _view(name: str) -> NodeView:
    return NodeView(name, (GpuView(uuid=f"GPU-{name}", index=0, name="Tesla T4", mode="hami-core",
                                   mem_total=15360, cores_total=100, shares_total=10),))


async def _cluster(nursery, n: int, faults: Faults | None):
    key = Keyring([os.urandom(16)])
    nodes, scopes, seeds = [], [], ()
    for i in range(n):
        svc = GossipService(f"f{i}", "127.0.0.1:0", params=P, seeds=seeds, keyring=key, faults=faults,
                            read_view=lambda i=i: _view(f"f{i}"), view_in_thread=False)
        scope = trio.CancelScope()

        async def run(svc=svc, scope=scope, task_status=trio.TASK_STATUS_IGNORED):
            with scope:
                await svc.run(task_status=task_status)
        addr = await nursery.start(run)
        seeds = seeds or (addr,)
        nodes.append(svc)
        scopes.append(scope)
    return nodes, scopes


def _all_alive(nodes) -> bool:
    return all(sum(1 for m in s.membership.members.values() if m.state == 0) == len(nodes) for s in nodes)


@pytest.mark.slow
async def test_frame_loss_and_delay_kill_nobody_and_a_crash_is_still_found():
    faults = Faults(loss=0.1, delay=0.02, jitter=0.05)
    async with trio.open_nursery() as nursery:
        nodes, scopes = await _cluster(nursery, 8, faults)
        with trio.fail_after(30):
            while not _all_alive(nodes):
                await trio.sleep(0.1)
        await trio.sleep(15)
        dead = [(s.name, name) for s in nodes for _, name, st in s.membership.changes if st == "dead"]
        assert dead == []
        assert sum(s.stats.dropped["fault"] for s in nodes) > 50  # the hook really dropped frames
        # ...and the protocol had to work for it: direct probes went unanswered
        assert sum(s.stats.probes["failed"] + s.stats.probes["indirect"] for s in nodes) > 0

        victim = nodes[-1]
        victim.leave_on_exit = False
        scopes[-1].cancel()
        with trio.fail_after(40):
            while not all(s.membership.members[victim.name].state == 2 for s in nodes[:-1]):
                await trio.sleep(0.1)
        assert all(victim.name not in s.membership.live_docs() for s in nodes[:-1])
        nursery.cancel_scope.cancel()


async def test_a_member_cut_off_by_total_loss_is_declared_dead_then_refutes_when_heard_again():
    async with trio.open_nursery() as nursery:
        nodes, scopes = await _cluster(nursery, 5, None)
        with trio.fail_after(20):
            while not _all_alive(nodes):
                await trio.sleep(0.05)
        lonely = nodes[-1]
        old_inc = lonely.membership.inc
        lonely.transport.faults = Faults(loss=1.0)  # everything it sends is lost
        with trio.fail_after(30):
            while not all(s.membership.members[lonely.name].state == 2 for s in nodes[:-1]):
                await trio.sleep(0.1)
        lonely.transport.faults = None
        with trio.fail_after(30):
            while not all(s.membership.members[lonely.name].state == 0 for s in nodes[:-1]):
                await trio.sleep(0.1)
        assert lonely.membership.inc > old_inc and lonely.stats.refutations >= 1
        nursery.cancel_scope.cancel()
