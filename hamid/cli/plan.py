"""``hamid plan``: what-if placement over a cluster file and a workload file.

Cluster file (YAML)::

    config:                # optional: global node settings (same keys as the config file)
      deviceSplitCount: 4
    nodes:
      - name: node-a
        gpus: H100-80GB-HBM3:2,T4      # catalog models, as --simulate takes them
        config: {operatingMode: mig}   # optional per-node overrides

Workload file: multi-document YAML of Kubernetes Pods (``kind: Pod``) and
Docker entries::

    kind: Docker
    name: trainer
    node: node-a           # optional: a Docker container runs on one host
    env: {HAMI_VISIBLE_DEVICES: "0", HAMI_VGPU_SPEC: "mem=4g,cores=30"}

Items are placed in order; each sees the ones before it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from ..config import NodeSettings
from ..config.load import ConfigError
from ..node.capacity import capacity_views
from ..devices.simulated import SimulatedBackend, parse_simulate_spec
from ..devices.errors import DeviceError
from ..errors import HamidError
from ..placement import Decision, NodeView, place
from ..placement.result import NoFit
from ..placement.usage import with_usage
from ..request import Defaults, RequestError, parse_docker_env, parse_pod


class _Node(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str = Field(min_length=1)
    gpus: str
    config: dict[str, Any] = {}


class _Cluster(BaseModel):
    model_config = ConfigDict(extra="forbid")
    config: dict[str, Any] = {}
    nodes: list[_Node] = Field(min_length=1)


class PlanNode:
    def __init__(self, name: str, settings: NodeSettings, capacity) -> None:
        self.name = name
        self.settings = settings
        self.capacity = capacity
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
    nodes = []
    names = set()
    for i, n in enumerate(cluster.nodes):
        if n.name in names:
            raise HamidError(f"{path}: nodes[{i}].name {n.name!r} appears twice")
        names.add(n.name)
        settings = _settings(cluster.config, n.config, f"{path}: nodes[{i}] ({n.name}).config")
        try:
            models = parse_simulate_spec(n.gpus)
        except DeviceError as e:
            raise HamidError(f"{path}: nodes[{i}] ({n.name}).gpus: {e}") from None
        backend = SimulatedBackend(models, n.name, mig_enabled=settings.operatingMode == "mig")
        nodes.append(PlanNode(n.name, settings, capacity_views(backend.gpus(), settings)))
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


def plan(nodes: list[PlanNode], workload: list[dict]) -> list[dict]:
    by_name = {n.name: n for n in nodes}
    node_policy = nodes[0].settings.nodeSchedulerPolicy if nodes else "binpack"
    out = []
    for i, doc in enumerate(workload):
        item: dict[str, Any] = {"item": i + 1, "kind": doc["kind"]}
        try:
            if doc["kind"] == "Pod":
                defaults = Defaults.from_settings(nodes[0].settings)
                req = parse_pod(doc, defaults)
                item["name"] = req.owner.removeprefix("pod:")
                candidates = nodes
            else:
                name = str(doc.get("name") or f"docker-{i + 1}")
                item["name"] = name
                target = doc.get("node")
                if target is not None and target not in by_name:
                    raise RequestError(f"node {target!r} is not in the cluster file")
                candidates = [by_name[target]] if target else nodes
                env = doc.get("env") or {}
                if not isinstance(env, dict):
                    raise RequestError("env: expected a mapping of variable to value")
                req = parse_docker_env(env, name, Defaults.from_settings(candidates[0].settings))
                if req is None:
                    raise RequestError("neither HAMI_VISIBLE_DEVICES nor HAMI_VGPU_SPEC is set")
        except RequestError as e:
            item["error"] = str(e)
            out.append(item)
            continue
        got = place(req, [n.view() for n in candidates], node_policy)
        if isinstance(got, NoFit):
            item["error"] = "does not fit"
            item["reasons"] = {k: list(v) for k, v in got.reasons.items()}
        else:
            by_name[got.node].decisions.append(got)
            item.update(got.to_dict())
        out.append(item)
    return out


def render(results: list[dict]) -> str:
    lines = []
    for r in results:
        head = f"{r['item']}. {r['kind']} {r.get('name', '?')}"
        if "error" in r:
            lines.append(f"{head}: {r['error']}")
            for node, why in r.get("reasons", {}).items():
                for w in why:
                    lines.append(f"     {node}: {w}")
            continue
        lines.append(f"{head} -> node {r['node']}")
        for c in r["containers"]:
            if not c["devices"]:
                lines.append(f"     {c['name']}: no GPU")
            for d in c["devices"]:
                if d.get("mig_profile"):
                    pl = d["mig_placement"]
                    share = f"MIG {d['mig_profile']} at {pl['start']}:{pl['size']}"
                else:
                    share = f"{d['mem_mib']} MiB, {d['cores']}% cores"
                tag = " (init)" if c["init"] else ""
                lines.append(f"     {c['name']}{tag}: GPU {d['index']} {d['uuid']}  {share}")
    return "\n".join(lines)
