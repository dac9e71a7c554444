"""``hamid plan``: what-if placement from a cluster file and a workload file."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

EXAMPLES = Path(__file__).resolve().parents[1] / "docs" / "examples"
HAMID = [sys.executable, "-m", "hamid.cli.main"]


def plan(cluster, workload, *extra):
    return subprocess.run([*HAMID, "plan", "--cluster", str(cluster), "--workload", str(workload), *extra],
                          capture_output=True, text=True, timeout=60)


def test_example_plan_fits_in_order():
    r = plan(EXAMPLES / "cluster.yaml", EXAMPLES / "workload.yaml", "-o", "json")
    assert r.returncode == 0, r.stdout + r.stderr  # the README's first example runs green
    items = json.loads(r.stdout)
    trainer, notebook, inference, batch = items
    assert trainer["node"] == "gpu-a" and len(trainer["containers"][0]["devices"]) == 2
    assert all(d["mem_mib"] == 30000 and d["cores"] == 50 for d in trainer["containers"][0]["devices"])
    nb = notebook["containers"][0]["devices"][0]
    assert notebook["node"] == "gpu-b" and nb["mem_mib"] == 7680  # 50% of a T4
    inf = inference["containers"][0]["devices"][0]
    assert inference["node"] == "gpu-mig" and inf["mig_profile"] == "1g.20gb"
    b = batch["containers"][0]["devices"][0]
    # the 1g.20gb took slices 6-7; the 3g.40gb must go to 0-3 (4-7 overlaps)
    assert b["mig_profile"] == "3g.40gb" and b["mig_placement"] == {"start": 0, "size": 4}


def test_refusal_example_says_why_per_node_and_gpu():
    r = plan(EXAMPLES / "cluster.yaml", EXAMPLES / "workload-refused.yaml", "-o", "json")
    assert r.returncode == 1, r.stderr  # the second item does not fit
    small, too_big = json.loads(r.stdout)
    assert small["node"] == "gpu-a"
    assert too_big["error"] == "does not fit"
    assert "GPU 0 has 73367 MiB free, 102400 requested" in too_big["reasons"]["gpu-a"]
    assert any("no MIG profile holds 102400 MiB" in w for w in too_big["reasons"]["gpu-mig"])


def test_table_output_names_gpu_and_share():
    r = plan(EXAMPLES / "cluster.yaml", EXAMPLES / "workload.yaml")
    assert "1. Pod ml/trainer -> node gpu-a" in r.stdout
    assert "MIG 3g.40gb at 0:4" in r.stdout
    r = plan(EXAMPLES / "cluster.yaml", EXAMPLES / "workload-refused.yaml")
    assert "2. Docker too-big: does not fit" in r.stdout


def test_later_items_see_earlier_ones(tmp_path):
    cluster = tmp_path / "c.yaml"
    cluster.write_text("nodes: [{name: n, gpus: T4}]\n")
    work = tmp_path / "w.yaml"
    work.write_text("kind: Docker\nname: a\nenv: {HAMI_VGPU_SPEC: mem=10g}\n---\n"
                    "kind: Docker\nname: b\nenv: {HAMI_VGPU_SPEC: mem=10g}\n")
    items = json.loads(plan(cluster, work, "-o", "json").stdout)
    assert items[0]["node"] == "n"
    assert items[1]["reasons"]["n"][0] == "GPU 0 has 5120 MiB free, 10240 requested"


def test_bad_files_are_explained(tmp_path):
    cluster = tmp_path / "c.yaml"
    cluster.write_text("nodes: [{name: n, gpus: B200}]\n")
    work = tmp_path / "w.yaml"
    work.write_text("kind: Docker\nname: a\nenv: {HAMI_VGPU_SPEC: memory=1g}\n")
    r = plan(cluster, work)
    assert r.returncode == 1 and "unknown model 'B200'" in r.stderr
    cluster.write_text("nodes: [{name: n, gpus: T4, config: {deviceSplitCount: -2}}]\n")
    r = plan(cluster, work)
    assert "deviceSplitCount=-2" in r.stderr
    cluster.write_text("nodes: [{name: n, gpus: T4}]\n")
    r = plan(cluster, work, "-o", "json")
    assert "unknown key 'memory'" in json.loads(r.stdout)[0]["error"]
    work.write_text("kind: Deployment\n")
    assert "kind Pod or Docker" in plan(cluster, work).stderr


def test_mig_where_there_is_none_says_what_to_do(tmp_path):
    cluster = tmp_path / "c.yaml"
    cluster.write_text("nodes: [{name: n, gpus: 'H100-80GB-HBM3:1,T4:1'}]\n")  # operatingMode hami-core
    work = tmp_path / "w.yaml"
    work.write_text("kind: Docker\nname: a\nenv: {HAMI_VISIBLE_DEVICES: '0', HAMI_VGPU_SPEC: 1g.10gb}\n---\n"
                    "kind: Docker\nname: b\nenv: {HAMI_VISIBLE_DEVICES: '1', HAMI_VGPU_SPEC: 1g.10gb}\n")
    a, b = json.loads(plan(cluster, work, "-o", "json").stdout)
    (why_a,) = [w for w in a["reasons"]["n"] if w.startswith("GPU 0")]
    assert "not in MIG mode" in why_a and "nvidia-smi -i 0 -mig 1" in why_a and "operatingMode: mig" in why_a
    (why_b,) = [w for w in b["reasons"]["n"] if w.startswith("GPU 1")]
    assert why_b.startswith("GPU 1 (Tesla T4) has no MIG") and "mig 1" not in why_b


def test_cores_without_memory_is_explained_when_refused(tmp_path):
    cluster = tmp_path / "c.yaml"
    cluster.write_text("nodes: [{name: n, gpus: H100-80GB-HBM3}]\n")
    work = tmp_path / "w.yaml"
    work.write_text("kind: Docker\nname: a\nenv: {HAMI_VGPU_SPEC: mem=4g}\n---\n"
                    "kind: Docker\nname: b\nenv: {HAMI_VGPU_SPEC: cores=30}\n")
    a, b = json.loads(plan(cluster, work, "-o", "json").stdout)
    assert "81559 requested" in " ".join(b["reasons"]["n"])
    assert b["note"].startswith("note: HAMI_VGPU_SPEC='cores=30' asks no memory, so the container books each GPU's "
                                "whole memory") and "add mem=" in b["note"]
    assert "asks no memory" in plan(cluster, work).stdout
    work.write_text("kind: Docker\nname: a\nenv: {HAMI_VGPU_SPEC: mem=4g}\n---\n"
                    "kind: Docker\nname: b\nenv: {HAMI_VGPU_SPEC: 'mem=80000,cores=30'}\n")
    assert "note" not in json.loads(plan(cluster, work, "-o", "json").stdout)[1]  # it asked memory: no note


def test_a_refused_pod_is_named(tmp_path):
    cluster = tmp_path / "c.yaml"
    cluster.write_text("nodes: [{name: n, gpus: T4}]\n")
    work = tmp_path / "w.yaml"
    work.write_text("kind: Pod\nmetadata: {name: web, namespace: ml}\nspec: {containers: [{name: c, resources: "
                    "{limits: {nvidia.com/gpu: 1, nvidia.com/gpumem-percentage: 120}}}]}\n")
    r = plan(cluster, work)
    assert r.stdout.startswith("1. Pod ml/web: ") and "gpumem-percentage" in r.stdout, r.stdout
