"""The Grafana dashboard the chart ships (charts/hamid/dashboards/hamid.json),
checked against the daemons it watches.

Owns two checks:

- the model: a Grafana dashboard (title, uid, a current ``schemaVersion``),
  the ``datasource`` variable of type prometheus and the ``node``, ``gpu`` and
  ``namespace`` variables from ``label_values``, panels on the 24-column grid
  without overlaps, and every query (panels and variables) going through the
  ``datasource`` variable and parsing as PromQL;
- the metrics: every metric a panel or a variable queries, and every label it
  filters, groups or prints a legend by, is one that REAL ``hamid run``
  daemons export, with samples. Two daemons run as a cluster
  (:class:`clusterenv.ClusterEnv`: gossip, peer API, webhook and leader in
  gate mode, kubelet stand-ins, the API-server stand-in) with their metrics
  port on; a GPU pod is placed by the leader, bound, admitted by its node's
  kubelet stand-in and started, and its container's process runs the daemon's
  own shim under the container's mounts (a mount namespace binds the
  container's region directory at ``/run/hamid`` and its limits file at
  ``/usr/local/vgpu/hamid.limits``, as the runtime does; the fake CUDA driver
  of tests/shim stands in for the GPU), so the per-container series come from
  a real region written through the real header; the other node is in MIG
  mode and holds a MIG instance; an untrusted region file is refused once.

PromQL is parsed with ``promql-parser`` (the Rust parser's Python bindings),
after Grafana's variables are interpolated as Grafana would.
"""

from __future__ import annotations

import copy
import difflib
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

ROOT = Path(__file__).resolve().parents[2]
DASHBOARD = ROOT / "charts" / "hamid" / "dashboards" / "hamid.json"
DS_REF = {"type": "prometheus", "uid": "${datasource}"}
# labels Prometheus adds to every series it scrapes (the target's), which the daemon never exports itself
SCRAPE_LABELS = frozenset({"instance", "job"})
# Grafana's built-in interval variables, interpolated as durations; every other variable becomes a plain value
BUILTIN_DURATIONS = {"__rate_interval": "5m", "__interval": "1m", "__range": "1h", "__range_s": "3600",
                     "__interval_ms": "60000", "__range_ms": "3600000"}
VARIABLE = re.compile(r"\$\{(\w+)(?::[^}]*)?\}|\$(\w+)|\[\[(\w+)(?::[^\]]*)?\]\]")
LEGEND_LABEL = re.compile(r"\{\{\s*([A-Za-z_][A-Za-z0-9_]*)\s*\}\}")
LABEL_VALUES = re.compile(r"^\s*label_values\((?:(.*),\s*)?([A-Za-z_][A-Za-z0-9_]*)\s*\)\s*$", re.S)
PANEL_TYPES = {"row", "timeseries", "stat", "bargauge", "table", "gauge", "text", "piechart", "state-timeline"}


def load() -> dict:
    return json.loads(DASHBOARD.read_text())


# --- the dashboard's queries ----------------------------------------------------------------


def variables_in(text: str) -> set[str]:
    return {m.group(1) or m.group(2) or m.group(3) for m in VARIABLE.finditer(text)}


def interpolate(expr: str) -> str:
    """What Grafana sends to Prometheus, with a placeholder value for each variable."""
    def sub(m: re.Match) -> str:
        name = m.group(1) or m.group(2) or m.group(3)
        return BUILTIN_DURATIONS.get(name, "x")

    return VARIABLE.sub(sub, expr)


def analyse(expr: str) -> tuple[list[tuple[str, frozenset[str]]], list[tuple[frozenset[str], frozenset[str]]]]:
    """(selectors, groupings) of a PromQL expression: each vector selector as (metric name, label names its
    matchers use), and each label list of a ``by``/``without``/``on``/``ignoring``/``group_*`` clause as
    (labels, the metrics under it). A selector without a metric name is an error: a dashboard must name its
    metrics for this test to hold it to them."""
    import promql_parser as pq

    tree = pq.parse(interpolate(expr))
    selectors: list[tuple[str, frozenset[str]]] = []
    groupings: list[tuple[frozenset[str], frozenset[str]]] = []

    def metrics_under(node) -> frozenset[str]:
        found: set[str] = set()

        def visit(n):
            if isinstance(n, pq.VectorSelector):
                found.add(selector_name(n))
        pq.walk(node, visit)
        return frozenset(found)

    def selector_name(n) -> str:
        if n.name:
            return n.name
        for m in n.matchers.matchers:
            if m.name == "__name__" and m.op == pq.MatchOp.Equal:
                return m.value
        raise ValueError(f"{expr!r}: a selector without a metric name ({n}); name the metric")

    def visit(n):
        if isinstance(n, pq.VectorSelector):
            labels = frozenset(m.name for m in n.matchers.matchers if m.name != "__name__")
            selectors.append((selector_name(n), labels))
        elif isinstance(n, pq.AggregateExpr) and n.modifier is not None and n.modifier.labels:
            groupings.append((frozenset(n.modifier.labels), metrics_under(n.expr)))
        elif isinstance(n, pq.BinaryExpr) and n.modifier is not None:
            scope = metrics_under(n.lhs) | metrics_under(n.rhs)
            if n.modifier.matching is not None and n.modifier.matching.labels:
                groupings.append((frozenset(n.modifier.matching.labels), scope))
            if n.modifier.group_labels:
                groupings.append((frozenset(n.modifier.group_labels), scope))
    pq.walk(tree, visit)
    return selectors, groupings


