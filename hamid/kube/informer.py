"""A cache of one kind of Kubernetes object, kept current by list and watch.

What client-go calls an informer, small: a worker thread lists the objects,
then watches from the list's ``resourceVersion`` (with bookmarks), resuming
where it left off and listing again on ``410 Gone``; the cache is a dict by
``namespace/name`` the trio side reads at any time, and every change sets a
trio event so a controller can wake. A face that must act on each event (the
kubelet face releases a deleted pod's share at once) subscribes to the event
stream (:meth:`Informer.subscribe`): ``RELIST``, ``LISTED`` per object and
``SYNCED`` after each list, then ``ADDED``/``MODIFIED``/``DELETED``. The blocking client runs only in the
thread; the trio loop never waits on the API server. When :meth:`Informer.run`
ends (a leader's term ends, the daemon stops) the thread stops too: at its
next event, the end of its watch (``watch_timeout_s``) or its next retry,
never listing again for a cache no one reads.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import trio

from ..logs import get_logger

log = get_logger("informer")


def key_of(obj: dict) -> str:
    m = obj.get("metadata") or {}
    return f"{m.get('namespace') or ''}/{m.get('name')}"


class Informer:
    """``lister(**kw)`` is a list call of the official client (e.g.
    ``CoreV1Api.list_pod_for_all_namespaces``), ``api`` the ApiClient that
    turns its answers into plain dicts."""

    def __init__(self, api, lister: Callable, *, name: str, watch_timeout_s: int = 300, **selectors) -> None:
        self.api = api
        self.lister = lister
        self.name = name
        self.selectors = selectors
        self.watch_timeout_s = watch_timeout_s
        self.objects: dict[str, dict[str, Any]] = {}
        self.synced = trio.Event()
        self._changed = trio.Event()
        self._lock = threading.Lock()
        self.version = 0  # bumped on every change seen
        self._dirty: set[str] | None = set()  # keys changed since take_changed(); None: everything (a relist)
        self._stop = threading.Event()  # run() has ended: the thread returns
        self.watching = False  # the thread is in its loop (tests)
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

    def _notify(self, token, events: list[tuple[str, Any]] = ()) -> None:
        def wake():
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

        try:
            trio.from_thread.run_sync(wake, trio_token=token)
        except trio.RunFinishedError:
            raise
        except Exception:  # the loop is shutting down
            raise trio.RunFinishedError from None

    def _run(self, token, stop: threading.Event) -> None:
        from kubernetes import watch

        self.watching = True
        try:
            self._loop(token, watch, stop)
        finally:
            self.watching = False

    def _loop(self, token, watch, stop: threading.Event) -> None:
        """``stop``: this run's own (a thread left from an earlier run, still in its watch, sees its
        own stop set and returns at its next event, never touching the cache or a subscriber)."""
        rv = None
        while not stop.is_set():
            try:
                if rv is None or self._relist:
                    self._relist = False
                    got = self.api.sanitize_for_serialization(self.lister(_request_timeout=60, **self.selectors))
                    items = got.get("items") or []
                    with self._lock:
                        old, self.objects = self.objects, {key_of(o): o for o in items}
                        self._dirty = None
                    rv = got["metadata"]["resourceVersion"]
                    # what went while no watch ran (a 410, a lost connection) is told as deleted, with the
                    # last state seen, as client-go's informers do on a relist
                    gone = [("DELETED", o) for k, o in old.items() if k not in self.objects]
                    self._notify(token, [("RELIST", None), *(("LISTED", o) for o in items), *gone, ("SYNCED", None)])
                w = watch.Watch()
                for ev in w.stream(self.lister, resource_version=rv, allow_watch_bookmarks=True,
                                   timeout_seconds=self.watch_timeout_s, _request_timeout=self.watch_timeout_s + 10,
                                   **self.selectors):
                    if stop.is_set():
                        return
                    kind, obj = ev["type"], ev["object"]
                    obj = obj if isinstance(obj, dict) else self.api.sanitize_for_serialization(obj)
                    if kind == "ERROR":
                        log.info("watch ended with an error; listing again", what=self.name,
                                 code=(obj or {}).get("code"), reason=(obj or {}).get("reason"))
                        rv = None
                        break
                    rv = (obj.get("metadata") or {}).get("resourceVersion") or rv
                    if kind == "BOOKMARK":
                        continue
                    with self._lock:
                        key = key_of(obj)
                        if kind == "DELETED":
                            self.objects.pop(key, None)
                        else:
                            self.objects[key] = obj
                        if self._dirty is not None:
                            self._dirty.add(key)
                    self._notify(token, [(kind, obj)])
                    if self._relist:
                        break
            except trio.RunFinishedError:
                return
            except Exception as e:  # a lost connection, a 410 raised by the client, the API server down
                if stop.is_set():
                    return
                if getattr(e, "status", None) != 410:
                    log.warning("watch interrupted; listing again", what=self.name, error=str(e)[:300])
                    stop.wait(1.0)
                else:
                    log.info("watch expired (410 Gone); listing again", what=self.name)
                rv = None

    async def run(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        token = trio.lowlevel.current_trio_token()
        stop = self._stop = threading.Event()
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(lambda: trio.to_thread.run_sync(self._run, token, stop, abandon_on_cancel=True))
                task_status.started()
        finally:
            stop.set()
