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
    assert r.stderr.strip().splitlines()[-1].endswith("with no counterpart")
    values = yaml.safe_load((tmp_path / "hamid-values.yaml").read_text())
    assert values["config"]["deviceSplitCount"] == 4
    cfg = load_config(str(tmp_path / "hamid.yaml"))  # hamid run --config reads it
    assert cfg.deviceSplitCount == 4 and cfg.resourceCountName == "example.com/vgpu"


def test_a_value_hamid_cannot_take_is_refused_naming_it():
    with pytest.raises(HamidError, match="deviceSplitCount"):
        translate({"devicePlugin": {"deviceSplitCount": -1}})
