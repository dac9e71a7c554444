"""The shared informer's event stream (hamid/kube/informer.py), against the API-server stand-in.

The kubelet face acts on every event of its node's pods (a deleted pod's share
is released at once), so the stream must be whole: a subscriber sees the list
and then each change in order, and an object that went while no watch ran (the
watch expired with 410 Gone, the connection was lost, the informer's run ended
and began again) is told as DELETED, with its last state, when the informer
lists again, as client-go's informers do; and a thread left from an ended run
tells nothing.
"""

from __future__ import annotations

import trio

from hamid.kube.client import api_client
from hamid.kube.informer import Informer


def _pod(name: str) -> dict:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": "default"},
            "spec": {"nodeName": "n1", "containers": [{"name": "c", "image": "x"}]}}


def test_a_subscriber_sees_the_list_each_change_and_what_went_while_no_watch_ran(api_server, kubeconfig):
    api = api_client(kubeconfig)
    api_server.create(_pod("a"))
    inf = Informer(api, "/api/v1/pods", name="pods", watch_timeout_s=30,
                   field_selector="spec.nodeName=n1")
    seen: list[tuple[str, str | None]] = []
    events = None

    async def until(last: tuple):
        with trio.fail_after(20):
            async for kind, obj in events:
                seen.append((kind, obj["metadata"]["name"] if obj else None))
                if seen[-1] == last:
                    return

    async def term(body):
        """One run of the informer (a leader's term, a face's life under its supervisor)."""
        async with trio.open_nursery() as nursery:
            await nursery.start(inf.run)
            await body()
            nursery.cancel_scope.cancel()

    async def first():
        await until(("SYNCED", None))
        assert seen == [("RELIST", None), ("LISTED", "a"), ("SYNCED", None)]
        await trio.to_thread.run_sync(api_server.create, _pod("b"))
        await until(("ADDED", "b"))

    async def second():  # a was deleted while nothing watched: told as DELETED when it lists again
        await until(("SYNCED", None))
        # exactly: the first run's thread, still in its watch when a went, told nobody (it stopped with
        # its run); the second run's list told it
        assert seen == [("RELIST", None), ("LISTED", "b"), ("DELETED", "a"), ("SYNCED", None)], seen
        assert inf.get("default/a") is None and inf.get("default/b") is not None

    async def main():
        nonlocal events
        events = inf.subscribe()
        await term(first)
        await trio.to_thread.run_sync(lambda: api_server.delete("Pod", "default", "a", grace_period=0))
        seen.clear()
        await term(second)

    trio.run(main)
