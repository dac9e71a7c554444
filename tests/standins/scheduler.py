"""A STAND-IN for kube-scheduler, for tests: no kube-scheduler can run on
these machines, so this module does its default work over the API server's
real REST paths (the stand-in of :mod:`apiserver`, or any URL): it binds
pending pods to nodes that fit, by kube-scheduler's default filters, and calls
scheduler extenders as a ``KubeSchedulerConfiguration`` describes them. It is
written from kube-scheduler's documented behaviour and source facts
(``pkg/scheduler``: ``framework/plugins``, ``extender.go``,
``schedule_one.go``), on its own: it imports nothing of hamid, so a test in
which hamid's placement and this scheduler agree means something.

Public API::

    sched = SchedulerStandIn(api_server_or_url, config=None, period=0.5)
    sched.start()                       # a thread; sched.stop() ends it
    sched.wait_bound("default", "p", timeout=10)   # -> the node's name
    sched.last_failure("default", "p")  # -> "0/3 nodes are available: ..." or None

What it does, as kube-scheduler does:

* which pods: ``spec.nodeName`` empty, ``spec.schedulerName`` one of the
  configuration's profiles (``default-scheduler`` when none; the API server
  defaults an unset name to it), no ``schedulingGates`` (the SchedulingGates
  PreEnqueue plugin), not being deleted, not Succeeded/Failed; in PrioritySort
  order (``spec.priority`` high first, then the older pod).
* what a node holds: the pods bound to it that are not Succeeded/Failed
  (terminating ones included), plus what this scheduler bound in the same
  pass.
* filters, in the default order, each node stopped at the first that fails:
  NodeUnschedulable (``spec.unschedulable`` unless the pod tolerates
  ``node.kubernetes.io/unschedulable:NoSchedule``), NodeName, TaintToleration
  (NoSchedule and NoExecute taints; the toleration rules of
  ``Toleration.ToleratesTaint``), NodeAffinity (``nodeSelector`` and the
  required terms: ORed terms, each ANDing its ``matchExpressions`` on labels
  and ``matchFields`` on ``metadata.name``; In, NotIn, Exists, DoesNotExist,
  Gt, Lt; an empty term matches nothing), NodePorts (host ports by protocol,
  ``0.0.0.0`` conflicting with every IP), NodeResourcesFit (``Too many pods``
  against allocatable ``pods``; then, if the pod requests anything, cpu,
  memory, ephemeral-storage and every extended/scalar resource against
  ``status.allocatable`` minus what the node's pods request; a pod's request
  is the larger of its containers' sum and each init container's, sidecars
  (init containers with ``restartPolicy: Always``) added to both, plus
  ``spec.overhead``; resources an extender marks ``ignoredByScheduler`` are
  skipped).
* DynamicResources (claims, ResourceSlices, DeviceClasses; extended
  resources served by a DeviceClass), between the node filters and
  NodeResourcesFit, and its PreBind writing the claims' allocation: as
  :mod:`dynamicresources` describes (first fit, consumable capacity, counters;
  its controller part runs at the start of every pass). An API server without
  ``resource.k8s.io`` turns it off.
* then the extenders, one after another on the nodes still feasible, for a
  pod they are interested in (it requests or limits one of their
  ``managedResources``, or they have none): ``filter`` with ``ExtenderArgs``
  ``{"Pod", "Nodes"}`` (a NodeList) or ``{"Pod", "NodeNames"}`` when
  ``nodeCacheCapable``; the result's ``Nodes``/``NodeNames`` (a node not
  sent is an error; neither field: no node), ``FailedNodes`` and
  ``FailedAndUnresolvableNodes`` (the latter wins) become the nodes' reasons,
  ``Error`` is an error. An error (or an HTTP status other than 200, or
  ``httpTimeout``, default 5 s) skips an ``ignorable`` extender and otherwise
  fails the attempt (condition reason ``SchedulerError``).
* when nothing fits: ``PodScheduled=False``, reason ``Unschedulable``,
  message ``0/N nodes are available: <count> <reason>, ...`` (the reasons'
  histogram, sorted as strings, then a ``.``), written only when it changed,
  and an ``events.k8s.io/v1`` Event ``FailedScheduling`` (Warning) each time
  the message changes; the pod is tried again on the next pass.
* scoring, when more than one node is feasible (one node: no scoring, no
  prioritize call, as kube-scheduler): NodeResourcesFit's LeastAllocated on
  cpu and memory (weight 1 each, the non-zero requests: 100m and 200 MiB for a
  container that requests none), plus every interested extender's
  ``prioritize`` ``HostPriorityList`` score x ``weight`` x 10 (errors ignored).
  The highest total wins; ties go to the first node by name (kube-scheduler
  picks one at random).
* binding: the first extender with a ``bindVerb`` that is interested binds
  (``ExtenderBindingArgs`` ``{PodName, PodNamespace, PodUID, Node}`` ->
  ``{Error}``; the extender must create the Binding itself); an error skips an
  ignorable one, otherwise the attempt fails (``binding rejected: ...``);
  with no such extender the default binder POSTs ``pods/binding``. A
  ``Scheduled`` Event follows.
* when it runs: a pass at start, on every pod or node watch event, and every
  ``period`` seconds.

What it does NOT do (tests must not rely on these): preemption (no
``preemptVerb``; refused in the configuration), the volume, topology-spread,
inter-pod-affinity and image-locality plugins, other score plugins (taint and
affinity preferences, balanced allocation), ``percentageOfNodesToScore`` (every
node is checked), plugin configuration in profiles, backoff queues (a pod that
did not fit is tried on every pass), asynchronous binding (a bind finishes
before the next pod), ``nominatedNodeName``, ``tlsConfig``'s ``*Data`` forms
(its file forms, ``serverName`` and ``insecure`` are kept), leader election. Configuration it
does not implement is refused with a :class:`ValueError` naming it;
``clientConnection`` and ``leaderElection`` are checked as kube-scheduler
checks them (known keys; a positive lease duration above the renew deadline,
a positive retry period, a lock name and namespace) and otherwise unused: the
stand-in is one instance and talks to the API it is given.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import json
import math
import re
import socket
import ssl
import threading
import time
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field

import httpx
from kubernetes.utils import parse_quantity

from hamid.logs import get_logger

from dynamicresources import (EXTENDED_ANNOTATION, GROUP_PATH, REASON_CLAIMS, REASON_WRONG_NODE, Allocator,
                              ClaimController, Unresolved, Usage, allocated_node, extended_claim, extended_requests,
                              pod_claims)

log = get_logger("tests.k8s.scheduler")

DEFAULT_SCHEDULER = "default-scheduler"
MAX_NODE_SCORE = 100
MAX_EXTENDER_PRIORITY = 10
DEFAULT_EXTENDER_TIMEOUT = 5.0
NONZERO_CPU_MILLI = 100
NONZERO_MEMORY = 200 * 1024 * 1024

# the plugins' reasons, as kube-scheduler words them
REASON_UNSCHEDULABLE = "node(s) were unschedulable"
REASON_NODE_NAME = "node(s) didn't match the requested node name"
REASON_AFFINITY = "node(s) didn't match Pod's node affinity/selector"
REASON_PORTS = "node(s) didn't have free ports for the requested pod ports"
REASON_TOO_MANY_PODS = "Too many pods"


class ExtenderError(Exception):
    """An extender call that failed (HTTP, decode, its ``Error`` field)."""


class SchedulingError(Exception):
    """An attempt that failed for a reason other than fit (SchedulerError)."""


# ---------------------------------------------------------------------------
# configuration

_EXTENDER_KEYS = {"urlPrefix", "filterVerb", "prioritizeVerb", "bindVerb", "preemptVerb", "weight",
                  "nodeCacheCapable", "ignorable", "managedResources", "httpTimeout", "enableHTTPS", "tlsConfig"}
_TLS_KEYS = {"insecure", "serverName", "certFile", "keyFile", "caFile"}  # the *Data forms are not implemented
_CONFIG_KEYS = {"apiVersion", "kind", "extenders", "profiles", "clientConnection", "leaderElection"}
_CLIENT_KEYS = {"kubeconfig", "acceptContentTypes", "contentType", "qps", "burst"}
_LEADER_KEYS = {"leaderElect", "leaseDuration", "renewDeadline", "retryPeriod", "resourceLock", "resourceName",
                "resourceNamespace"}
_DURATION = re.compile(r"(\d+(?:\.\d+)?)(ns|us|µs|ms|s|m|h)")
_UNIT = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}


def parse_duration(value, what: str) -> float:
    """A Go ``time.Duration`` string (``30s``, ``1m30s``, ``500ms``) or a
    number of seconds."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    if isinstance(value, str):
        text = value.strip()
        parts = _DURATION.findall(text)
        if parts and "".join(n + u for n, u in parts) == text:
            return sum(float(n) * _UNIT[u] for n, u in parts)
        if text == "0":
            return 0.0
    raise ValueError(f"{what}: {value!r} is not a duration: give a Go duration string such as '30s', '1m30s' or "
                     f"'500ms', or a number of seconds")


