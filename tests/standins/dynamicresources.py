"""A STAND-IN for kube-scheduler's DynamicResources plugin and for kube-controller-manager's
resourceclaim controller, for tests (used by :mod:`scheduler`). Written from the
``resource.k8s.io/v1`` field comments (kubernetes/api ``resource/v1/types.go``) and
KEP-4381/4815/5004/5075; it imports nothing of hamid.

Allocation (per pod and node, first fit, as the structured allocator):

* a pod's claims: ``spec.resourceClaims[]`` by ``resourceClaimName``, or by
  ``resourceClaimTemplateName`` through ``status.resourceClaimStatuses`` (until
  the controller made the claim: ``waiting for resource claim creation``);
  a claim already allocated must be for this node (its ``nodeSelector``);
* pools: the ResourceSlices of the node (``nodeName``) or of all nodes
  (``allNodes``), per (driver, pool) only the highest generation, and only
  complete pools (as many slices as ``resourceSliceCount``);
* each request in order (``exactly``; ``firstAvailable``: the first
  subrequest that can be satisfied), ``count`` devices (``All``: every
  matching one), each the first device in pool order that: matches the
  class's and the request's CEL selectors (``device.driver``,
  ``device.attributes[domain].name``, ``device.capacity[domain].name`` as an
  integer, ``device.allowMultipleAllocations``; versions are strings here); is
  not tainted ``NoSchedule``/``NoExecute`` without a toleration in the request;
  is free (a device without ``allowMultipleAllocations`` is used by no claim;
  one with it has room for the request's capacity: each capacity the request
  names, else the policy's default, else all of it, rounded up by the
  ``requestPolicy`` (min, step; over max or no valid value: no fit), summed
  with every other allocation of it, at most its ``capacity``); and whose
  ``consumesCounters`` fit in the pool's ``sharedCounters`` beside every
  allocated device's. No backtracking, no ``constraints`` (matchAttribute /
  distinctAttribute are refused), no admin access, no binding conditions.
* nothing fits: the node's reason is ``cannot allocate all claims``.
* the result: ``status.allocation`` (``devices.results`` with ``shareID`` and
  ``consumedCapacity`` for shared devices; ``devices.config`` from the class,
  then the claim; ``nodeSelector`` on the node's name;
  ``allocationTimestamp``) and ``status.reservedFor`` the pod, written before
  the pod is bound (PreBind).
* extended resources (KEP-5004): a container asking for a resource that a
  DeviceClass names in ``extendedResourceName`` on a node whose allocatable
  does not list it is served by a claim the scheduler makes (annotation
  ``resource.kubernetes.io/extended-resource-claim: "true"``, one request per
  container and resource, ``count`` the amount), recorded in the pod's
  ``status.extendedResourceClaimStatus``.

The controller part, each pass: claims from templates are made for pods that
need them (``<pod>-<claim>-<5 random>``, owned by the pod); a claim's
``reservedFor`` loses pods that are gone or ended, and a claim no pod uses
any more is deallocated; claims a pod owns are deleted once the pod is gone
(as the garbage collector does).
"""

from __future__ import annotations

import datetime as _dt
import json
import secrets
import uuid
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

import celpy
from kubernetes.utils import parse_quantity

GROUP_PATH = "/apis/resource.k8s.io/v1"
REASON_CLAIMS = "cannot allocate all claims"
REASON_WRONG_NODE = "resourceclaim not available on the node"
EXTENDED_ANNOTATION = "resource.kubernetes.io/extended-resource-claim"


class Unresolved(Exception):
    """The pod's claims are not all there yet (a reason for every node)."""


def _q(v: Any) -> Fraction:
    return Fraction(str(parse_quantity(v)))


def _fmt(q: Fraction) -> str:
    return str(int(q)) if q.denominator == 1 else str(float(q))


