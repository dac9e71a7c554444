"""``hamid plan``: what-if placement over a cluster file and a workload file.

Cluster file (YAML)::

    config:                # optional: global node settings (same keys as the config file)
      deviceSplitCount: 4
    nodes:
      - name: node-a
        gpus: H100-80GB-HBM3:2,T4      # catalog models, as --simulate takes them
        config: {operatingMode: mig}   # optional per-node overrides
        unhealthy: [1]                 # optional: GPUs (index or UUID) that report unhealthy
        annotations:                   # optional: node annotations hamid reads
          hami.io/device-cordon: GPU-...   # GPUs that take no new tenants

The top-level ``config`` also takes the resource names
(``resourceCountName``...) pods are parsed with. Link scores between GPUs
come from the catalog (NVLink boards) and the simulated NUMA nodes.

Workload file: multi-document YAML of Kubernetes Pods (``kind: Pod``) and
Docker entries::

    kind: Docker
    name: trainer
    node: node-a           # optional: a Docker container runs on one host
    env: {HAMI_VISIBLE_DEVICES: "0", HAMI_VGPU_SPEC: "mem=4g,cores=30"}
    ---
    apiVersion: v1
    kind: Pod              # as kubectl would apply it: HAMi's resources and annotations
    metadata: {name: infer, namespace: ml, annotations: {nvidia.com/use-gputype: H100}}
    spec:
      containers:
        - name: main
          resources:
            limits: {nvidia.com/gpu: 1, nvidia.com/gpumem: 4000, nvidia.com/gpucores: 30}

Items are placed in order; each sees the ones before it. A pod asking more
than 100 gpucores is placed as HAMi places it (the whole GPU), with a
warning, as the webhook warns. ``-o json`` prints,
per item, every node considered with each GPU's capacity and use before the
item (memory, cores, shares, model and HAMi type, health, cordon,
exclusivity, MIG instances) and its score for the item, so that a decision
can be checked against the printed numbers alone.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from ..config import NodeSettings
from ..config.load import ConfigError
from ..config.schema import ResourceNameSettings
from ..node.capacity import capacity_views
from ..devices.simulated import SimulatedBackend, parse_simulate_spec
from ..devices.errors import DeviceError
from ..errors import HamidError
from ..placement import Decision, NodeView, place
from ..placement.engine import gpu_scores
from ..placement.result import NoFit
from ..placement.usage import with_usage
from ..placement.view import MODE_MIG, GpuView, restrict_mig_profiles
from ..request import Defaults, RequestError, parse_docker_env, parse_pod
from ..request.docker import whole_card_note
from ..request.kube import ANN_DEVICE_CORDON, clamp_message, cores_clamped, parse_device_cordon
from ..request.model import ResourceNames


class _Node(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str = Field(min_length=1)
    gpus: str
    config: dict[str, Any] = {}
    unhealthy: list[int | str] = []
    annotations: dict[str, str] = {}


class _Cluster(BaseModel):
    model_config = ConfigDict(extra="forbid")
    config: dict[str, Any] = {}
    nodes: list[_Node] = Field(min_length=1)


class PlanNode:
    def __init__(self, name: str, settings: NodeSettings, capacity, names: ResourceNames = ResourceNames()) -> None:
        self.name = name
        self.settings = settings
        self.capacity = capacity
        self.names = names
        self.decisions: list[Decision] = []

    def view(self) -> NodeView:
        return with_usage(self.name, self.capacity, self.decisions, self.settings.gpuSchedulerPolicy)


def _settings(base: dict, over: dict, where: str) -> NodeSettings:
    try:
        return NodeSettings.model_validate({**base, **over})
    except ValidationError as e:
        msgs = "; ".join(f"{'.'.join(map(str, x['loc']))}={x.get('input')!r}: {x['msg']}" for x in e.errors())
        raise ConfigError(f"{where}: {msgs}") from None


def load_cluster(path: str | Path) -> list[PlanNode]:
    try:
        data = yaml.safe_load(Path(path).read_text())
    except OSError as e:
        raise HamidError(f"cannot read cluster file {path}: {e.strerror}") from None
    except yaml.YAMLError as e:
        raise HamidError(f"{path}: not valid YAML: {e}") from None
    try:
        cluster = _Cluster.model_validate(data)
    except ValidationError as e:
        msgs = "; ".join(f"{'.'.join(map(str, x['loc']))}: {x['msg']}" for x in e.errors())
        raise HamidError(f"{path}: {msgs}; expected 'nodes: [{{name, gpus: MODEL[:COUNT],..., config}}]'") from None
    base = dict(cluster.config)
    name_keys = {k: base.pop(k) for k in list(base) if k in ResourceNameSettings.model_fields}
    try:
        rn = ResourceNameSettings.model_validate(name_keys)
    except ValidationError as e:
        msgs = "; ".join(f"{'.'.join(map(str, x['loc'])) or 'config'}={x.get('input')!r}: {x['msg']}"
                         for x in e.errors())
        raise ConfigError(f"{path}: config: {msgs}") from None
    res_names = ResourceNames.from_settings(rn)
    nodes = []
    names = set()
    for i, n in enumerate(cluster.nodes):
        where = f"{path}: nodes[{i}] ({n.name})"
        if n.name in names:
            raise HamidError(f"{path}: nodes[{i}].name {n.name!r} appears twice")
        names.add(n.name)
        settings = _settings(base, n.config, f"{where}.config")
        try:
            models = parse_simulate_spec(n.gpus)
            backend = SimulatedBackend(models, n.name, mig_enabled=settings.operatingMode == "mig",
                                       unhealthy=n.unhealthy)
        except DeviceError as e:
            raise HamidError(f"{where}: {e}") from None
        try:
            cordon = parse_device_cordon(n.annotations.get(ANN_DEVICE_CORDON))
        except RequestError as e:
            raise HamidError(f"{where}.annotations: {e}") from None
        caps = [restrict_mig_profiles(g, settings.migProfileAllowlist) for g in
                capacity_views(backend.gpus(), settings)]
        unknown = sorted(cordon - {g.uuid for g in caps})
        if unknown:
            raise HamidError(f"{where}.annotations: {ANN_DEVICE_CORDON} names {unknown[0]}, which is not a GPU "
                             f"of this node (its GPUs: {', '.join(g.uuid for g in caps)})")
        caps = [replace(g, cordoned=True) if g.uuid in cordon else g for g in caps]
        nodes.append(PlanNode(n.name, settings, caps, res_names))
    return nodes


def load_workload(path: str | Path) -> list[dict]:
    try:
        docs = [d for d in yaml.safe_load_all(Path(path).read_text()) if d is not None]
    except OSError as e:
        raise HamidError(f"cannot read workload file {path}: {e.strerror}") from None
    except yaml.YAMLError as e:
        raise HamidError(f"{path}: not valid YAML: {e}") from None
    for i, d in enumerate(docs):
        if not isinstance(d, dict) or d.get("kind") not in ("Pod", "Docker"):
            raise HamidError(f"{path}: document {i + 1} must be a mapping with kind Pod or Docker")
    return docs


def _defaults(node) -> Defaults:
    d = Defaults.from_settings(node.settings)
    names = getattr(node, "names", None)
    return replace(d, names=names) if names is not None else d


def gpu_doc(g: GpuView, score) -> dict:
    """One GPU's capacity and use as ``hamid plan -o json`` prints it."""
    d = {"uuid": g.uuid, "index": g.index, "model": g.name, "type": g.hami_type, "mode": g.mode, "numa": g.numa,
         "healthy": g.healthy, "cordoned": g.cordoned, "filtered": g.filtered, "memory_mib": g.mem_total,
         "memory_used_mib": g.mem_used, "cores": g.cores_total, "cores_used": g.cores_used,
         "split_count": g.shares_total, "shares_used": g.shares_used, "exclusive": g.exclusive, "dra": g.dra,
         "serves": list(g.serves) if g.mode != MODE_MIG else [], "share_mode": g.share_mode,
         "mps_shares": g.mps_used}
    if g.mode == MODE_MIG or g.mig_used:
        d["mig_profiles"] = {p.name: {"memory_mib": p.memory_mib, "max": p.max_instances, "slices": p.slices,
                                      "placements": [[pl.start, pl.size] for pl in p.placements]}
                             for p in g.mig_profiles}
        d["compute_slices"] = g.compute_slices
        d["mig_used"] = [{"profile": m.profile, "start": m.placement.start, "size": m.placement.size}
                         for m in g.mig_used]
    if g.links:
        d["links"] = {u: v for u, v in g.links}
    if isinstance(score, str):
        d["score"], d["unfit"] = None, score
    else:
        d["score"] = score
    return d