@dataclass
class Extender:
    """One ``extenders[]`` entry of a KubeSchedulerConfiguration."""

    url_prefix: str
    filter_verb: str = ""
    prioritize_verb: str = ""
    bind_verb: str = ""
    weight: int = 1
    node_cache_capable: bool = False
    ignorable: bool = False
    managed: dict[str, bool] = field(default_factory=dict)  # resource name -> ignoredByScheduler
    http_timeout: float = DEFAULT_EXTENDER_TIMEOUT
    tls: dict | None = None  # tlsConfig (certFile, keyFile, caFile, serverName, insecure), with enableHTTPS
    _client: httpx.Client | None = field(default=None, repr=False)

    def client(self, shared: httpx.Client) -> httpx.Client:
        """kube-scheduler's makeTransport: plain HTTP shares one client; with a
        tlsConfig, a client presenting its certificate and checking the
        server's against caFile (no CA with enableHTTPS: not checked), the name
        checked being serverName when set."""
        if self.tls is None:
            return shared
        if self._client is None:
            import ssl

            t = self.tls
            if t.get("insecure") or not t.get("caFile"):
                ctx = ssl.create_default_context()
                ctx.check_hostname, ctx.verify_mode = False, ssl.CERT_NONE
            else:
                ctx = ssl.create_default_context(cafile=t["caFile"])
            if t.get("certFile"):
                ctx.load_cert_chain(t["certFile"], t["keyFile"])
            self._client = httpx.Client(verify=ctx, trust_env=False)
        return self._client

    def interested(self, pod: dict) -> bool:
        if not self.managed:
            return True
        spec = pod.get("spec") or {}
        for c in (spec.get("containers") or []) + (spec.get("initContainers") or []):
            res = c.get("resources") or {}
            if any(r in self.managed for r in (res.get("requests") or {})) or \
                    any(r in self.managed for r in (res.get("limits") or {})):
                return True
        return False

    def send(self, client: httpx.Client, verb: str, args: dict):
        url = self.url_prefix.rstrip("/") + "/" + verb
        ext = {"sni_hostname": self.tls["serverName"]} if self.tls and self.tls.get("serverName") else None
        try:
            r = self.client(client).post(url, content=json.dumps(args), headers={"Content-Type": "application/json"},
                                         timeout=self.http_timeout, extensions=ext)
        except httpx.TimeoutException:
            raise ExtenderError(f'Post "{url}": context deadline exceeded (Client.Timeout exceeded while awaiting '
                                f"headers)") from None
        except httpx.HTTPError as e:
            raise ExtenderError(f'Post "{url}": {type(e).__name__}: {e}') from None
        if r.status_code != 200:
            raise ExtenderError(f"failed {verb} with extender at URL {url}, code {r.status_code}")
        try:
            return r.json()
        except ValueError as e:
            raise ExtenderError(f"extender at URL {url} answered {verb} with invalid JSON: {e}") from None