def panels_of(dash: dict) -> list[dict]:
    """Every panel, those inside collapsed rows included."""
    out = []
    for p in dash["panels"]:
        out.append(p)
        out.extend(p.get("panels") or [])
    return out


def queries(dash: dict) -> list[tuple[str, str, str]]:
    """(where, PromQL, legend) of every panel target and every query variable (``label_values(sel, label)`` is
    turned into ``sel`` with ``label`` as its legend, so the label is checked like a legend's)."""
    out = []
    for p in panels_of(dash):
        for t in p.get("targets") or []:
            out.append((f"panel {p.get('title')!r} target {t.get('refId')}", t.get("expr", ""),
                        t.get("legendFormat") or ""))
    for v in dash.get("templating", {}).get("list", []):
        if v.get("type") != "query":
            continue
        q = v["query"]["query"] if isinstance(v.get("query"), dict) else v.get("query", "")
        m = LABEL_VALUES.match(q)
        if not m or not m.group(1):
            raise AssertionError(f"variable {v['name']}: {q!r} is not label_values(<selector>, <label>)")
        out.append((f"variable {v['name']}", m.group(1), "{{" + m.group(2) + "}}"))
    return out


def problems(dash: dict, exported: dict[str, set[str]], declared: set[str]) -> list[str]:
    """What in the dashboard no scraped daemon backs: a metric that is not exported (``declared``: the names the
    ``# TYPE`` lines give; ``exported``: metric name -> label names of its samples), a metric exported without a
    single sample, a label a matcher, a grouping or a legend uses that the metrics it applies to do not carry."""
    out = []
    for where, expr, legend in queries(dash):
        selectors, groupings = analyse(expr)
        for metric, labels in selectors:
            if metric not in exported:
                near = difflib.get_close_matches(metric, sorted(declared), n=3)
                why = "declared by a # TYPE line but without a sample" if metric in declared else "not exported"
                out.append(f"{where}: {metric} is {why} (close names: {near})")
                continue
            for label in sorted(labels - exported[metric] - SCRAPE_LABELS):
                out.append(f"{where}: {metric} has no label {label!r} (its labels: {sorted(exported[metric])})")
        scope_all = frozenset(m for m, _ in selectors)
        for labels, scope in groupings + [(frozenset(LEGEND_LABEL.findall(legend)), scope_all)]:
            carried = set().union(*(exported.get(m, set()) for m in scope)) | SCRAPE_LABELS
            for label in sorted(labels - carried):
                out.append(f"{where}: label {label!r} is on none of {sorted(scope)}")
    return out


# --- what the daemons export ----------------------------------------------------------------

_SUFFIXES = {"counter": ("_total", "_created"), "histogram": ("_bucket", "_sum", "_count", "_created"),
             "gaugehistogram": ("_bucket", "_gsum", "_gcount"), "summary": ("", "_sum", "_count", "_created"),
             "info": ("_info",)}


def declared_names(text: str) -> set[str]:
    """Sample names the ``# TYPE`` lines announce, with the suffixes the exposition format gives each type
    (a counter ``x``, written ``x_total`` or ``x``, is queried as ``x_total``)."""
    out = set()
    for line in text.splitlines():
        parts = line.split()
        if len(parts) != 4 or parts[:2] != ["#", "TYPE"]:
            continue
        name, kind = parts[2], parts[3]
        out.add(name)
        base = name[: -len("_total")] if kind == "counter" and name.endswith("_total") else name
        out.update(base + s for s in _SUFFIXES.get(kind, ()))
    return out


def sampled(text: str) -> dict[str, set[str]]:
    """Sample name -> the label names its samples carry (prometheus_client's own parser)."""
    from prometheus_client.parser import text_string_to_metric_families

    out: dict[str, set[str]] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out.setdefault(s.name, set()).update(s.labels)
    return out