def _place(variants: dict, candidates: list, views: list, node_policy: str):
    """Place on the candidates. Each node parses the item with its own
    settings (defaultMemory, memoryFactor...), as its daemon would; when
    those differ, nodes are ranked once and tried one by one."""
    reqs = [variants[_defaults(n)] for n in candidates]
    if len(variants) == 1:
        return place(reqs[0], views, node_policy), reqs
    policy = reqs[0].node_policy or node_policy
    order = sorted(range(len(views)), key=lambda i: views[i].usage_score, reverse=(policy == "binpack"))
    reasons: dict[str, tuple[str, ...]] = {}
    for i in order:
        got = place(reqs[i], [views[i]], node_policy)
        if isinstance(got, Decision):
            return got, reqs
        reasons.update(got.reasons)
    return NoFit(reasons), reqs


def plan(nodes: list, workload: list[dict], source: str = "the cluster file") -> list[dict]:
    """Place each workload item in order; ``source`` names where ``nodes``
    came from in messages (the cluster file, or the live view)."""
    by_name = {n.name: n for n in nodes}
    node_policy = nodes[0].settings.nodeSchedulerPolicy if nodes else "binpack"
    out = []
    for i, doc in enumerate(workload):
        item: dict[str, Any] = {"item": i + 1, "kind": doc["kind"]}
        variants: dict = {}
        try:
            if doc["kind"] == "Pod":
                meta = doc["metadata"] if isinstance(doc.get("metadata"), dict) else {}
                # named before parsing, so a refused pod is named too (not "Pod ?")
                item["name"] = f"{meta.get('namespace') or 'default'}/{meta.get('name') or '(no name)'}"
                candidates = nodes
                for n in candidates:
                    d = _defaults(n)
                    if d not in variants:
                        variants[d] = parse_pod(doc, d)
                req = next(iter(variants.values()))
                item["name"] = req.owner.removeprefix("pod:")
                d0 = next(iter(variants))
                clamped = [clamp_message(k, j, n, asked, d0.names.cores) for k, j, n, asked in cores_clamped(doc, d0)]
                if clamped:  # placed as HAMi places it, but said: the webhook would say it too
                    item["warnings"] = clamped
            else:
                name = str(doc.get("name") or f"docker-{i + 1}")
                item["name"] = name
                target = doc.get("node")
                if target is not None and target not in by_name:
                    raise RequestError(f"node {target!r} is not in {source} (its nodes: {', '.join(by_name)})")
                candidates = [by_name[target]] if target else nodes
                env = doc.get("env") or {}
                if not isinstance(env, dict):
                    raise RequestError("env: expected a mapping of variable to value")
                for n in candidates:
                    d = _defaults(n)
                    if d not in variants:
                        variants[d] = parse_docker_env(env, name, d)
                if next(iter(variants.values())) is None:
                    raise RequestError("neither HAMI_VISIBLE_DEVICES nor HAMI_VGPU_SPEC is set")
        except RequestError as e:
            item["error"] = str(e)
            out.append(item)
            continue
        views = [n.view() for n in candidates]
        got, reqs = _place(variants, candidates, views, node_policy)
        if isinstance(got, NoFit):
            item["error"] = "does not fit"
            item["reasons"] = {k: list(v) for k, v in got.reasons.items()}
            if doc["kind"] != "Pod" and (note := whole_card_note(doc.get("env") or {})):
                item["note"] = note
        else:
            by_name[got.node].decisions.append(got)
            item.update(got.to_dict())
        item["nodes"] = {}
        for v, req in zip(views, reqs):
            scores = gpu_scores(req, v)
            item["nodes"][v.name] = {"score": round(v.usage_score, 4), "gpu_policy": req.gpu_policy or v.gpu_policy,
                                     "gpus": [gpu_doc(g, scores.get(g.uuid)) for g in v.gpus]}
        out.append(item)
    return out


