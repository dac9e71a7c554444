"""Gossip seeds in Kubernetes: the other daemons' addresses, found rather than configured.

Two sources, both optional and combined with ``gossipJoin``:

* ``gossipSeedsFromPods`` (default on): the DaemonSet's pods, listed through
  the API by ``daemonPodSelector`` in the daemon's namespace (``POD_NAMESPACE``,
  else ``kube-system``); every pod with a ``status.podIP`` that is not being
  deleted becomes ``PODIP:PORT``. Needs RBAC list on pods.
* ``gossipSeedsService``: a headless Service's DNS name, resolved with
  ``socket.getaddrinfo`` (A and AAAA records: the pod IPs of its endpoints);
  a name with no records yet (NXDOMAIN, as for a Service whose pods are not
  ready: set ``publishNotReadyAddresses: true``) gives no seeds.

PORT is ``gossipListen``'s port: every pod of the DaemonSet has the same
config. This daemon's own pod is left out (``POD_NAME``, and ``POD_IP`` when
the downward API sets it); gossip also ignores a seed equal to its own
address. :func:`kubernetes_seeds` runs on the trio loop: the pods are listed
through :class:`hamid.kube.rest.AsyncKube`, the Service resolved in a worker
thread (``getaddrinfo`` blocks).
"""

from __future__ import annotations

import os
import socket
from collections.abc import Callable, Mapping

import trio

from ..errors import HamidError
from ..logs import get_logger
from ..netaddr import AddressError, format_address, parse_address
from .election import daemon_namespace
from .rest import AsyncKube, KubeApiError

log = get_logger("seeds")


class SeedError(HamidError):
    """Seeds could not be found; the message says where and why."""


def gossip_port(gossip_listen: str | None) -> int:
    """The port of ``gossipListen``; an error when gossip is off or the port is 0."""
    if not gossip_listen:
        raise SeedError("gossip seeds from Kubernetes need gossipListen (HOST:PORT): without it there is no gossip "
                        "port to dial")
    try:
        _, port = parse_address(gossip_listen, "gossipListen")
    except AddressError as e:
        raise SeedError(str(e)) from None
    if port == 0:
        raise SeedError("gossipListen has port 0 (any free port): other pods cannot know it; give a fixed port, "
                        "e.g. 0.0.0.0:7947")
    return port


async def pod_seeds(kube: AsyncKube, namespace: str, selector: str, port: int, *, self_pod: str | None = None,
              self_ip: str | None = None) -> list[str]:
    """``PODIP:PORT`` of every pod matching ``selector`` in ``namespace`` that has an IP
    and is not being deleted, except this daemon's own pod; sorted."""
    try:
        got = await kube.request("GET", f"/api/v1/namespaces/{namespace}/pods", query={"labelSelector": selector})
    except KubeApiError as e:
        raise SeedError(f"cannot list the daemon pods ({selector!r} in namespace {namespace}) for gossip seeds: "
                        f"{e}") from None
    out = set()
    for pod in got.get("items") or []:
        meta = pod.get("metadata") or {}
        ip = (pod.get("status") or {}).get("podIP")
        if not ip or meta.get("deletionTimestamp") or meta.get("name") == self_pod or ip == self_ip:
            continue
        out.add(format_address(ip, port))
    return sorted(out)


def service_seeds(name: str, port: int, *, self_ip: str | None = None,
                  resolve: Callable = socket.getaddrinfo) -> list[str]:
    """``IP:PORT`` of every address ``name`` resolves to (A and AAAA), except ``self_ip``; sorted."""
    try:
        infos = resolve(name, port, type=socket.SOCK_STREAM)
    except socket.gaierror as e:
        if e.errno == socket.EAI_NONAME:
            log.warning("the gossip seeds Service has no DNS records yet; no seeds from it", service=name,
                        hint="publishNotReadyAddresses: true on the headless Service")
            return []
        raise SeedError(f"cannot resolve the gossip seeds Service {name!r}: {e}") from None
    return sorted({format_address(info[4][0], port) for info in infos if info[4][0] != self_ip})


async def kubernetes_seeds(config, api, environ: Mapping[str, str] = os.environ) -> list[str]:
    """The gossip seeds the config asks for from Kubernetes (pods, Service, or
    both), without duplicates; empty when neither source is on."""
    if not config.gossipSeedsFromPods and not config.gossipSeedsService:
        return []
    port = gossip_port(config.gossipListen)
    self_pod = environ.get("POD_NAME") or None
    self_ip = environ.get("POD_IP") or None
    seeds: set[str] = set()
    if config.gossipSeedsFromPods:
        if api is None:
            raise SeedError("gossipSeedsFromPods needs the API server (kubernetes: true, or a kubeconfig); "
                            "turn it off with gossipSeedsFromPods: false")
        ns = daemon_namespace(environ)
        kube = AsyncKube.of(api)
        try:
            found = await pod_seeds(kube, ns, config.daemonPodSelector, port, self_pod=self_pod, self_ip=self_ip)
        finally:
            await kube.aclose()
        log.info("gossip seeds from the daemon pods", namespace=ns, selector=config.daemonPodSelector, seeds=found)
        seeds.update(found)
    if config.gossipSeedsService:
        found = await trio.to_thread.run_sync(lambda: service_seeds(config.gossipSeedsService, port, self_ip=self_ip))
        log.info("gossip seeds from the headless Service", service=config.gossipSeedsService, seeds=found)
        seeds.update(found)
    return sorted(seeds)


__all__ = ["SeedError", "gossip_port", "kubernetes_seeds", "pod_seeds", "service_seeds"]