# --- the model ------------------------------------------------------------------------------


def test_the_dashboard_is_a_grafana_dashboard_model():
    dash = load()
    assert isinstance(dash.get("title"), str) and dash["title"]
    assert re.fullmatch(r"[A-Za-z0-9_-]{1,40}", dash.get("uid", "")), dash.get("uid")
    assert isinstance(dash.get("schemaVersion"), int) and dash["schemaVersion"] >= 39, dash.get("schemaVersion")
    variables = {v["name"]: v for v in dash["templating"]["list"]}
    ds = variables["datasource"]
    assert (ds["type"], ds["query"]) == ("datasource", "prometheus")
    for name in ("node", "gpu", "namespace"):
        v = variables[name]
        assert v["type"] == "query" and v["datasource"] == DS_REF, v
        assert LABEL_VALUES.match(v["definition"]), v["definition"]
    known = set(variables) | {"__rate_interval", "__interval", "__range"}

    ids = set()
    boxes = []
    for p in panels_of(dash):
        where = f"panel {p.get('id')} {p.get('title')!r}"
        assert isinstance(p.get("id"), int) and p["id"] not in ids, where
        ids.add(p["id"])
        assert p.get("type") in PANEL_TYPES, (where, p.get("type"))
        assert isinstance(p.get("title"), str) and p["title"], where
        g = p.get("gridPos") or {}
        assert all(isinstance(g.get(k), int) for k in ("h", "w", "x", "y")), (where, g)
        assert g["w"] > 0 and g["h"] > 0 and g["x"] >= 0 and g["y"] >= 0 and g["x"] + g["w"] <= 24, (where, g)
        boxes.append((where, g))
        if p["type"] == "row":
            continue
        assert p.get("datasource") == DS_REF, where
        targets = p.get("targets") or []
        assert targets, f"{where}: no query"
        refs = [t.get("refId") for t in targets]
        assert len(set(refs)) == len(refs) and all(refs), (where, refs)
        for t in targets:
            assert t.get("datasource") == DS_REF, (where, t.get("refId"), t.get("datasource"))
            assert t.get("expr"), (where, t.get("refId"))
            assert variables_in(t["expr"]) <= known, (where, variables_in(t["expr"]) - known)
    for i, (a, ga) in enumerate(boxes):
        for b, gb in boxes[i + 1:]:
            apart = (ga["x"] + ga["w"] <= gb["x"] or gb["x"] + gb["w"] <= ga["x"]
                     or ga["y"] + ga["h"] <= gb["y"] or gb["y"] + gb["h"] <= ga["y"])
            assert apart, f"{a} and {b} overlap: {ga} {gb}"
    for where, expr, _ in queries(dash):  # every query parses as PromQL, with a named metric in each selector
        try:
            selectors, _ = analyse(expr)
        except ValueError as e:
            raise AssertionError(f"{where}: {e}") from None
        assert selectors, f"{where}: {expr!r} selects no metric"


def test_the_dashboard_covers_what_the_issue_asks():
    """The rows and the metrics each must show (names as the exposition gives them)."""
    dash = load()
    rows = [p["title"] for p in dash["panels"] if p["type"] == "row"]
    assert len(rows) == 4, rows
    used = {m for _, expr, _ in queries(dash) for m, _ in analyse(expr)[0]}
    for metric in ("hami_gpu_memory_allocated_bytes", "hami_gpu_memory_limit_bytes", "hami_gpu_core_allocated_ratio",
                   "hami_gpu_core_limit_ratio", "hami_gpu_shared_count", "hami_node_gpu_mig_instance_info",
                   "hami_vgpu_memory_used_bytes", "hami_vgpu_memory_limit_bytes", "hamid_vgpu_gpu_time_seconds_total",
                   "hamid_vgpu_core_limit_ratio", "hamid_vgpu_oom_refusals_total", "hamid_vgpu_throttle_seconds_total",
                   "hamid_gossip_members", "hamid_gossip_health_score", "hamid_gossip_probes_total",
                   "hamid_gossip_suspicions_total", "hamid_gossip_deaths_total", "hamid_gossip_dropped_frames_total",
                   "hamid_leader", "hamid_pods_placed_total", "hamid_webhook_reviews_total",
                   "hamid_peer_requests_total", "hamid_ledger_commits_total"):
        assert metric in used, metric


# --- against real daemons -------------------------------------------------------------------