def _now() -> str:
    return _dt.datetime.now(_dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass
class Device:
    driver: str
    pool: str
    slice_index: int
    spec: dict

    @property
    def name(self) -> str:
        return self.spec["name"]

    @property
    def key(self) -> tuple[str, str, str]:
        return self.driver, self.pool, self.name

    @property
    def shared(self) -> bool:
        return bool(self.spec.get("allowMultipleAllocations"))


@dataclass
class Usage:
    """What allocated claims (and this pass's in-flight ones) hold."""

    exclusive: set = field(default_factory=set)  # device keys
    consumed: dict = field(default_factory=dict)  # device key -> {capacity: Fraction}
    counters: dict = field(default_factory=dict)  # (driver, pool, set) -> {counter: Fraction}
    counted: set = field(default_factory=set)  # device keys whose counters are counted

    def add(self, dev: Device, consumed: dict[str, Fraction] | None) -> None:
        if dev.shared:
            into = self.consumed.setdefault(dev.key, {})
            for k, v in (consumed or {}).items():
                into[k] = into.get(k, Fraction(0)) + v
        else:
            self.exclusive.add(dev.key)
        if dev.key not in self.counted:
            self.counted.add(dev.key)
            for c in dev.spec.get("consumesCounters") or []:
                into = self.counters.setdefault((dev.driver, dev.pool, c["counterSet"]), {})
                for k, v in (c.get("counters") or {}).items():
                    into[k] = into.get(k, Fraction(0)) + _q(v["value"])


def _cel_device(dev: Device) -> dict:
    def qualified(m: dict, conv) -> dict:
        out: dict = {}
        for k, v in (m or {}).items():
            domain, sep, name = k.rpartition("/")
            out.setdefault(domain if sep else dev.driver, {})[name] = conv(v)
        return out

    def attr(v: dict):
        for k in ("int", "bool", "string", "version"):
            if k in v:
                return v[k]
        return None

    return {"driver": dev.driver, "attributes": qualified(dev.spec.get("attributes"), attr),
            "capacity": qualified(dev.spec.get("capacity"), lambda c: int(_q(c["value"]))),
            "allowMultipleAllocations": dev.shared}


class Cel:
    def __init__(self) -> None:
        self.env = celpy.Environment()
        self.programs: dict[str, Any] = {}

    def matches(self, expr: str, dev: Device) -> bool:
        prog = self.programs.get(expr)
        if prog is None:
            prog = self.programs[expr] = self.env.program(self.env.compile(expr))
        try:
            return bool(prog.evaluate({"device": celpy.json_to_cel(_cel_device(dev))}))
        except Exception:  # a runtime error (a missing attribute): the device does not match, as the allocator
            return False


def _tolerates(tols: list, taint: dict) -> bool:
    for t in tols or []:
        if t.get("effect") and t["effect"] != taint.get("effect"):
            continue
        if t.get("operator") == "Exists" and (not t.get("key") or t["key"] == taint.get("key")):
            return True
        if t.get("key") == taint.get("key") and t.get("value", "") == taint.get("value", ""):
            return True
    return False


def consumption(dev: Device, requests: dict[str, Any]) -> dict[str, Fraction] | None:
    """What a request consumes of a shared device's capacities (None: the device cannot serve it)."""
    caps = dev.spec.get("capacity") or {}
    for name in requests:
        if name not in caps and f"{dev.driver}/{name}" not in caps:
            return None
    out = {}
    for name, cap in caps.items():
        value = _q(cap["value"])
        policy = cap.get("requestPolicy")
        asked = requests.get(name, requests.get(name.rpartition("/")[2]))
        if asked is None:
            want = _q(policy["default"]) if policy and "default" in policy else value
        else:
            want = _q(asked)
        if policy:
            if policy.get("validValues") is not None:
                fits = sorted(v for v in map(_q, policy["validValues"]) if v >= want)
                if not fits:
                    return None
                want = fits[0]
            elif policy.get("validRange") is not None:
                rng = policy["validRange"]
                lo = _q(rng["min"])
                want = max(want, lo)
                if rng.get("step") is not None:
                    step = _q(rng["step"])
                    n = -(-(want - lo) // step)
                    want = lo + n * step
                if rng.get("max") is not None and want > _q(rng["max"]):
                    return None
        out[name] = want
    return out


class Allocator:
    """One pass's view: slices, classes and claims, and what is allocated."""

    def __init__(self, slices: list[dict], classes: list[dict], claims: list[dict]) -> None:
        self.classes = {c["metadata"]["name"]: c for c in classes}
        self.claims = {(c["metadata"]["namespace"], c["metadata"]["name"]): c for c in claims}
        self.cel = Cel()
        best: dict[tuple[str, str], int] = {}
        for s in slices:
            sp = s["spec"]
            k = (sp["driver"], sp["pool"]["name"])
            best[k] = max(best.get(k, -1), int(sp["pool"].get("generation") or 0))
        self.pools: dict[tuple[str, str], list[dict]] = {}
        for s in sorted(slices, key=lambda s: s["metadata"]["name"]):
            sp = s["spec"]
            k = (sp["driver"], sp["pool"]["name"])
            if int(sp["pool"].get("generation") or 0) == best[k]:
                self.pools.setdefault(k, []).append(s)
        self.usage = Usage()
        self.devices_by_key: dict[tuple[str, str, str], Device] = {}
        for ps in self.pools.values():
            for i, s in enumerate(ps):
                for d in s["spec"].get("devices") or []:
                    dev = Device(s["spec"]["driver"], s["spec"]["pool"]["name"], i, d)
                    self.devices_by_key[dev.key] = dev
        for c in claims:
            self._count(c)

    def _count(self, claim: dict) -> None:
        for r in ((((claim.get("status") or {}).get("allocation") or {}).get("devices") or {}).get("results") or []):
            dev = self.devices_by_key.get((r["driver"], r["pool"], r["device"]))
            if dev is not None:
                self.usage.add(dev, {k: _q(v) for k, v in (r.get("consumedCapacity") or {}).items()})

    def extended_classes(self) -> dict[str, str]:
        return {(c.get("spec") or {})["extendedResourceName"]: n for n, c in sorted(self.classes.items())
                if (c.get("spec") or {}).get("extendedResourceName")}

    def node_devices(self, node: dict) -> list[tuple[Device, list]]:
        """The devices of complete pools on ``node``, in pool order, with their pool's counter sets."""
        name = node["metadata"]["name"]
        out = []
        for (driver, pool), ps in sorted(self.pools.items()):
            want = int(ps[0]["spec"]["pool"].get("resourceSliceCount") or 1)
            if len(ps) != want:
                continue  # an incomplete pool is not used
            if not all(s["spec"].get("nodeName") == name or s["spec"].get("allNodes") for s in ps):
                continue
            for i, s in enumerate(ps):
                for d in s["spec"].get("devices") or []:
                    out.append((Device(driver, pool, i, d), ps))
        return out

    def _counters_fit(self, dev: Device, slices: list[dict], usage: Usage) -> bool:
        if dev.key in usage.counted:
            return True
        for c in dev.spec.get("consumesCounters") or []:
            total = next((cs["counters"] for s in slices for cs in s["spec"].get("sharedCounters") or []
                          if cs["name"] == c["counterSet"]), None)
            if total is None:
                return False
            used = usage.counters.get((dev.driver, dev.pool, c["counterSet"]), {})
            for k, v in (c.get("counters") or {}).items():
                if k not in total or used.get(k, Fraction(0)) + _q(v["value"]) > _q(total[k]["value"]):
                    return False
        return True

    def _fits(self, dev: Device, slices: list[dict], ex: dict, cls: dict, usage: Usage,
              taken: set) -> dict[str, Fraction] | None | bool:
        """False: no; None: yes, exclusively; a dict: yes, consuming that."""
        sels = ((cls.get("spec") or {}).get("selectors") or []) + (ex.get("selectors") or [])
        if not all(self.cel.matches(s["cel"]["expression"], dev) for s in sels):
            return False
        for t in dev.spec.get("taints") or []:
            if t.get("effect") in ("NoSchedule", "NoExecute") and not _tolerates(ex.get("tolerations"), t):
                return False
        if dev.key in taken or dev.key in usage.exclusive:
            return False
        if not self._counters_fit(dev, slices, usage):
            return False
        reqs = (ex.get("capacity") or {}).get("requests") or {}
        if not dev.shared:
            if dev.key in usage.consumed:
                return False
            caps = dev.spec.get("capacity") or {}
            for k, v in reqs.items():
                if k not in caps or _q(v) > _q(caps[k]["value"]):
                    return False
            return None
        want = consumption(dev, reqs)
        if want is None:
            return False
        used = usage.consumed.get(dev.key, {})
        caps = dev.spec.get("capacity") or {}
        for k, v in want.items():
            if used.get(k, Fraction(0)) + v > _q(caps[k]["value"]):
                return False
        return want

    def allocate_claim(self, claim_spec: dict, node: dict, usage: Usage) -> dict | None:
        """The claim's allocation on ``node`` (usage updated), or None when it does not fit."""
        devices = self.node_devices(node)
        spec_devices = claim_spec.get("devices") or {}
        if spec_devices.get("constraints"):
            raise ValueError("the DRA stand-in does not implement constraints")
        results, configs, taken = [], [], set()
        for r in spec_devices.get("requests") or []:
            options = [(r["name"], r["exactly"])] if r.get("exactly") else \
                [(f"{r['name']}/{s['name']}", s) for s in r.get("firstAvailable") or []]
            got = None
            for req_name, ex in options:
                cls = self.classes.get(ex.get("deviceClassName"))
                if cls is None:
                    continue
                trial = Usage(set(usage.exclusive), {k: dict(v) for k, v in usage.consumed.items()},
                              {k: dict(v) for k, v in usage.counters.items()}, set(usage.counted))
                chosen = []
                all_mode = ex.get("allocationMode") == "All"
                need = None if all_mode else int(ex.get("count") or 1)
                for dev, slices in devices:
                    if need is not None and len(chosen) == need:
                        break
                    fit = self._fits(dev, slices, ex, cls, trial, taken | {d.key for d, _ in chosen})
                    if fit is False:
                        if all_mode:
                            chosen = []
                            break
                        continue
                    trial.add(dev, fit if isinstance(fit, dict) else None)
                    chosen.append((dev, fit))
                if chosen and (all_mode or len(chosen) == need):
                    got = (req_name, ex, cls, chosen, trial)
                    break
            if got is None:
                return None
            req_name, ex, cls, chosen, trial = got
            usage.exclusive, usage.consumed, usage.counters, usage.counted = \
                trial.exclusive, trial.consumed, trial.counters, trial.counted
            for dev, fit in chosen:
                taken.add(dev.key)
                res = {"request": req_name, "driver": dev.driver, "pool": dev.pool, "device": dev.name}
                if ex.get("tolerations"):
                    res["tolerations"] = ex["tolerations"]
                if isinstance(fit, dict):
                    res["shareID"] = str(uuid.uuid4())
                    res["consumedCapacity"] = {k: _fmt(v) for k, v in fit.items()}
                results.append(res)
            for c in (cls.get("spec") or {}).get("config") or []:
                configs.append({"source": "FromClass", "requests": [r["name"]], **c})
        for c in spec_devices.get("config") or []:
            configs.append({"source": "FromClaim", **c})
        node_name = node["metadata"]["name"]
        alloc: dict = {"devices": {"results": results}, "allocationTimestamp": _now(),
                       "nodeSelector": {"nodeSelectorTerms": [{"matchFields": [
                           {"key": "metadata.name", "operator": "In", "values": [node_name]}]}]}}
        if configs:
            alloc["devices"]["config"] = configs
        return alloc


def allocated_node(claim: dict) -> str | None:
    alloc = (claim.get("status") or {}).get("allocation")
    if not alloc:
        return None
    for t in ((alloc.get("nodeSelector") or {}).get("nodeSelectorTerms") or []):
        for f in t.get("matchFields") or []:
            if f.get("key") == "metadata.name" and f.get("values"):
                return f["values"][0]
    return ""


def pod_claims(pod: dict, claims: dict) -> list[tuple[str, dict]]:
    """(name in the pod, the claim) for each of the pod's claims; :class:`Unresolved` when one is missing."""
    ns = pod["metadata"]["namespace"]
    statuses = {s["name"]: s.get("resourceClaimName")
                for s in (pod.get("status") or {}).get("resourceClaimStatuses") or []}
    out = []
    for rc in (pod.get("spec") or {}).get("resourceClaims") or []:
        if rc.get("resourceClaimName"):
            name = rc["resourceClaimName"]
        elif rc["name"] in statuses:
            name = statuses[rc["name"]]
            if name is None:
                continue  # the template made no claim (none needed)
        else:
            raise Unresolved("waiting for resource claim creation")
        claim = claims.get((ns, name))
        if claim is None:
            raise Unresolved(f'resourceclaim "{name}" not found')
        if (claim.get("metadata") or {}).get("deletionTimestamp"):
            raise Unresolved(f'resourceclaim "{name}" is being deleted')
        out.append((rc["name"], claim))
    return out


def extended_requests(pod: dict, classes: dict[str, str], allocatable: dict) -> list[tuple[str, str, str, int]]:
    """(container, resource, class, count) a node without the resource in its allocatable serves by DRA."""
    out = []
    for c in (pod.get("spec") or {}).get("containers") or []:
        res = c.get("resources") or {}
        want = {**(res.get("requests") or {}), **(res.get("limits") or {})}
        for r, v in sorted(want.items()):
            if r in classes and r not in allocatable:
                out.append((c["name"], r, classes[r], int(parse_quantity(v))))
    return out


def extended_claim(pod: dict, wants: list[tuple[str, str, str, int]]) -> tuple[dict, list[dict]]:
    """The special claim's spec and the pod's request mappings."""
    reqs, mappings = [], []
    for i, (container, resource, cls, n) in enumerate(wants):
        rn = f"container-{i}-request-0"
        reqs.append({"name": rn, "exactly": {"deviceClassName": cls, "allocationMode": "ExactCount", "count": n}})
        mappings.append({"containerName": container, "resourceName": resource, "requestName": rn})
    return {"devices": {"requests": reqs}}, mappings


def _owner(pod: dict) -> dict:
    m = pod["metadata"]
    return {"apiVersion": "v1", "kind": "Pod", "name": m["name"], "uid": m["uid"], "controller": True,
            "blockOwnerDeletion": True}


class ClaimController:
    """The resourceclaim controller's part (see the module docstring), over the scheduler's HTTP client."""

    def __init__(self, http) -> None:
        self.http = http

    def run_pass(self, pods: list[dict], claims: list[dict]) -> None:
        live = {p["metadata"]["uid"]: p for p in pods
                if (p.get("status") or {}).get("phase") not in ("Succeeded", "Failed")}
        all_uids = {p["metadata"]["uid"] for p in pods}
        for p in pods:
            if p["metadata"]["uid"] in live and not (p.get("spec") or {}).get("nodeName"):
                self._make_template_claims(p, claims)
        for c in claims:
            meta = c["metadata"]
            owner = next((o for o in meta.get("ownerReferences") or [] if o.get("kind") == "Pod"), None)
            if owner is not None and owner["uid"] not in all_uids:
                self.http.delete(f"{GROUP_PATH}/namespaces/{meta['namespace']}/resourceclaims/{meta['name']}")
                continue
            status = c.get("status") or {}
            reserved = status.get("reservedFor") or []
            keep = [r for r in reserved if r.get("resource") != "pods" or r.get("uid") in live]
            if keep != reserved or (not keep and status.get("allocation")):
                new = dict(status)
                if keep:
                    new["reservedFor"] = keep
                else:
                    new.pop("reservedFor", None)
                    new.pop("allocation", None)  # no pod uses it: deallocated
                body = {**c, "status": new}
                self.http.put(f"{GROUP_PATH}/namespaces/{meta['namespace']}/resourceclaims/{meta['name']}/status",
                              json=body)

    def _make_template_claims(self, pod: dict, claims: list[dict]) -> None:
        meta = pod["metadata"]
        ns = meta["namespace"]
        have = {s["name"] for s in (pod.get("status") or {}).get("resourceClaimStatuses") or []}
        statuses = list((pod.get("status") or {}).get("resourceClaimStatuses") or [])
        made = False
        for rc in (pod.get("spec") or {}).get("resourceClaims") or []:
            tname = rc.get("resourceClaimTemplateName")
            if not tname or rc["name"] in have:
                continue
            r = self.http.get(f"{GROUP_PATH}/namespaces/{ns}/resourceclaimtemplates/{tname}")
            if r.status_code != 200:
                continue
            tmpl = r.json()
            name = f"{meta['name']}-{rc['name']}-{secrets.token_hex(3)[:5]}"
            claim = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
                     "metadata": {"name": name, "namespace": ns,
                                  "annotations": {"resource.kubernetes.io/pod-claim-name": rc["name"]},
                                  "ownerReferences": [_owner(pod)]},
                     "spec": (tmpl.get("spec") or {}).get("spec") or {}}
            r = self.http.post(f"{GROUP_PATH}/namespaces/{ns}/resourceclaims", json=claim)
            if r.status_code != 201:
                continue
            statuses.append({"name": rc["name"], "resourceClaimName": name})
            made = True
        if made:
            self.http.patch(f"/api/v1/namespaces/{ns}/pods/{meta['name']}/status",
                            content=json.dumps({"status": {"resourceClaimStatuses": statuses}}),
                            headers={"Content-Type": "application/merge-patch+json"})
