"""HAMi's node annotations on a real daemon's Node, read back by a decoder written from HAMi's code.

The decoder below follows HAMi's (pkg/device/devices.go at 4707fb0): the
register annotation is ``json.Unmarshal``-ed into ``[]*DeviceInfo`` (fields
``id`` string, ``index`` uint, ``count``/``devmem``/``devcore`` int32,
``type`` string, ``numa`` int, ``mode`` string, ``migProfiles``
[{``name``, ``memoryMB`` int32, ``core`` int32, ``sliceCount`` uint32,
``placements`` [{``start``, ``size`` uint32}]}], ``health`` bool; a field
left out is its zero value); the handshake is read as HAMi's ``CheckHealth``
does: ``Requesting_`` then a ``time.DateTime`` in local time, fresh for 60 s.
Stricter than Go in one way: an unknown or misspelt key fails here (Go would
drop it silently, and HAMi's tools would see a zero).
"""

from __future__ import annotations

import json
import time
from datetime import datetime

import pytest

from nodeenv import NodeEnv

pytestmark = pytest.mark.slow

INT32 = (-(2**31), 2**31 - 1)
UINT32 = (0, 2**32 - 1)
DEVICE_FIELDS = {"id": str, "index": "uint", "count": "int32", "devmem": "int32", "devcore": "int32", "type": str,
                 "numa": int, "mode": str, "migProfiles": list, "migtemplate": list, "health": bool,
                 "devicevendor": str, "custominfo": dict}
PROFILE_FIELDS = {"name": str, "memoryMB": "int32", "core": "int32", "sliceCount": "uint32", "placements": list}


def _typed(v, kind, where):
    if kind in ("int32", "uint32", "uint"):
        assert isinstance(v, int) and not isinstance(v, bool), f"{where}: {v!r} is not an integer"
        lo, hi = {"int32": INT32, "uint32": UINT32, "uint": (0, 2**64 - 1)}[kind]
        assert lo <= v <= hi, f"{where}: {v} out of {kind}"
    else:
        assert isinstance(v, kind) and not (kind is int and isinstance(v, bool)), f"{where}: {v!r} is not {kind}"
    return v


def decode_register(text: str) -> list[dict]:
    devices = json.loads(text)
    assert isinstance(devices, list), "the register annotation is a JSON array (HAMi >= 2.8)"
    out = []
    for i, d in enumerate(devices):
        assert isinstance(d, dict) and set(d) <= set(DEVICE_FIELDS), f"device {i}: unknown keys {set(d) - set(DEVICE_FIELDS)}"
        dev = {k: _typed(d[k], kind, f"device {i}.{k}") if k in d else
               {"uint": 0, "int32": 0, str: "", int: 0, bool: False, list: [], dict: {}}[kind]
               for k, kind in DEVICE_FIELDS.items()}
        for j, p in enumerate(dev["migProfiles"]):
            assert set(p) <= set(PROFILE_FIELDS), f"device {i} profile {j}: unknown keys"
            for k, kind in PROFILE_FIELDS.items():
                assert k in p, f"device {i} profile {j}: {k} missing (not omitempty in HAMi)"
                _typed(p[k], kind, f"device {i} profile {j}.{k}")
            for pl in p["placements"]:
                assert set(pl) == {"start", "size"}
                _typed(pl["start"], "uint32", "start"), _typed(pl["size"], "uint32", "size")
        out.append(dev)
    return out


def handshake_fresh(value: str, now: datetime) -> bool:
    assert "Requesting" in value
    _, sep, stamp = value.partition("_")
    assert sep, value
    when = datetime.strptime(stamp, "%Y-%m-%d %H:%M:%S")
    return now.timestamp() - when.timestamp() < 60