# the container's mounts, as the runtime makes them, in a mount namespace of its own
_CONTAINER_MOUNTS = (
    'set -e; mount -t tmpfs -o mode=755 tmpfs /run; mkdir /run/hamid; mount --bind "$HAMID_TEST_REGION" /run/hamid; '
    'mount -t tmpfs -o mode=755 tmpfs /usr/local; mkdir /usr/local/vgpu; : > /usr/local/vgpu/hamid.limits; '
    'mount --bind -o ro "$HAMID_TEST_LIMITS" /usr/local/vgpu/hamid.limits; '
    'unset HAMID_TEST_REGION HAMID_TEST_LIMITS; exec "$@"')


def _run_in_container(cfg, shimtest: Path, fake_state: Path, *commands: str) -> subprocess.Popen:
    """Start shimtest as the container's process would run: the container's env, the shim the daemon installed
    preloaded, its region directory and read-only limits file where the container sees them."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CUDA_", "HAMID_", "LIBCUDA_", "FAKE_"))}
    env.update(cfg.env)
    env.update(HAMID_TEST_REGION=cfg.mount("/run/hamid").host_path,
               HAMID_TEST_LIMITS=cfg.mount("/usr/local/vgpu/hamid.limits").host_path,
               LD_PRELOAD=cfg.mount("/usr/local/vgpu/libvgpu.so").host_path,  # what /etc/ld.so.preload names
               FAKE_GPU_STATE=str(fake_state), FAKE_GPU_COUNT="1")
    return subprocess.Popen(["unshare", "--mount", "--propagation", "private", "sh", "-c", _CONTAINER_MOUNTS, "sh",
                             str(shimtest), "direct", *commands],
                            env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _wait_ungated(api, ns: str, name: str, timeout: float = 30.0) -> dict:
    deadline = time.time() + timeout
    while time.time() < deadline:
        pod = api.get("Pod", ns, name)
        if not pod["spec"].get("schedulingGates"):
            return pod
        time.sleep(0.05)
    raise AssertionError(f"{ns}/{name} not placed in {timeout} s: {api.get('Pod', ns, name).get('status')}")


def _placed_node(pod: dict) -> str:
    terms = pod["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
        "nodeSelectorTerms"]
    (node,) = {v for t in terms for f in t.get("matchFields") or () if f["key"] == "metadata.name"
               for v in f["values"]}
    return node


@pytest.mark.slow
@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("unshare"),
                    reason="needs root and unshare: the container's process runs in a mount namespace of its own")
@pytest.mark.skipif(not shutil.which("gcc") or not shutil.which("make"),
                    reason="needs gcc and make (the shim and the fake CUDA driver are built)")
def test_every_metric_the_dashboard_queries_is_one_the_daemons_export(tmp_path, tmp_path_factory, api_server):
    sys.path.insert(0, str(ROOT / "tests" / "shim"))
    from clusterenv import ClusterEnv, free_port
    from shimharness import build_all, finish, wait_ready

    built = build_all(tmp_path_factory)
    env = ClusterEnv(tmp_path / "c", api_server, nodes=2, split=10)
    ports = []
    for n in env.nodes:  # the harness turns metrics off; a DaemonSet serves them (the chart's port 9394)
        ports.append(free_port())
        n.config.write_text(n.config.read_text().replace(
            "metricsPort: 0\n", f"metricsPort: {ports[-1]}\nmetricsAddress: 127.0.0.1\n"))
    mig = env.nodes[1]
    mig.config.write_text(mig.config.read_text().replace("operatingMode: hami-core", "operatingMode: mig")
                          + "legacyMetrics: true\n")  # HAMi's pre-2.9 names too, checked below
    mig.split = 7  # kubelet sees a MIG-mode H100 as its 7 possible instances
    proc = None
    env.start()
    try:
        env.leader()
        api = env.api
        api.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "ml"}})
        # a GPU pod through the webhook: gated, placed by the leader, committed through the peer API
        api.create({"apiVersion": "v1", "kind": "Pod",
                    "metadata": {"name": "train", "namespace": "ml",
                                 "annotations": {"nvidia.com/vgpu-mode": "hami-core"}},
                    "spec": {"containers": [{"name": "main", "image": "busybox", "resources": {
                        "limits": {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "4000", "nvidia.com/gpucores": "30"},
                        "requests": {"cpu": "100m"}}}]}})
        node_name = _placed_node(_wait_ungated(api, "ml", "train"))
        node = next(n for n in env.nodes if n.node == node_name)
        api.do_bind("ml", "train", {"target": {"kind": "Node", "name": node_name}})
        pod = api.get("Pod", "ml", "train")
        got = node.kubelet.admit(pod)
        assert got.admitted, got.message
        cfg = node.kubelet.start_container(pod, "main")
        # the container allocates 1 GiB, is refused 8 GiB (its limit is 4000 MiB), and launches 500 us kernels
        # for 0.5 s under its 30 % (hundreds of launches: the shim stamps the region's last launch every 64)
        proc = _run_in_container(cfg, built.shimtest, tmp_path / "fake_gpu.state",
                                 "init", "alloc:mem:1g", "alloc:mem:8g", "run:0.5:500", "wait")
        lines = wait_ready(proc)
        assert "alloc mem 1g 0" in lines and "alloc mem 8g 0" not in lines, lines
        # an untrusted file in a container's region directory: refused and counted
        bad = node.state / "containers" / "untrusted"
        bad.mkdir(parents=True)
        (bad / "x.cache").symlink_to("/etc/hostname")
        # a MIG instance on the MIG node (a Docker container's, through the local API)
        from hamid.localapi.client import LocalClient

        with LocalClient(mig.state) as c:
            c.call("POST", "/v1/containers", {"id": "d0c0" * 16, "env": ["HAMI_VISIBLE_DEVICES=0",
                                                                         "HAMI_VGPU_SPEC=1g.10gb"]})
        texts = [httpx.get(f"http://127.0.0.1:{p}/metrics", timeout=15).text for p in ports]
    finally:
        if proc is not None:
            finish(proc)
        env.stop()

    # every HAMi series as HAMi writes it (tests/hamifacts.py), on both daemons, the region's too
    sys.path.insert(0, str(ROOT / "tests"))
    import hamifacts as hf

    # (hami_container_device_utilization_ratio needs two scrapes: checked in tests/shim/test_shimregion.py)
    region = ("hami_vgpu_memory_used_bytes", "hami_vgpu_memory_limit_bytes", "hami_container_device_memory_bytes",
              "hami_vgpu_memory_context_bytes", "hami_vgpu_memory_module_bytes", "hami_vgpu_memory_buffer_bytes",
              "hami_container_last_kernel_elapsed_seconds")
    host = ("hami_host_gpu_memory_used_bytes", "hami_host_gpu_utilization_ratio",
            "hami_host_gpu_memory_controller_utilization_ratio")
    for n, text in zip(env.nodes, texts):
        s = hf.parse(text)
        expect = ("hami_gpu_memory_limit_bytes", "hami_vgpu_memory_allocated_bytes", *host)
        expect += region if n is node else ()
        expect += ("hami_node_gpu_mig_instance_info", "hami_mig_device_info") if n is mig else ()
        found = hf.problems(s, legacy=n is mig, expect=expect)
        assert not found, f"{n.node}: " + "\n".join(found)
        if n is node:
            train = dict(namespace="ml", pod="train", container="main")
            assert hf.one(s, "hami_vgpu_memory_limit_bytes", **train) == 4000 << 20
            assert hf.one(s, "hami_vgpu_memory_used_bytes", **train) >= 1 << 30
            assert hf.one(s, "hami_vgpu_core_allocated_ratio", namespace="ml", pod="train") == 30

    declared: set[str] = set()
    exported: dict[str, set[str]] = {}
    for text in texts:
        declared |= declared_names(text)
        for name, labels in sampled(text).items():
            exported.setdefault(name, set()).update(labels)
    assert set(exported) <= declared, set(exported) - declared  # the TYPE lines account for every sample
    dash = load()
    found = problems(dash, exported, declared)
    assert not found, "\n".join(found)

    # the check itself: a panel that names what no daemon exports fails it, and says what and where
    broken = copy.deepcopy(dash)
    panel = next(p for p in broken["panels"] if p["type"] == "timeseries")
    panel["targets"] += [
        {"refId": "X", "datasource": DS_REF, "expr": 'hami_gpu_memory_used_bytes{node=~"$node"}'},
        {"refId": "Y", "datasource": DS_REF, "expr": "rate(hamid_pods_placed[$__rate_interval])"},
        {"refId": "Z", "datasource": DS_REF, "expr": "sum by (pod) (hami_gpu_shared_count{gpu=\"0\"})",
         "legendFormat": "{{uuid}}"},
    ]
    found = "\n".join(problems(broken, exported, declared))
    assert "target X: hami_gpu_memory_used_bytes is not exported" in found, found
    assert "target Y: hamid_pods_placed is not exported" in found and "hamid_pods_placed_total" in found, found
    assert "target Z: hami_gpu_shared_count has no label 'gpu'" in found, found
    assert "target Z: label 'pod' is on none of ['hami_gpu_shared_count']" in found, found
    assert "target Z: label 'uuid' is on none of" in found, found
