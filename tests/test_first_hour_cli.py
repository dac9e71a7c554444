"""What a new user of the CLI tripped over (issue 40 item 9), each fixed."""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
import trio
import yaml
from structlog.testing import capture_logs

from hamid.cli.main import main
from hamid.errors import HamidError
from hamid.ledger import Details
from hamid.request import RequestError, parse_docker_env
from hamid.request.model import Defaults
from nodeharness import make_node

import hamid

REPO = Path(__file__).resolve().parents[1]
PACKAGE_ROOT = str(Path(hamid.__file__).resolve().parents[1])  # the hamid these tests import, for subprocesses
HAMID = [sys.executable, "-m", "hamid.cli.main"]


def test_space_separated_spec_items_are_told_to_use_commas():
    with pytest.raises(RequestError, match="separate items with commas") as e:
        parse_docker_env({"HAMI_VGPU_SPEC": "mem=4g cores=30"}, "c")
    assert "mem=4g,cores=30" in str(e.value) and "bad size" not in str(e.value)


def test_a_non_root_user_is_told_about_permissions_not_a_missing_socket():
    state = Path(tempfile.mkdtemp(prefix="hamid-perm-"))
    try:
        os.chmod(state, 0o700)
        srv = socket.socket(socket.AF_UNIX)
        srv.bind(str(state / "hamid.sock"))
        r = subprocess.run(["setpriv", "--reuid", "65534", "--regid", "65534", "--clear-groups",
                            *HAMID, "status", "--cluster", "--state-dir", str(state)],
                           capture_output=True, text=True, timeout=60, cwd="/", env={**os.environ,
                                                                                   "PYTHONPATH": PACKAGE_ROOT})
        srv.close()
    finally:
        subprocess.run(["rm", "-rf", str(state)], check=True)
    assert r.returncode == 1, r.stderr
    assert "Permission denied" in r.stderr and "run it as root" in r.stderr, r.stderr
    assert "no daemon socket" not in r.stderr


