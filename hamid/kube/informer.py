"""A cache of one kind of Kubernetes object, kept current by list and watch.

What client-go calls an informer, small: it lists the objects, then watches
from the list's ``resourceVersion`` (with bookmarks), resuming where it left
off and listing again on ``410 Gone``; the cache is a dict by
``namespace/name`` read at any time (from worker threads too), and every
change sets a trio event so a controller can wake. A face that must act on
each event (the kubelet face releases a deleted pod's share at once)
subscribes to the event stream (:meth:`Informer.subscribe`): ``RELIST``,
``LISTED`` per object and ``SYNCED`` after each list, then
``ADDED``/``MODIFIED``/``DELETED``.

The list and the watch run on the event loop through :class:`~.rest.AsyncKube`
(plain JSON, no worker thread, no generated models): an event costs one JSON
parse and a dict update, with no hop between threads. When
:meth:`Informer.run` ends (a leader's term ends, the daemon stops) the watch
is cancelled with it, so nothing is told after its run.
"""

from __future__ import annotations

import threading
from typing import Any

import trio

from ..logs import get_logger
from .rest import AsyncKube, KubeApiError

log = get_logger("informer")

LIST_TIMEOUT_S = 60.0  # a LIST of every pod of a large cluster takes seconds; a minute is a server in trouble
RETRY_S = 1.0  # after a failed list or a lost watch: the API server restarting is back within seconds
_SELECTORS = {"field_selector": "fieldSelector", "label_selector": "labelSelector"}


def key_of(obj: dict) -> str:
    m = obj.get("metadata") or {}
    return f"{m.get('namespace') or ''}/{m.get('name')}"


class Informer:
    """``source``: an :class:`~.rest.AsyncKube`, or the official ``ApiClient`` (an AsyncKube of its
    configuration is made, and closed when :meth:`run` ends); ``path``: the collection, e.g.
    ``/api/v1/pods``; ``field_selector``/``label_selector`` as the API takes them."""

    def __init__(self, source, path: str, *, name: str, watch_timeout_s: int = 300, **selectors: str) -> None:
        bad = set(selectors) - set(_SELECTORS)
        if bad:
            raise TypeError(f"Informer: unknown selector(s) {sorted(bad)}; accepted: {sorted(_SELECTORS)}")
        self.source = source
        self.path = path
        self.name = name
        self.query = {_SELECTORS[k]: v for k, v in selectors.items() if v}
        self.watch_timeout_s = watch_timeout_s
        self.objects: dict[str, dict[str, Any]] = {}
        self.synced = trio.Event()
        self._changed = trio.Event()
        self._lock = threading.Lock()  # readers in worker threads see whole updates
        self.version = 0  # bumped on every change seen
        self._dirty: set[str] | None = set()  # keys changed since take_changed(); None: everything (a relist)
        self.watching = False  # the watch loop runs (tests)
        self._subscribers: list[trio.MemorySendChannel] = []
        self._relist = False  # a subscriber fell behind: list again so it sees every object anew

    def subscribe(self, buffer: int = 10000) -> trio.MemoryReceiveChannel:
        """Every event from now on, in order. A subscriber more than ``buffer``
        events behind makes the informer list again (it then gets ``RELIST`` and
        every object, never a gap it does not know of)."""
        send, receive = trio.open_memory_channel(buffer)
        self._subscribers.append(send)
        return receive

    def snapshot(self) -> list[dict[str, Any]]:
        with self._lock:
            return list(self.objects.values())

    def get(self, key: str) -> dict[str, Any] | None:
        with self._lock:
            return self.objects.get(key)

    async def changed(self) -> None:
        """Wait for the next change (or a relist)."""
        await self._changed.wait()

    def next_change(self) -> trio.Event:
        """The event the next change (or relist) sets: taken before a check, so a change between the
        check and the wait is never missed."""
        return self._changed

    def take_changed(self) -> set[str] | None:
        """The keys of the objects changed (added, modified, deleted) since the last call, and forget
        them; None when the cache was relisted, so everything counts as changed."""
        with self._lock:
            out, self._dirty = self._dirty, set()
        return out

    def _notify(self, events) -> None:
        for send in self._subscribers:
            for ev in events:
                try:
                    send.send_nowait(ev)
                except trio.WouldBlock:
                    log.warning("an event subscriber fell behind; listing again", what=self.name)
                    self._relist = True
                    break
                except (trio.BrokenResourceError, trio.ClosedResourceError):
                    break
        self.version += 1
        ev, self._changed = self._changed, trio.Event()
        ev.set()
        if not self.synced.is_set():
            self.synced.set()

    async def _list(self, kube: AsyncKube) -> str:
        got = await kube.request("GET", self.path, query=self.query, timeout_s=LIST_TIMEOUT_S)
        items = got.get("items") or []
        with self._lock:
            old, self.objects = self.objects, {key_of(o): o for o in items}
            self._dirty = None
        # what went while no watch ran (a 410, a lost connection) is told as deleted, with the
        # last state seen, as client-go's informers do on a relist
        gone = [("DELETED", o) for k, o in old.items() if k not in self.objects]
        self._notify([("RELIST", None), *(("LISTED", o) for o in items), *gone, ("SYNCED", None)])
        return (got.get("metadata") or {}).get("resourceVersion") or ""

    async def _watch(self, kube: AsyncKube, rv: str) -> str | None:
        """Watch from ``rv`` until the stream ends; the resourceVersion to resume from, None to list again."""
        query = dict(self.query, watch="true", resourceVersion=rv, allowWatchBookmarks="true",
                     timeoutSeconds=str(self.watch_timeout_s))
        async with kube.watch(self.path, query, timeout_s=self.watch_timeout_s + 10) as bursts:
            async for burst in bursts:  # what arrived together: applied, then told, at once
                told = []
                end = False
                for ev in burst:
                    kind, obj = ev.get("type"), ev.get("object") or {}
                    if kind == "ERROR":
                        level = log.info if obj.get("code") == 410 else log.warning
                        level("watch ended with an error; listing again", what=self.name, code=obj.get("code"),
                              reason=obj.get("reason"))
                        end = True
                        break
                    rv = (obj.get("metadata") or {}).get("resourceVersion") or rv
                    if kind == "BOOKMARK":
                        continue
                    key = key_of(obj)
                    with self._lock:
                        if kind == "DELETED":
                            self.objects.pop(key, None)
                        else:
                            self.objects[key] = obj
                        if self._dirty is not None:
                            self._dirty.add(key)
                    told.append((kind, obj))
                if told:
                    self._notify(told)
                if end or self._relist:
                    return None
        return rv

    async def run(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        own = not isinstance(self.source, AsyncKube)
        kube = AsyncKube.of(self.source) if own else self.source
        started = False
        rv: str | None = None
        self.watching = True
        try:
            while True:
                if not started:
                    started = True
                    task_status.started()
                try:
                    if rv is None or self._relist:
                        self._relist = False
                        rv = await self._list(kube)
                    rv = await self._watch(kube, rv)
                except KubeApiError as e:  # a lost connection, a 410 answered to the watch, the API server down
                    if e.status == 410:
                        log.info("watch expired (410 Gone); listing again", what=self.name)
                    else:
                        log.warning("watch interrupted; listing again", what=self.name, error=str(e)[:300])
                        await trio.sleep(RETRY_S)
                    rv = None
        finally:
            self.watching = False
            if own:
                with trio.CancelScope(shield=True):
                    await kube.aclose()
