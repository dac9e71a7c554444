"""Writing the node's pool to the API server: its ResourceSlices, generation by generation.

Every change of the pool's content bumps its generation, in all its slices
(consumers use only a pool's highest generation, and ``resourceSliceCount``
tells them when they hold all of it). The generation continues from what the
API server holds, so a restarted daemon never goes back. Slices of this node
and driver that the pool no longer has are deleted. Nothing is written when
the content is what the server holds already.
"""

from __future__ import annotations

from typing import Any

from ..kube.rest import AsyncKube, KubeApiError
from ..logs import get_logger
from . import names
from .slices import Pool

log = get_logger("dra")

SLICES = f"/apis/{names.GROUP_VERSION}/resourceslices"


def _content(spec: dict[str, Any]) -> dict[str, Any]:
    """A slice's spec without its generation (what a change is measured by)."""
    pool = {k: v for k, v in (spec.get("pool") or {}).items() if k != "generation"}
    return {**spec, "pool": pool}


class SlicePublisher:
    def __init__(self, kube: AsyncKube, node: str) -> None:
        self.kube = kube
        self.node = node
        self.generation: int | None = None  # None: not read from the server yet
        self.published: dict[str, dict[str, Any]] = {}  # name -> spec content, as last written or read
        self.node_uid: str | None = None

    async def _existing(self) -> dict[str, dict[str, Any]]:
        got = await self.kube.request("GET", SLICES, query={
            "fieldSelector": f"spec.nodeName={self.node},spec.driver={names.DRIVER}"})
        return {i["metadata"]["name"]: i for i in got.get("items") or []}

    async def _owner(self) -> list[dict[str, Any]]:
        """The Node as the slices' owner, so they go with it (garbage collection), when it can be read."""
        if self.node_uid is None:
            try:
                node = await self.kube.request("GET", f"/api/v1/nodes/{self.node}")
                self.node_uid = node["metadata"]["uid"]
            except KubeApiError as e:
                log.warning("node not readable; slices published without an owner", node=self.node, error=str(e))
                return []
        return [{"apiVersion": "v1", "kind": "Node", "name": self.node, "uid": self.node_uid, "controller": True}]

    async def publish(self, pool: Pool) -> bool:
        """Make the server's slices of this node say ``pool``; True when something was written."""
        existing = await self._existing()
        if self.generation is None:
            self.generation = max((int((i["spec"].get("pool") or {}).get("generation") or 0)
                                   for i in existing.values()), default=0)
        have = {n: _content(i["spec"]) for n, i in existing.items()}
        want = {s["metadata"]["name"]: s for s in pool.slices(self.node, self.generation)}
        if have == {n: _content(s["spec"]) for n, s in want.items()}:
            self.published = have
            return False
        self.generation += 1
        owners = await self._owner()
        for s in pool.slices(self.node, self.generation):
            name = s["metadata"]["name"]
            if owners:
                s["metadata"]["ownerReferences"] = owners
            old = existing.get(name)
            if old is None:
                await self.kube.request("POST", SLICES, s)
            else:
                s["metadata"]["resourceVersion"] = old["metadata"]["resourceVersion"]
                await self.kube.request("PUT", f"{SLICES}/{name}", s)
        for name in set(existing) - set(want):
            try:
                await self.kube.request("DELETE", f"{SLICES}/{name}")
            except KubeApiError as e:
                if e.status != 404:
                    raise
        self.published = {n: _content(s["spec"]) for n, s in want.items()}
        log.info("pool published", node=self.node, generation=self.generation, devices=len(pool.devices),
                 left_out=pool.left_out or None)
        return True
