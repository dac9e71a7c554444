"""``hamid config from-hami``: HAMi's chart values and device config become hamid's, key by key."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import yaml

from hamid.config import load_config
from hamid.config.fromhami import translate
from hamid.errors import HamidError

HAMID = [sys.executable, "-m", "hamid.cli.main"]

# HAMi's chart values as an operator changed them (HAMi's key names, charts/hami/values.yaml)
VALUES = {
    "global": {"gpuHookPath": "/usr/local", "imageTag": "v2.10.0"},
    "resourceName": "example.com/vgpu", "resourceMem": "nvidia.com/gpumem",
    "mluResourceName": "cambricon.com/vmlu",
    "schedulerName": "my-hami",
    "scheduler": {"defaultSchedulerPolicy": {"nodeSchedulerPolicy": "spread", "gpuSchedulerPolicy": "spread"},
                  "nodeLockExpire": "5m", "leaderElect": True,
                  "admissionWebhook": {"failurePolicy": "Fail"}},
    "devicePlugin": {"deviceSplitCount": 4, "deviceMemoryScaling": 1.5, "migStrategy": "none",
                     "nvidiaNodeSelector": {"gpu": "on"}, "tolerations": [],
                     "nodeConfiguration": {"config": json.dumps({"nodeconfig": [
                         {"name": "your-node-name", "operatingmode": "hami-core"},
                         {"name": "gpu-7", "operatingmode": "mig", "devicesplitcount": 7, "migstrategy": "none",
                          "filterdevices": {"uuid": [], "index": [3]}}]})}},
}
DEVICE_CONFIG = {"nvidia": {"defaultMemory": 2048, "memoryFactor": 1, "gpuCorePolicy": "force",
                            "migProfileAllowlist": [{"models": ["A30"], "profiles": ["1g.6gb", "2g.12gb"]}]},
                 "cambricon": {"resourceCountName": "cambricon.com/vmlu"}}


def by_key(lines):
    return {ln.key: ln for ln in lines}


def test_every_key_is_mapped_defaulted_or_explained():
    values, lines = translate(VALUES, DEVICE_CONFIG)
    cfg = values["config"]
    assert cfg["resourceCountName"] == "example.com/vgpu" and cfg["deviceSplitCount"] == 4
    assert cfg["deviceMemoryScaling"] == 1.5 and cfg["nodeSchedulerPolicy"] == "spread"
    assert cfg["adoptSchedulerNames"] == ["hami-scheduler", "my-hami"]
    assert cfg["defaultMemory"] == 2048 and cfg["migProfileAllowlist"][0]["models"] == ["A30"]
    assert cfg["nodeconfig"] == [{"name": "gpu-7", "operatingMode": "mig", "deviceSplitCount": 7,
                                  "filterDevices": {"uuid": [], "index": [3]}}]
    assert values["webhook"] == {"failurePolicy": "Fail"} and "tolerations" not in values  # [] keeps hamid's own
    k = by_key(lines)
    assert k["resourceName"].action == "mapped" and "config.resourceCountName" in k["resourceName"].detail
    assert k["resourceMem"].action == "default"
    assert k["scheduler.defaultSchedulerPolicy.gpuSchedulerPolicy"].action == "default"
    assert k["scheduler.nodeLockExpire"].action == "no counterpart" and "no node lock" in k["scheduler.nodeLockExpire"].detail
    assert "another vendor" in k["mluResourceName"].detail and "another vendor" in k["cambricon"].detail
    assert cfg["gpuCorePolicy"] == "force" and k["nvidia.gpuCorePolicy"].action == "mapped"
    assert k["devicePlugin.nodeConfiguration.config.nodeconfig[0]"].detail.startswith("HAMi's placeholder")
    assert k["devicePlugin.nodeConfiguration.config.nodeconfig[1].migstrategy"].action == "no counterpart"
    # every leaf of the input has its line
    assert {"global.gpuHookPath", "global.imageTag", "devicePlugin.migStrategy", "scheduler.leaderElect",
            "nvidia.memoryFactor", "nvidia.defaultMemory"} <= set(k)


def test_the_cli_writes_values_and_a_config_hamid_run_accepts(tmp_path):
    (tmp_path / "values.yaml").write_text(yaml.safe_dump(VALUES))
    (tmp_path / "device-config.yaml").write_text(yaml.safe_dump(DEVICE_CONFIG))
    r = subprocess.run([*HAMID, "config", "from-hami", str(tmp_path / "values.yaml"),
                        str(tmp_path / "device-config.yaml"), "-o", str(tmp_path / "hamid-values.yaml"),
                        "--config-out", str(tmp_path / "hamid.yaml")], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert "no counterpart  scheduler.nodeLockExpire:" in r.stderr and "mapped" in r.stderr
    assert "with no counterpart" in r.stderr.strip().splitlines()[0]  # the summary first
    values = yaml.safe_load((tmp_path / "hamid-values.yaml").read_text())
    assert values["config"]["deviceSplitCount"] == 4
    cfg = load_config(str(tmp_path / "hamid.yaml"))  # hamid run --config reads it
    assert cfg.deviceSplitCount == 4 and cfg.resourceCountName == "example.com/vgpu"


def test_a_value_hamid_cannot_take_is_refused_naming_it():
    with pytest.raises(HamidError, match="deviceSplitCount"):
        translate({"devicePlugin": {"deviceSplitCount": -1}})


def test_allowlist_model_names_in_hamis_form_name_the_gpus_nvml_reports(tmp_path):
    """HAMi's presets write ``H100-SXM5-80GB``; NVML says ``NVIDIA H100 80GB HBM3``."""
    from structlog.testing import capture_logs

    from hamid.config import resolve_node
    from hamid.node.capacity import capacity_views
    from hamid.devices.simulated import SimulatedBackend, parse_simulate_spec

    dev = {"nvidia": {"migProfileAllowlist": [{"models": ["H100-SXM5-80GB"], "profiles": ["1g.10gb"]},
                                              {"models": ["X9000-12GB"], "profiles": ["1g.5gb"]}]}}
    values, lines = translate({}, dev)
    k = by_key(lines)
    assert k["nvidia.migProfileAllowlist[0].models"].action == "mapped"
    assert "NVIDIA H100 80GB HBM3" in k["nvidia.migProfileAllowlist[0].models"].detail
    assert k["nvidia.migProfileAllowlist[1].models"].action == "warning"

    cfg = load_config(None, {**values["config"], "operatingMode": "mig", "simulate": "H100:1,A100:1"})
    gpus = SimulatedBackend(parse_simulate_spec("H100:1,A100:1"), "n", mig_enabled=True,
                            state_file=tmp_path / "mig.json").gpus()
    h100, a100 = capacity_views(gpus, resolve_node(cfg, "n"))
    assert [p.name for p in h100.mig_profiles] == ["1g.10gb"]  # HAMi would forbid the others
    assert len(a100.mig_profiles) > 1  # no entry names it: its whole table

    from nodeharness import make_node

    with capture_logs() as logs:
        d = make_node(tmp_path / "st", simulate="H100:1,A100:1", mode="mig",
                      migProfileAllowlist=values["config"]["migProfileAllowlist"])
    d.close()
    warned = [e for e in logs if "migProfileAllowlist names no model" in e["event"]]
    assert [e["name"] for e in warned] == ["NVIDIA A100-SXM4-40GB"]