def _check_client_and_leader(config: Mapping) -> None:
    """``clientConnection`` and ``leaderElection`` as kube-scheduler validates them (component-base's
    ClientConnectionConfiguration and LeaderElectionConfiguration, with kube-scheduler's defaults)."""
    cc = config.get("clientConnection") or {}
    if not isinstance(cc, Mapping):
        raise ValueError(f"config.clientConnection: a mapping is accepted, not {type(cc).__name__}")
    unknown = set(cc) - _CLIENT_KEYS
    if unknown:
        raise ValueError(f"config.clientConnection: unknown keys {sorted(unknown)}; accepted: {sorted(_CLIENT_KEYS)}")
    if "kubeconfig" in cc and not isinstance(cc["kubeconfig"], str):
        raise ValueError(f"config.clientConnection.kubeconfig: {cc['kubeconfig']!r} is not a path")
    burst = cc.get("burst", 100)
    if not isinstance(burst, int) or isinstance(burst, bool) or burst < 0:
        raise ValueError(f"config.clientConnection.burst: {burst!r} must be a non-negative integer")
    le = config.get("leaderElection") or {}
    if not isinstance(le, Mapping):
        raise ValueError(f"config.leaderElection: a mapping is accepted, not {type(le).__name__}")
    unknown = set(le) - _LEADER_KEYS
    if unknown:
        raise ValueError(f"config.leaderElection: unknown keys {sorted(unknown)}; accepted: {sorted(_LEADER_KEYS)}")
    if not le.get("leaderElect", True):
        return
    p = "config.leaderElection"
    lease = parse_duration(le.get("leaseDuration", "15s"), f"{p}.leaseDuration")
    renew = parse_duration(le.get("renewDeadline", "10s"), f"{p}.renewDeadline")
    retry = parse_duration(le.get("retryPeriod", "2s"), f"{p}.retryPeriod")
    for name, v in (("leaseDuration", lease), ("renewDeadline", renew), ("retryPeriod", retry)):
        if v <= 0:
            raise ValueError(f"{p}.{name}: must be greater than zero")
    if lease <= renew:
        raise ValueError(f"{p}.leaseDuration: LeaseDuration must be greater than RenewDeadline ({lease} <= {renew})")
    if le.get("resourceLock", "leases") != "leases":
        raise ValueError(f"{p}.resourceLock: {le['resourceLock']!r}; accepted: leases")
    for name in ("resourceName", "resourceNamespace"):
        if not le.get(name, "kube-scheduler" if name == "resourceName" else "kube-system"):
            raise ValueError(f"{p}.{name}: required")


def parse_config(config: Mapping | None) -> tuple[list[str], list[Extender]]:
    """(scheduler names, extenders) of a KubeSchedulerConfiguration dict; what
    the stand-in does not implement is refused."""
    if config is None:
        return [DEFAULT_SCHEDULER], []
    if not isinstance(config, Mapping):
        raise ValueError(f"config: a KubeSchedulerConfiguration dict is accepted, not {type(config).__name__}")
    unknown = set(config) - _CONFIG_KEYS
    if unknown:
        raise ValueError(f"config: {sorted(unknown)} not implemented by the kube-scheduler stand-in; accepted keys: "
                         f"{sorted(_CONFIG_KEYS)}")
    if config.get("apiVersion") not in (None, "kubescheduler.config.k8s.io/v1"):
        raise ValueError(f"config.apiVersion: {config['apiVersion']!r}; accepted: kubescheduler.config.k8s.io/v1")
    if config.get("kind") not in (None, "KubeSchedulerConfiguration"):
        raise ValueError(f"config.kind: {config['kind']!r}; accepted: KubeSchedulerConfiguration")
    _check_client_and_leader(config)
    names = []
    for i, prof in enumerate(config.get("profiles") or []):
        extra = set(prof) - {"schedulerName"}
        if extra:
            raise ValueError(f"config.profiles[{i}]: {sorted(extra)} not implemented by the stand-in (only "
                             f"schedulerName; the default plugins are fixed)")
        names.append(prof.get("schedulerName") or DEFAULT_SCHEDULER)
    if len(set(names)) != len(names):
        raise ValueError(f"config.profiles: duplicate schedulerName in {names}")
    extenders = []
    for i, e in enumerate(config.get("extenders") or []):
        p = f"config.extenders[{i}]"
        unknown = set(e) - _EXTENDER_KEYS
        if unknown:
            raise ValueError(f"{p}: unknown keys {sorted(unknown)}; accepted: {sorted(_EXTENDER_KEYS)}")
        if not e.get("urlPrefix"):
            raise ValueError(f"{p}.urlPrefix: required (the extender's base URL)")
        tls = e.get("tlsConfig")
        if tls is not None:
            if not isinstance(tls, Mapping):
                raise ValueError(f"{p}.tlsConfig: a mapping is accepted, not {type(tls).__name__}")
            bad = set(tls) - _TLS_KEYS
            if bad:
                raise ValueError(f"{p}.tlsConfig: {sorted(bad)} not implemented by the stand-in; accepted: "
                                 f"{sorted(_TLS_KEYS)}")
            if bool(tls.get("certFile")) != bool(tls.get("keyFile")):
                raise ValueError(f"{p}.tlsConfig: certFile and keyFile go together")
        if e.get("enableHTTPS") and not str(e["urlPrefix"]).startswith("https://"):
            raise ValueError(f"{p}: enableHTTPS with a urlPrefix that is not https:// (the stand-in takes the "
                             "scheme from urlPrefix, as kube-scheduler's transport does)")
        if e.get("preemptVerb"):
            raise ValueError(f"{p}.preemptVerb: the stand-in has no preemption")
        weight = e.get("weight", 1)
        if not isinstance(weight, int) or isinstance(weight, bool):
            raise ValueError(f"{p}.weight: {weight!r} is not an integer")
        if e.get("prioritizeVerb") and weight <= 0:
            raise ValueError(f"{p}.weight: {weight} must have a positive weight applied to it")
        managed: dict[str, bool] = {}
        for j, m in enumerate(e.get("managedResources") or []):
            name = m.get("name") if isinstance(m, Mapping) else None
            if not name:
                raise ValueError(f"{p}.managedResources[{j}].name: required")
            if name in managed:
                raise ValueError(f"{p}.managedResources[{j}].name: duplicate extender managed resource name "
                                 f"{name!r}")
            managed[name] = bool(m.get("ignoredByScheduler", False))
        timeout = parse_duration(e["httpTimeout"], f"{p}.httpTimeout") if "httpTimeout" in e else 0.0
        extenders.append(Extender(
            url_prefix=e["urlPrefix"], filter_verb=e.get("filterVerb") or "",
            prioritize_verb=e.get("prioritizeVerb") or "", bind_verb=e.get("bindVerb") or "", weight=weight,
            node_cache_capable=bool(e.get("nodeCacheCapable", False)), ignorable=bool(e.get("ignorable", False)),
            managed=managed, http_timeout=timeout or DEFAULT_EXTENDER_TIMEOUT,
            tls=dict(tls or {}) if tls is not None or e.get("enableHTTPS") else None))
    binders = sum(1 for x in extenders if x.bind_verb)
    if binders > 1:
        raise ValueError(f"config.extenders: only one extender can implement bind, found {binders}")
    return names or [DEFAULT_SCHEDULER], extenders


