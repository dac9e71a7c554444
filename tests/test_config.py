"""The config file: defaults, per-node overrides, flags, and rejections."""

from __future__ import annotations

import pytest

from hamid.config import ConfigError, load_config, resolve_node
from hamid.config.schema import Config, NodeSettings


def write(tmp_path, text):
    p = tmp_path / "config.yaml"
    p.write_text(text)
    return p


def test_defaults_are_hamis():
    c = load_config(None)
    s = resolve_node(c, "any")
    assert s.deviceSplitCount == 10
    assert s.deviceMemoryScaling == 1.0
    assert s.deviceCoreScaling == 1.0
    assert s.operatingMode == "hami-core"
    assert s.nodeSchedulerPolicy == "binpack" and s.gpuSchedulerPolicy == "spread"
    assert s.defaultMemory == 0 and s.defaultCores == 0 and s.defaultGPUNum == 1


def test_every_key_has_a_documented_default():
    import inspect

    from hamid.config import schema

    import re

    src = inspect.getsource(schema)
    for name, field in Config.model_fields.items():
        assert not field.is_required(), name
        # the field's line in a class body is followed by its docstring
        assert re.search(rf'\n    {name}: [^\n]*\n    """', src), f"{name} has no documented reason"


def test_per_node_override_and_flags(tmp_path):
    p = write(tmp_path, """
deviceSplitCount: 4
nodeconfig:
  - name: gpu-7
    operatingMode: mig
    filterDevices: {index: [3], uuid: [GPU-x]}
  - name: gpu-8
    deviceMemoryScaling: 2
""")
    c = load_config(p, {"metricsPort": 9999, "stateDir": None})
    assert c.metricsPort == 9999
    assert c.stateDir == "/var/lib/hamid"
    s7 = resolve_node(c, "gpu-7")
    assert s7.operatingMode == "mig" and s7.deviceSplitCount == 4
    assert s7.filterDevices.index == (3,) and s7.filterDevices.uuid == ("GPU-x",)
    s8 = resolve_node(c, "gpu-8")
    assert s8.deviceMemoryScaling == 2 and s8.operatingMode == "hami-core"
    assert resolve_node(c, "other") == NodeSettings(deviceSplitCount=4)


@pytest.mark.parametrize("text,needles", [
    ("deviceSplitCnt: 3", ["unknown key 'deviceSplitCnt'", "deviceSplitCount"]),
    ("deviceSplitCount: 0", ["deviceSplitCount=0", "greater than or equal to 1"]),
    ("operatingMode: shared", ["operatingMode='shared'", "hami-core", "mig"]),
    ("nodeconfig: [{name: a, bogus: 1}]", ["unknown key 'nodeconfig.0.bogus'"]),
    ("filterDevices: {idx: [1]}", ["unknown key 'filterDevices.idx'", "index, uuid"]),
    ("filterDevices: {index: [-1]}", ["filterDevices.index", "-1"]),
    ("simulate: B200:2", ["simulate", "B200", "H100-80GB-HBM3"]),
    ("deviceMemoryScaling: lots", ["deviceMemoryScaling='lots'"]),
    ("- a list", ["top level must be a mapping"]),
    ("a: [unclosed", ["not valid YAML"]),
])
def test_bad_values_are_named(tmp_path, text, needles):
    with pytest.raises(ConfigError) as e:
        load_config(write(tmp_path, text))
    for n in needles:
        assert n in str(e.value)


def test_missing_file_is_named(tmp_path):
    with pytest.raises(ConfigError, match="cannot read config file"):
        load_config(tmp_path / "nope.yaml")


DEEP_SEQ = "a: " + "[" * 5000 + "]" * 5000 + "\n"
DEEP_MAP = "a: " + "{b: " * 5000 + "1" + "}" * 5000 + "\n"


@pytest.mark.parametrize("data,needle", [
    (b"nodeName: caf\xe9\n", "not UTF-8 text: byte 0xe9 at offset 13 (line 1)"),
    (b"\xff\xfen\x00o\x00", "not UTF-8 text: byte 0xff at offset 0"),
    (DEEP_SEQ.encode(), "nested deeper than 32 levels at line 1"),
    (DEEP_MAP.encode(), "nested deeper than 32 levels at line 1"),
    (b"# padding\n" * 120_000, "larger than 1048576 bytes"),
    (b"42\n", "top level must be a mapping of keys, got int"),
    (b"just words\n", "top level must be a mapping of keys, got str"),
    (b"a: [unclosed\n", "not valid YAML at line 2, column 1"),
    (b"a: 1\n b: 2\n", "not valid YAML at line 2"),
])
def test_a_file_that_cannot_be_a_config_is_one_line_naming_it(tmp_path, capsys, data, needle):
    from hamid.cli.main import main

    p = tmp_path / "config.yaml"
    p.write_bytes(data)
    with pytest.raises(ConfigError) as e:
        load_config(p)
    msg = str(e.value)
    assert needle in msg and str(p) in msg
    assert "\n" not in msg
    # the CLI prints that line and nothing else (no traceback), and stops
    assert main(["status", "--config", str(p)]) == 1
    err = capsys.readouterr().err
    assert err == f"hamid status: {msg}\n"


def test_nesting_the_schema_needs_is_accepted(tmp_path):
    c = load_config(write(tmp_path, "nodeconfig:\n  - name: a\n    filterDevices:\n      uuid: [GPU-1]\n"))
    assert c.nodeconfig[0].filterDevices.uuid == ("GPU-1",)


@pytest.mark.parametrize("listen", ["10.0.0.5:7947", "0.0.0.0:7947", "[::]:7947", "node-a.example:7947"])
def test_gossip_without_a_key_off_loopback_is_refused_in_one_line(tmp_path, listen):
    p = write(tmp_path, f"gossipListen: '{listen}'\n")
    with pytest.raises(ConfigError) as e:
        load_config(p)
    msg = str(e.value)
    assert "\n" not in msg
    assert f"gossip on {listen} without a key" in msg and str(p) in msg
    assert "gossipKeyFile" in msg and "gossipInsecure: true" in msg and "--gossip-insecure" in msg
    # a flag given on the command line is checked the same way
    with pytest.raises(ConfigError, match="without a key"):
        load_config(None, {"gossipListen": listen})


@pytest.mark.parametrize("cfg", [
    {"gossipListen": "10.0.0.5:7947", "gossipInsecure": True},
    {"gossipListen": "10.0.0.5:7947", "gossipKeyFile": "/etc/hamid/keys"},
    {"gossipListen": "127.0.0.1:7947"},
    {"gossipListen": "[::1]:7947"},
    {"gossipListen": "localhost:7947"},
    {},
])
def test_gossip_with_a_key_on_loopback_or_explicitly_insecure_is_accepted(cfg):
    c = load_config(None, cfg)
    assert c.gossipInsecure is cfg.get("gossipInsecure", False)