def test_a_device_config_given_alone_is_read_as_one_and_said_where_it_goes(tmp_path):
    (tmp_path / "device-config.yaml").write_text(yaml.safe_dump(DEVICE_CONFIG))
    r = subprocess.run([*HAMID, "config", "from-hami", str(tmp_path / "device-config.yaml"),
                        "--config-out", str(tmp_path / "hamid.yaml")], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert "second argument" in r.stderr and "device config" in r.stderr
    cfg = load_config(str(tmp_path / "hamid.yaml"))
    assert cfg.defaultMemory == 2048 and cfg.gpuCorePolicy == "force"
    assert "0 mapped" not in r.stderr


def test_the_report_is_summary_first_with_no_counterpart_keys_grouped_and_legacy_metrics_known():
    many = {**VALUES, "legacyMetrics": True,
            "devices": {"nvidia": {"defaultCores": 20, "libCudaLogLevel": 1},
                        "mthreads": {"a": 1, "b": 2}, "ascend": {"c": 3}}}
    values, lines = translate(many)
    assert values["config"]["legacyMetrics"] is True and values["config"]["defaultCores"] == 20
    k = by_key(lines)
    assert k["legacyMetrics"].action == "mapped"
    assert k["devices.nvidia.libCudaLogLevel"].action == "no counterpart"
    from hamid.config.fromhami import report

    out = report(lines)
    assert out[0].startswith(f"{sum(1 for x in lines if x.action == 'mapped')} mapped")
    actions = [ln.split()[0] for ln in out[1:]]
    assert actions == sorted(actions, key=["warning", "mapped", "default", "no"].index)  # what matters first
    vendor = [ln for ln in out if "another vendor" in ln]
    assert len(vendor) == 1 and "mthreads.a" in vendor[0] and "ascend.c" in vendor[0]