# ---------------------------------------------------------------------------
# resources


def _is_scalar(name: str) -> bool:
    """Extended, hugepages, kubernetes.io-prefixed and attachable-volume
    resources (``IsScalarResourceName``); a name with no ``/`` is native."""
    if name.startswith(("hugepages-", "attachable-volumes-")):
        return True
    return "/" in name and not name.startswith("requests.")


def _is_extended(name: str) -> bool:
    """``IsExtendedResourceName``: a ``/`` name outside ``kubernetes.io/``."""
    return "/" in name and not name.startswith("requests.") and "kubernetes.io/" not in name


def _amount(resource: str, value) -> int:
    """cpu in millicores, everything else in units, rounded up as
    Quantity.MilliValue()/Value() do."""
    q = parse_quantity(value)
    if resource == "cpu":
        return math.ceil(q * 1000)
    return math.ceil(q)


def _add(into: dict[str, int], other: Mapping[str, int]) -> None:
    for k, v in other.items():
        into[k] = into.get(k, 0) + v


def _max(into: dict[str, int], other: Mapping[str, int]) -> None:
    for k, v in other.items():
        if v > into.get(k, 0):
            into[k] = v


def _container_requests(c: dict, nonzero: bool) -> dict[str, int]:
    res = c.get("resources") or {}
    req = dict(res.get("requests") or {})
    for k, v in (res.get("limits") or {}).items():
        req.setdefault(k, v)  # the API server's defaulting; kept for objects that skipped it
    out = {k: _amount(k, v) for k, v in req.items()}
    if nonzero:
        out.setdefault("cpu", NONZERO_CPU_MILLI)
        out.setdefault("memory", NONZERO_MEMORY)
        if out["cpu"] == 0:
            out["cpu"] = NONZERO_CPU_MILLI
        if out["memory"] == 0:
            out["memory"] = NONZERO_MEMORY
    return out


def pod_requests(pod: dict, nonzero: bool = False) -> dict[str, int]:
    """The pod's effective requests (``resourcehelper.PodRequests``): the
    containers' sum, sidecars added to it, against the largest init container
    (each plus the sidecars started before it), plus ``spec.overhead``."""
    spec = pod.get("spec") or {}
    total: dict[str, int] = {}
    for c in spec.get("containers") or []:
        _add(total, _container_requests(c, nonzero))
    sidecars: dict[str, int] = {}
    init_max: dict[str, int] = {}
    for c in spec.get("initContainers") or []:
        req = _container_requests(c, nonzero)
        if c.get("restartPolicy") == "Always":
            _add(total, req)
            _add(sidecars, req)
            step = dict(sidecars)
        else:
            step = dict(req)
            _add(step, sidecars)
        _max(init_max, step)
    _max(total, init_max)
    _add(total, {k: _amount(k, v) for k, v in (spec.get("overhead") or {}).items()})
    return total


# ---------------------------------------------------------------------------
# filters: each returns the node's reasons ([] fits)


def tolerates(tol: Mapping, taint: Mapping) -> bool:
    if tol.get("effect") and tol["effect"] != taint.get("effect"):
        return False
    if tol.get("key") and tol["key"] != taint.get("key"):
        return False
    op = tol.get("operator") or "Equal"
    if op == "Exists":
        return True
    if op == "Equal":
        return (tol.get("value") or "") == (taint.get("value") or "")
    return False


def _tolerated(pod: dict, taint: Mapping) -> bool:
    return any(tolerates(t, taint) for t in (pod.get("spec") or {}).get("tolerations") or [])


def filter_unschedulable(pod: dict, node: dict) -> list[str]:
    if (node.get("spec") or {}).get("unschedulable") and not _tolerated(
            pod, {"key": "node.kubernetes.io/unschedulable", "effect": "NoSchedule"}):
        return [REASON_UNSCHEDULABLE]
    return []


def filter_node_name(pod: dict, node: dict) -> list[str]:
    want = (pod.get("spec") or {}).get("nodeName")
    return [REASON_NODE_NAME] if want and want != node["metadata"]["name"] else []


def filter_taints(pod: dict, node: dict) -> list[str]:
    for taint in (node.get("spec") or {}).get("taints") or []:
        if taint.get("effect") in ("NoSchedule", "NoExecute") and not _tolerated(pod, taint):
            return [f"node(s) had untolerated taint {{{taint.get('key')}: {taint.get('value') or ''}}}"]
    return []


def _requirement(req: Mapping, value: str | None, present: bool) -> bool:
    op, values = req.get("operator"), req.get("values") or []
    if op == "In":
        return present and value in values
    if op == "NotIn":
        return not present or value not in values
    if op == "Exists":
        return present
    if op == "DoesNotExist":
        return not present
    if op in ("Gt", "Lt"):
        if not present or len(values) != 1:
            return False
        try:
            have, bound = int(value), int(values[0])
        except (TypeError, ValueError):
            return False
        return have > bound if op == "Gt" else have < bound
    raise ValueError(f"node selector operator {op!r} is not valid; accepted: In, NotIn, Exists, DoesNotExist, Gt, Lt")


def term_matches(term: Mapping, node: dict) -> bool:
    exprs, fields = term.get("matchExpressions") or [], term.get("matchFields") or []
    if not exprs and not fields:
        return False  # an empty term matches no objects
    labels = node["metadata"].get("labels") or {}
    for req in exprs:
        key = req.get("key")
        if not _requirement(req, labels.get(key), key in labels):
            return False
    for req in fields:
        if req.get("key") != "metadata.name":
            return False  # the only field kube-scheduler supports
        if not _requirement(req, node["metadata"]["name"], True):
            return False
    return True