def _score_lines(r: dict) -> list[str]:
    lines = []
    for node, nd in r.get("nodes", {}).items():
        cells = [f"GPU {g['index']} {g['score']:.2f}" if g["score"] is not None else f"GPU {g['index']} -"
                 for g in nd["gpus"]]
        lines.append(f"     scores on {node}: node score {nd['score']:.2f}; GPU scores under gpuSchedulerPolicy "
                     f"{nd['gpu_policy']}: " + ", ".join(cells))
    return lines


def render(results: list[dict], scores: bool = False) -> str:
    """The table; with ``scores``, each node's score and each GPU's score for
    the item (``-``: the GPU cannot take it; ``-o json`` says why)."""
    lines = []
    for r in results:
        head = f"{r['item']}. {r['kind']} {r.get('name', '?')}"
        warned = [f"     warning: {w}" for w in r.get("warnings", ())]
        if "error" in r:
            lines.append(f"{head}: {r['error']}")
            lines.extend(warned)
            for node, why in r.get("reasons", {}).items():
                for w in why:
                    lines.append(f"     {node}: {w}")
            if r.get("note"):
                lines.append(f"     {r['note']}")
            if scores:
                lines.extend(_score_lines(r))
            continue
        lines.append(f"{head} -> node {r['node']}")
        lines.extend(warned)
        for c in r["containers"]:
            if not c["devices"]:
                lines.append(f"     {c['name']}: no GPU")
            for d in c["devices"]:
                if d.get("mig_profile"):
                    pl = d["mig_placement"]
                    share = f"MIG {d['mig_profile']} at {pl['start']}:{pl['size']}"
                elif d.get("mps"):
                    share = f"MPS {d['mem_mib']} MiB pinned, {d['cores'] or 100}% threads"
                else:
                    share = f"hami-core {d['mem_mib']} MiB, {d['cores']}% cores"
                tag = " (init)" if c["init"] else ""
                lines.append(f"     {c['name']}{tag}: GPU {d['index']} {d['uuid']}  {share}")
        if scores:
            lines.extend(_score_lines(r))
    return "\n".join(lines)