def _annotations(env: NodeEnv, timeout: float = 20.0) -> dict:
    deadline = time.time() + timeout
    while time.time() < deadline:
        ann = env.api.get("Node", None, env.node)["metadata"].get("annotations") or {}
        if "hami.io/node-nvidia-register" in ann:
            return ann
        time.sleep(0.1)
    raise AssertionError(f"no register annotation: {env.log.read_text()[-2000:]}")


def _advertised(env: NodeEnv, timeout: float = 20.0) -> dict:
    deadline = time.time() + timeout
    while time.time() < deadline:
        status = env.api.get("Node", None, env.node)["status"]
        if "nvidia.com/gpucores" in status.get("allocatable", {}):
            assert status["capacity"]["nvidia.com/gpumem"] == status["allocatable"]["nvidia.com/gpumem"]
            return status["allocatable"]
        time.sleep(0.1)
    raise AssertionError(f"no node resources advertised: {env.log.read_text()[-2000:]}")


def test_shared_gpus_are_registered_as_hami_does(tmp_path, api_server):
    env = NodeEnv(tmp_path / "n", api_server, simulate="H100-80GB-HBM3:1,T4:1", split=4,
                  extra_config="deviceMemoryScaling: 1.5\n").start()
    try:
        ann = _annotations(env)
        status = _advertised(env)
    finally:
        env.stop()
    # the node-level resources kube-scheduler and kubelet count (two GPUs, 4 tenants each)
    assert (status["nvidia.com/gpucores"], status["nvidia.com/gpumem-percentage"], status["nvidia.com/priority"]) \
        == ("200", "200", "8")
    assert int(status["nvidia.com/gpumem"]) == int((81559 + 15360) * 1.5)
    h100, t4 = decode_register(ann["hami.io/node-nvidia-register"])
    assert h100["id"].startswith("GPU-") and h100["index"] == 0 and t4["index"] == 1
    assert (h100["type"], t4["type"]) == ("NVIDIA H100 80GB HBM3", "NVIDIA-Tesla T4")  # NVIDIA- unless it starts so
    assert (t4["count"], t4["devmem"], t4["devcore"], t4["mode"], t4["health"]) == (4, int(15360 * 1.5), 100,
                                                                                   "hami-core", True)
    assert h100["migProfiles"] == [] and h100["mode"] == "hami-core"
    assert '"index"' not in ann["hami.io/node-nvidia-register"].split("}")[0]  # index 0 left out, as omitempty does
    assert handshake_fresh(ann["hami.io/node-handshake"], datetime.now())


def test_a_mig_mode_gpu_is_registered_with_its_profiles(tmp_path, api_server):
    env = NodeEnv(tmp_path / "n", api_server, simulate="H100-80GB-HBM3:1", mode="mig", split=7).start()
    try:
        ann = _annotations(env)
    finally:
        env.stop()
    (gpu,) = decode_register(ann["hami.io/node-nvidia-register"])
    assert gpu["mode"] == "mig" and gpu["devcore"] == 100 and gpu["devmem"] == 81559  # the card's memory
    names = {p["name"]: p for p in gpu["migProfiles"]}
    assert {"1g.10gb", "7g.80gb"} <= set(names)
    assert gpu["count"] == 7  # the largest instance count (seven 1g.10gb)
    assert names["7g.80gb"]["core"] == 100 and 0 < names["1g.10gb"]["core"] < 20
    assert names["1g.10gb"]["sliceCount"] == 1 and len(names["1g.10gb"]["placements"]) == 7


def test_the_decoder_refuses_what_hami_would_misread():
    with pytest.raises(AssertionError, match="unknown keys"):
        decode_register('[{"id":"GPU-1","devMem":1}]')  # a misspelt key: HAMi would read devmem 0
    with pytest.raises(AssertionError, match="not an integer"):
        decode_register('[{"id":"GPU-1","devmem":"1024"}]')
    with pytest.raises(AssertionError, match="JSON array"):
        decode_register('{"id":"GPU-1"}')
    assert not handshake_fresh("Requesting_2020-01-01 00:00:00", datetime.now())