def test_version_shows_the_shim_version_and_the_commit(capsys):
    assert main(["version"]) == 0
    out = capsys.readouterr().out
    shim = (REPO / "shim" / "VERSION").read_text().strip()
    assert f"shim {shim}" in out
    rev = subprocess.run(["git", "-C", str(REPO), "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    assert rev and rev in out


def test_hami_build_info_has_a_revision_and_a_build_date(tmp_path):
    from hamid.metrics.exporter import LedgerCollector

    d = make_node(tmp_path / "s", simulate="T4", regionTmpfs=False)
    try:
        fams = {m.name: m for m in LedgerCollector(d.ledger, lambda: "test").collect()}
    finally:
        d.close()
    (sample,) = fams["hami_build"].samples if "hami_build" in fams else fams["hami_build_info"].samples
    rev = subprocess.run(["git", "-C", str(REPO), "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    assert sample.labels["revision"].startswith(rev), sample.labels
    assert re.match(r"\d{4}-\d\d-\d\dT", sample.labels["build_date"]), sample.labels


def test_the_admitted_log_line_names_the_container_its_gpus_and_spec(tmp_path):
    d = make_node(tmp_path / "s", simulate="H100:2", regionTmpfs=False)
    env = ["HAMI_VISIBLE_DEVICES=1", "HAMI_VGPU_SPEC=mem=4g,cores=30", "PATH=/bin"]

    async def admit():
        return await trio.to_thread.run_sync(lambda: d.service.admit_container_blocking(
            "e" * 64, env, user=(0, 0), details=Details(container_id="e" * 64, display_name="trainer"),
            defaults=Defaults()))

    try:
        with capture_logs() as logs:
            trio.run(admit)
    finally:
        d.close()
    (line,) = [e for e in logs if e["event"] == "container admitted"]
    assert line["name"] == "trainer" and line["gpus"] == ["1 4096 MiB 30%"]
    assert line["spec"] == {"HAMI_VISIBLE_DEVICES": "1", "HAMI_VGPU_SPEC": "mem=4g,cores=30"}


def test_the_mode_switch_refusal_names_the_container(tmp_path):
    d = make_node(tmp_path / "s", simulate="H100:1", regionTmpfs=False)
    try:
        d.core.admit_container("f" * 64, ["HAMI_VGPU_SPEC=mem=4g"], user=(0, 0),
                               details=Details(container_id="f" * 64, display_name="notebook"), defaults=Defaults())
    finally:
        d.close()
    with pytest.raises(HamidError, match=r"held by notebook \(docker:f{64}\)"):
        make_node(tmp_path / "s", simulate="H100:1", mode="mig", regionTmpfs=False)


def test_visible_devices_and_memory_limits_follow_the_containers_device_order(tmp_path):
    d = make_node(tmp_path / "s", simulate="H100:3", regionTmpfs=False)
    try:
        d.core.admit_container("a" * 64, ["HAMI_VISIBLE_DEVICES=0", "HAMI_VGPU_SPEC=mem=40g"], user=(0, 0),
                               details=Details(container_id="a" * 64), defaults=Defaults())
        got = d.core.admit_container("b" * 64, ["HAMI_VISIBLE_DEVICES=0,2", "HAMI_VGPU_SPEC=mem=10g"], user=(0, 0),
                                     details=Details(container_id="b" * 64), defaults=Defaults())
        uuids = {g.index: g.uuid for g in d.core.ledger.view().gpus}
    finally:
        d.close()
    placed = [x.index for x in got.reservation.decision.containers[0].devices]
    assert placed == [2, 0]  # placement put the emptier GPU first: the case that went wrong
    env = dict(e.split("=", 1) for e in got.to_dict()["edits"]["main"]["env"])
    assert env["NVIDIA_VISIBLE_DEVICES"] == f"{uuids[0]},{uuids[2]}"  # as CUDA numbers them in the container


def _plan(tmp_path, workload: list[dict], *extra: str) -> subprocess.CompletedProcess:
    (tmp_path / "cluster.yaml").write_text(yaml.safe_dump({"nodes": [{"name": "n1", "gpus": "H100:2"}]}))
    (tmp_path / "workload.yaml").write_text(yaml.safe_dump_all(workload))
    return subprocess.run([*HAMID, "plan", "--cluster", str(tmp_path / "cluster.yaml"), "--workload",
                           str(tmp_path / "workload.yaml"), *extra], capture_output=True, text=True, timeout=60)


POD_120 = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "greedy", "namespace": "ml"},
           "spec": {"containers": [{"name": "main", "resources": {"limits": {
               "nvidia.com/gpu": 1, "nvidia.com/gpumem": 4000, "nvidia.com/gpucores": 120}}}]}}


def test_plan_warns_when_gpucores_over_100_is_taken_as_100(tmp_path):
    r = _plan(tmp_path, [POD_120])
    assert r.returncode == 0, r.stderr
    assert "warning:" in r.stdout and "120 is more than a whole GPU; taken as 100" in r.stdout, r.stdout
    j = _plan(tmp_path, [POD_120], "-o", "json")
    assert "taken as 100" in json.loads(j.stdout)[0]["warnings"][0]


def test_plan_scores_say_which_score_is_which(tmp_path):
    r = _plan(tmp_path, [{"kind": "Docker", "name": "t", "env": {"HAMI_VGPU_SPEC": "mem=4g"}}], "--scores")
    line = next(ln for ln in r.stdout.splitlines() if "scores" in ln)
    assert "node score" in line and "GPU scores under gpuSchedulerPolicy spread" in line, line


def test_plan_help_describes_the_workload_format():
    r = subprocess.run([*HAMID, "plan", "--help"], capture_output=True, text=True, timeout=60)
    assert "kind: Docker" in r.stdout and "kind: Pod" in r.stdout and "HAMI_VGPU_SPEC" in r.stdout


def test_every_source_file_the_readme_names_exists():
    text = (REPO / "README.md").read_text()
    named = set(re.findall(r"`(hamid/[\w/]+\.py)`", text))
    assert named and not [p for p in named if not (REPO / p).exists()], named