def filter_affinity(pod: dict, node: dict) -> list[str]:
    spec = pod.get("spec") or {}
    labels = node["metadata"].get("labels") or {}
    if any(labels.get(k) != v for k, v in (spec.get("nodeSelector") or {}).items()):
        return [REASON_AFFINITY]
    req = ((spec.get("affinity") or {}).get("nodeAffinity") or {}).get("requiredDuringSchedulingIgnoredDuringExecution")
    if req is not None and not any(term_matches(t, node) for t in req.get("nodeSelectorTerms") or []):
        return [REASON_AFFINITY]
    return []


def host_ports(pod: dict) -> list[tuple[str, str, int]]:
    spec = pod.get("spec") or {}
    out = []
    cs = list(spec.get("containers") or []) + [c for c in spec.get("initContainers") or []
                                              if c.get("restartPolicy") == "Always"]
    for c in cs:
        for p in c.get("ports") or []:
            if p.get("hostPort"):
                out.append((p.get("hostIP") or "0.0.0.0", p.get("protocol") or "TCP", int(p["hostPort"])))
    return out


def ports_conflict(want: list[tuple[str, str, int]], used: list[tuple[str, str, int]]) -> bool:
    for ip, proto, port in want:
        for uip, uproto, uport in used:
            if port == uport and proto == uproto and (ip == uip or "0.0.0.0" in (ip, uip)):
                return True
    return False


@dataclass
class NodeState:
    node: dict
    requested: dict[str, int] = field(default_factory=dict)
    nonzero: dict[str, int] = field(default_factory=dict)
    pods: int = 0
    ports: list[tuple[str, str, int]] = field(default_factory=list)

    def __post_init__(self) -> None:
        alloc = (self.node.get("status") or {}).get("allocatable") or {}
        self._allocatable = {k: _amount(k, v) for k, v in alloc.items()}

    @property
    def name(self) -> str:
        return self.node["metadata"]["name"]

    def allocatable(self) -> dict[str, int]:
        return self._allocatable

    def add(self, pod: dict) -> None:
        _add(self.requested, pod_requests(pod))
        _add(self.nonzero, pod_requests(pod, nonzero=True))
        self.pods += 1
        self.ports.extend(host_ports(pod))


def filter_resources(pod: dict, state: NodeState, ignored: set[str], requests: dict[str, int] | None = None
                     ) -> list[str]:
    alloc = state.allocatable()
    reasons = []
    if state.pods + 1 > alloc.get("pods", 0):
        reasons.append(REASON_TOO_MANY_PODS)
    requests = pod_requests(pod) if requests is None else requests
    want = {k: v for k, v in requests.items() if k in ("cpu", "memory", "ephemeral-storage") or _is_scalar(k)}
    if not any(want.values()):
        return reasons
    for r in ("cpu", "memory", "ephemeral-storage"):
        if want.get(r, 0) > 0 and want[r] > alloc.get(r, 0) - state.requested.get(r, 0):
            reasons.append(f"Insufficient {r}")
    for r in sorted(k for k in want if _is_scalar(k)):
        if want[r] == 0 or (_is_extended(r) and r in ignored):
            continue
        if want[r] > alloc.get(r, 0) - state.requested.get(r, 0):
            reasons.append(f"Insufficient {r}")
    return reasons


def least_allocated(pod: dict, state: NodeState) -> int:
    alloc = state.allocatable()
    want = pod_requests(pod, nonzero=True)
    total = 0
    for r in ("cpu", "memory"):
        cap, used = alloc.get(r, 0), state.nonzero.get(r, 0) + want.get(r, 0)
        total += 0 if cap == 0 or used > cap else (cap - used) * MAX_NODE_SCORE // cap
    return total // 2


def fit_error(num_nodes: int, statuses: Mapping[str, list[str]]) -> str:
    hist = Counter(reason for reasons in statuses.values() for reason in reasons)
    msg = f"0/{num_nodes} nodes are available:"
    parts = sorted(f"{n} {reason}" for reason, n in hist.items())
    if parts:
        msg += f" {', '.join(parts)}."
    return msg


def _ci(d: Mapping, key: str):
    """Go's encoding/json matches keys case-insensitively."""
    if not isinstance(d, Mapping):
        return None
    if key in d:
        return d[key]
    low = key.lower()
    return next((v for k, v in d.items() if k.lower() == low), None)


def _bare(obj: dict) -> dict:
    """As an informer's object: no TypeMeta."""
    return {k: v for k, v in obj.items() if k not in ("kind", "apiVersion")}


def _now_micro() -> str:
    return _dt.datetime.now(_dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


# ---------------------------------------------------------------------------
# the scheduler


class SchedulerStandIn:
    """See the module docstring. ``api``: an :class:`apiserver.ApiServer` (its
    ``url`` is used: everything goes over HTTP) or a base URL. ``config``: a
    KubeSchedulerConfiguration dict (``extenders``, ``profiles[].schedulerName``).
    ``period``: seconds between passes when no watch event comes. Over HTTPS
    (an :class:`apiserver.ApiServer` with ``tls=True``) the server's CA is
    trusted; ``token`` is the bearer token it authenticates as (default: the
    stand-in's admin token; kube-scheduler's own identity is
    ``system:kube-scheduler``, bound to a role that may bind any pod)."""

    def __init__(self, api, *, config: Mapping | None = None, period: float = 0.5, token: str = "standin") -> None:
        self.url = (api if isinstance(api, str) else api.url).rstrip("/")
        ca = None if isinstance(api, str) else getattr(api, "ca_pem", None)
        self._verify: ssl.SSLContext | bool = ssl.create_default_context(cadata=ca.decode()) if ca else True
        self._headers = {"Authorization": f"Bearer {token}"}
        if period <= 0:
            raise ValueError(f"period: {period!r} must be a positive number of seconds")
        self.period = period
        self.scheduler_names, self.extenders = parse_config(config)
        self.ignored = {name for e in self.extenders for name, ign in e.managed.items() if ign}
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._threads: list[threading.Thread] = []
        self._failures: dict[tuple[str, str], str] = {}
        self._lock = threading.Lock()
        self._http = httpx.Client(base_url=self.url, timeout=10, verify=self._verify, headers=self._headers)
        self._ext_http = httpx.Client()
        self._watch_clients: list[httpx.Client] = []
        self.passes = 0
        self._dra: Allocator | None = None
        self._dra_plans: dict = {}
        self.instance = f"{DEFAULT_SCHEDULER}-{socket.gethostname()}"

    # -- lifecycle -------------------------------------------------------------

    def start(self) -> SchedulerStandIn:
        if self._threads:
            raise RuntimeError("the scheduler stand-in is already started")
        self._threads = [threading.Thread(target=self._run, name="scheduler-standin", daemon=True)]
        for path in ("/api/v1/pods", "/api/v1/nodes"):
            client = httpx.Client(base_url=self.url, timeout=httpx.Timeout(5.0, read=None), verify=self._verify,
                                  headers=self._headers)
            self._watch_clients.append(client)  # made here, so that stop() can always close it
            self._threads.append(threading.Thread(target=self._watch, args=(path, client), daemon=True,
                                                  name=f"scheduler-standin-watch{path.replace('/', '-')}"))
        for t in self._threads:
            t.start()
        log.info("scheduler_standin_started", api=self.url, extenders=len(self.extenders))
        return self

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        for c in list(self._watch_clients):
            with contextlib.suppress(Exception):
                c.close()
        for t in self._threads:
            t.join(5)
        self._http.close()
        self._ext_http.close()

    def __enter__(self) -> SchedulerStandIn:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    # -- queries ---------------------------------------------------------------

    def last_failure(self, namespace: str, name: str) -> str | None:
        """The message of the pod's last failed attempt (cleared when bound)."""
        with self._lock:
            return self._failures.get((namespace, name))

    def wait_bound(self, namespace: str, name: str, timeout: float = 10.0) -> str:
        """The node the pod is bound to, waiting up to ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        while True:
            r = self._http.get(f"/api/v1/namespaces/{namespace}/pods/{name}")
            if r.status_code == 200 and (r.json().get("spec") or {}).get("nodeName"):
                return r.json()["spec"]["nodeName"]
            if time.monotonic() >= deadline:
                raise TimeoutError(f"pod {namespace}/{name} not bound within {timeout} s (last failure: "
                                   f"{self.last_failure(namespace, name)!r}; GET answered {r.status_code})")
            time.sleep(0.02)

    # -- loops -----------------------------------------------------------------

    def _watch(self, path: str, client: httpx.Client) -> None:
        rv = ""
        while not self._stop.is_set():
            try:
                params = {"watch": "1", "timeoutSeconds": "60", "allowWatchBookmarks": "true"}
                if rv:
                    params["resourceVersion"] = rv
                with client.stream("GET", path, params=params) as r:
                    if r.status_code != 200:
                        raise httpx.HTTPError(f"watch {path}: {r.status_code}")
                    for line in r.iter_lines():
                        if not line:
                            continue
                        ev = json.loads(line)
                        if ev.get("type") == "ERROR":
                            rv = ""  # 410: start again from the current state
                            break
                        rv = (ev.get("object") or {}).get("metadata", {}).get("resourceVersion") or rv
                        if ev.get("type") != "BOOKMARK":
                            self._wake.set()
            except (httpx.HTTPError, ValueError, RuntimeError):
                if self._stop.is_set():
                    return
                rv = ""
                self._stop.wait(0.2)

    def _run(self) -> None:
        while not self._stop.is_set():
            self._wake.clear()
            try:
                self.schedule_pass()
            except Exception:  # a bug or an API hiccup: say so, go on
                if self._stop.is_set():
                    return
                log.exception("scheduler_standin_pass_failed")
            self._wake.wait(self.period)
            self._stop.wait(0.005)  # let a burst of events settle

    # -- one pass --------------------------------------------------------------

    def _list(self, path: str) -> list[dict]:
        r = self._http.get(path)
        r.raise_for_status()
        return r.json()["items"]

    def schedule_pass(self) -> None:
        """One pass over every pending pod (the loop runs these)."""
        nodes = self._list("/api/v1/nodes")
        pods = self._list("/api/v1/pods")
        self._dra = self._dra_state(pods)
        states = {n["metadata"]["name"]: NodeState(n) for n in sorted(nodes, key=lambda n: n["metadata"]["name"])}
        pending = []
        for p in pods:
            spec, status = p.get("spec") or {}, p.get("status") or {}
            if status.get("phase") in ("Succeeded", "Failed"):
                continue
            if spec.get("nodeName"):
                if spec["nodeName"] in states:
                    states[spec["nodeName"]].add(p)
                continue
            if (spec.get("schedulerName") or DEFAULT_SCHEDULER) not in self.scheduler_names:
                continue
            if spec.get("schedulingGates") or p["metadata"].get("deletionTimestamp"):
                continue
            pending.append(p)
        pending.sort(key=lambda p: (-int((p.get("spec") or {}).get("priority") or 0),
                                    p["metadata"].get("creationTimestamp") or "", p["metadata"]["namespace"],
                                    p["metadata"]["name"]))
        self.passes += 1
        for p in pending:
            if self._stop.is_set():
                return
            self._schedule_one(p, states)

    # -- dynamic resources (dynamicresources.py) -------------------------------

    def _dra_state(self, pods: list[dict]) -> Allocator | None:
        """This pass's DRA view, after the claim controller's pass; None where the API has no resource.k8s.io."""
        r = self._http.get(f"{GROUP_PATH}/resourceslices")
        if r.status_code == 404:
            return None
        r.raise_for_status()
        slices = r.json()["items"]
        ClaimController(self._http).run_pass(pods, self._list(f"{GROUP_PATH}/resourceclaims"))
        return Allocator(slices, self._list(f"{GROUP_PATH}/deviceclasses"),
                         self._list(f"{GROUP_PATH}/resourceclaims"))

    def _dra_filter(self, pod: dict, st: NodeState) -> tuple[list[str], set[str]]:
        """DynamicResources' Filter on one node: (reasons, extended resources it serves there); the
        allocation it found is kept for PreBind."""
        dra = self._dra
        if dra is None:
            return [], set()
        claims = pod_claims(pod, dra.claims)  # Unresolved: PreFilter failed (raised to the caller)
        ext = extended_requests(pod, dra.extended_classes(), st.allocatable())
        if not claims and not ext:
            return [], set()
        usage = Usage(set(dra.usage.exclusive), {k: dict(v) for k, v in dra.usage.consumed.items()},
                      {k: dict(v) for k, v in dra.usage.counters.items()}, set(dra.usage.counted))
        plan = []
        for _, claim in claims:
            where = allocated_node(claim)
            if where is not None:
                if where not in ("", st.name):
                    return [REASON_WRONG_NODE], set()
                continue
            got = dra.allocate_claim(claim.get("spec") or {}, st.node, usage)
            if got is None:
                return [REASON_CLAIMS], set()
            plan.append((claim, got))
        ext_plan = None
        if ext:
            spec, mappings = extended_claim(pod, ext)
            got = dra.allocate_claim(spec, st.node, usage)
            if got is None:
                return [REASON_CLAIMS], set()
            ext_plan = (spec, mappings, got)
        self._dra_plans[st.name] = (plan, ext_plan, usage, [c for _, c in claims])
        return [], {r for _, r, _, _ in ext}

    def _dra_prebind(self, pod: dict, node: str) -> None:
        """Write the claims' allocation and the pod's reservation into them (PreBind), and remember it."""
        if self._dra is None or node not in self._dra_plans:
            return
        plan, ext_plan, usage, claims = self._dra_plans[node]
        meta = pod["metadata"]
        me = {"resource": "pods", "name": meta["name"], "uid": meta["uid"]}
        for claim in claims:
            status = dict(claim.get("status") or {})
            alloc = next((a for c, a in plan if c is claim), None)
            if alloc is not None:
                status["allocation"] = alloc
            reserved = list(status.get("reservedFor") or [])
            if me not in reserved:
                reserved.append(me)
            status["reservedFor"] = reserved
            cm = claim["metadata"]
            r = self._http.put(f"{GROUP_PATH}/namespaces/{cm['namespace']}/resourceclaims/{cm['name']}/status",
                               json={**claim, "status": status})
            if r.status_code != 200:
                raise SchedulingError(f"running PreBind plugin \"DynamicResources\": {r.text[:300]}")
        if ext_plan is not None:
            spec, mappings, alloc = ext_plan
            r = self._http.post(f"{GROUP_PATH}/namespaces/{meta['namespace']}/resourceclaims", json={
                "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
                "metadata": {"generateName": f"{meta['name']}-extended-resources-", "namespace": meta["namespace"],
                             "annotations": {EXTENDED_ANNOTATION: "true"},
                             "ownerReferences": [{"apiVersion": "v1", "kind": "Pod", "name": meta["name"],
                                                  "uid": meta["uid"], "controller": True,
                                                  "blockOwnerDeletion": True}]},
                "spec": spec})
            if r.status_code != 201:
                raise SchedulingError(f"running PreBind plugin \"DynamicResources\": {r.text[:300]}")
            made = r.json()
            made["status"] = {"allocation": alloc, "reservedFor": [me]}
            r = self._http.put(f"{GROUP_PATH}/namespaces/{meta['namespace']}/resourceclaims/"
                               f"{made['metadata']['name']}/status", json=made)
            if r.status_code != 200:
                raise SchedulingError(f"running PreBind plugin \"DynamicResources\": {r.text[:300]}")
            r = self._http.patch(f"/api/v1/namespaces/{meta['namespace']}/pods/{meta['name']}/status",
                                 content=json.dumps({"status": {"extendedResourceClaimStatus": {
                                     "resourceClaimName": made["metadata"]["name"], "requestMappings": mappings}}}),
                                 headers={"Content-Type": "application/merge-patch+json"})
        self._dra.usage = usage  # the next pods of this pass see what this one holds

    def _filter(self, pod: dict, states: Mapping[str, NodeState]) -> tuple[list[NodeState], dict[str, list[str]]]:
        feasible, statuses = [], {}
        requests, ports = pod_requests(pod), host_ports(pod)
        self._dra_plans = {}
        for st in states.values():
            reasons = (filter_unschedulable(pod, st.node) or filter_node_name(pod, st.node)
                       or filter_taints(pod, st.node) or filter_affinity(pod, st.node)
                       or ([REASON_PORTS] if ports_conflict(ports, st.ports) else []))
            if not reasons:
                reasons, by_dra = self._dra_filter(pod, st)
                reasons = reasons or filter_resources(pod, st, self.ignored | by_dra, requests)
            if reasons:
                statuses[st.name] = reasons
            else:
                feasible.append(st)
        for ext in self.extenders:
            if not feasible:
                break
            if not ext.filter_verb or not ext.interested(pod):
                continue
            try:
                kept, failed, unresolvable = self._extender_filter(ext, pod, feasible)
            except ExtenderError as e:
                if ext.ignorable:
                    log.info("scheduler_standin_extender_skipped", extender=ext.url_prefix, error=str(e))
                    continue
                raise SchedulingError(str(e)) from None
            for n, why in (unresolvable or {}).items():
                statuses[n] = [why]
            for n, why in (failed or {}).items():
                if n not in (unresolvable or {}):
                    statuses[n] = [why]
            feasible = kept
        return feasible, statuses

    def _extender_filter(self, ext: Extender, pod: dict, feasible: list[NodeState]):
        by_name = {st.name: st for st in feasible}
        args: dict = {"Pod": _bare(pod)}
        if ext.node_cache_capable:
            args["NodeNames"] = list(by_name)
        else:
            args["Nodes"] = {"metadata": {}, "items": [_bare(st.node) for st in feasible]}
        result = ext.send(self._ext_http, ext.filter_verb, args)
        if not isinstance(result, Mapping):
            raise ExtenderError(f"extender {ext.url_prefix!r} answered filter with {type(result).__name__}, not an "
                                f"ExtenderFilterResult object")
        if _ci(result, "Error"):
            raise ExtenderError(str(_ci(result, "Error")))
        names = _ci(result, "NodeNames")
        nodes = _ci(result, "Nodes")
        if ext.node_cache_capable and names is not None:
            chosen = list(names)
        elif nodes is not None:
            chosen = [(_ci(n, "metadata") or {}).get("name") for n in (_ci(nodes, "items") or [])]
        else:
            chosen = []
        kept = []
        for n in chosen:
            if n not in by_name:
                raise ExtenderError(f'extender "{ext.url_prefix}" claims a filtered node "{n}" which is not found in '
                                    f"the input node list")
            kept.append(by_name[n])
        return kept, _ci(result, "FailedNodes"), _ci(result, "FailedAndUnresolvableNodes")

    def _score(self, pod: dict, feasible: list[NodeState]) -> NodeState:
        scores = {st.name: least_allocated(pod, st) for st in feasible}
        for ext in self.extenders:
            if not ext.prioritize_verb or not ext.interested(pod):
                continue
            args: dict = {"Pod": _bare(pod)}
            if ext.node_cache_capable:
                args["NodeNames"] = [st.name for st in feasible]
            else:
                args["Nodes"] = {"metadata": {}, "items": [_bare(st.node) for st in feasible]}
            try:
                result = ext.send(self._ext_http, ext.prioritize_verb, args)
            except ExtenderError as e:
                log.info("scheduler_standin_prioritize_failed", extender=ext.url_prefix, error=str(e))
                continue  # no score from this extender, as kube-scheduler
            for hp in result if isinstance(result, list) else []:
                host, score = _ci(hp, "Host"), _ci(hp, "Score")
                if host in scores and isinstance(score, int):
                    scores[host] += score * ext.weight * (MAX_NODE_SCORE // MAX_EXTENDER_PRIORITY)
        best = max(scores.values())
        return next(st for st in feasible if scores[st.name] == best)

    def _schedule_one(self, pod: dict, states: dict[str, NodeState]) -> None:
        meta = pod["metadata"]
        ns, name = meta["namespace"], meta["name"]
        try:
            if not states:
                raise _Unschedulable("0/0 nodes are available: no nodes available to schedule pods.")
            try:
                feasible, statuses = self._filter(pod, states)
            except Unresolved as e:
                raise _Unschedulable(f"0/{len(states)} nodes are available: {e}.") from None
            if not feasible:
                raise _Unschedulable(fit_error(len(states), statuses))
            chosen = feasible[0] if len(feasible) == 1 else self._score(pod, feasible)
            self._dra_prebind(pod, chosen.name)
            with self._lock:  # the failure goes with the bind: whoever sees the pod bound reads none left
                self._bind(pod, chosen.name)
                self._failures.pop((ns, name), None)
        except _Unschedulable as e:
            self._failed(pod, "Unschedulable", str(e))
            return
        except SchedulingError as e:
            self._failed(pod, "SchedulerError", str(e))
            return
        chosen.add(pod)
        self._event(pod, "Normal", "Scheduled", "Binding", f"Successfully assigned {ns}/{name} to {chosen.name}")
        log.info("scheduler_standin_bound", pod=f"{ns}/{name}", node=chosen.name)

    def _bind(self, pod: dict, node: str) -> None:
        meta = pod["metadata"]
        for ext in self.extenders:
            if not ext.bind_verb or not ext.interested(pod):
                continue
            try:
                result = ext.send(self._ext_http, ext.bind_verb, {
                    "PodName": meta["name"], "PodNamespace": meta["namespace"], "PodUID": meta["uid"], "Node": node})
                if _ci(result, "Error"):
                    raise ExtenderError(str(_ci(result, "Error")))
            except ExtenderError as e:
                if ext.ignorable:
                    log.info("scheduler_standin_extender_bind_skipped", extender=ext.url_prefix, error=str(e))
                    continue
                raise SchedulingError(f"binding rejected: {e}") from None
            return
        r = self._http.post(f"/api/v1/namespaces/{meta['namespace']}/pods/{meta['name']}/binding", json={
            "apiVersion": "v1", "kind": "Binding",
            "metadata": {"name": meta["name"], "namespace": meta["namespace"], "uid": meta["uid"]},
            "target": {"kind": "Node", "name": node}})
        if r.status_code != 201:
            try:
                why = r.json().get("message") or r.text
            except ValueError:
                why = r.text
            raise SchedulingError(f"binding rejected: running Bind plugin \"DefaultBinder\": {why}")

    def _failed(self, pod: dict, reason: str, message: str) -> None:
        meta = pod["metadata"]
        key = (meta["namespace"], meta["name"])
        with self._lock:
            changed = self._failures.get(key) != message
        cond = next((c for c in (pod.get("status") or {}).get("conditions") or [] if c.get("type") == "PodScheduled"),
                    None)
        if not cond or (cond.get("status"), cond.get("reason"), cond.get("message")) != ("False", reason, message):
            r = self._http.patch(
                f"/api/v1/namespaces/{key[0]}/pods/{key[1]}/status",
                content=json.dumps({"status": {"conditions": [
                    {"type": "PodScheduled", "status": "False", "reason": reason, "message": message,
                     "lastProbeTime": None, "lastTransitionTime": _dt.datetime.now(_dt.UTC).strftime(
                         "%Y-%m-%dT%H:%M:%SZ")}]}}),
                headers={"Content-Type": "application/strategic-merge-patch+json"})
            if r.status_code not in (200, 404):
                log.warning("scheduler_standin_condition_failed", pod=f"{key[0]}/{key[1]}", code=r.status_code,
                            body=r.text[:300])
        if changed:
            self._event(pod, "Warning", "FailedScheduling", "Scheduling", message)
            log.info("scheduler_standin_unschedulable", pod=f"{key[0]}/{key[1]}", reason=reason, message=message)
        with self._lock:  # recorded last: whoever sees it can already read the condition and the event
            self._failures[key] = message

    def _event(self, pod: dict, type_: str, reason: str, action: str, note: str) -> None:
        meta = pod["metadata"]
        ev = {"apiVersion": "events.k8s.io/v1", "kind": "Event",
              "metadata": {"name": f"{meta['name']}.{time.time_ns():x}", "namespace": meta["namespace"]},
              "eventTime": _now_micro(), "reportingController": DEFAULT_SCHEDULER,
              "reportingInstance": self.instance, "action": action, "reason": reason, "type": type_, "note": note,
              "regarding": {"kind": "Pod", "apiVersion": "v1", "namespace": meta["namespace"], "name": meta["name"],
                            "uid": meta.get("uid"), "resourceVersion": meta.get("resourceVersion")}}
        r = self._http.post(f"/apis/events.k8s.io/v1/namespaces/{meta['namespace']}/events", json=ev)
        if r.status_code != 201:
            log.warning("scheduler_standin_event_failed", code=r.status_code, body=r.text[:300])


class _Unschedulable(Exception):
    pass


__all__ = ["DEFAULT_SCHEDULER", "Extender", "ExtenderError", "SchedulerStandIn", "fit_error", "parse_config",
           "parse_duration", "pod_requests"]
