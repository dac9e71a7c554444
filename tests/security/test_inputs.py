"""Bad input gets a clear refusal (400 with the field named), never a 500;
defaults that expose nothing; the smaller defects of the review."""

from __future__ import annotations

import pytest

from hamid.config.schema import Config
from hamid.devices.simulated import SimulatedBackend, parse_simulate_spec
from hamid.docker import spec
from hamid.errors import HamidError
from hamid.logs import Throttle
from hamid.devices.types import MigPlacement


@pytest.mark.parametrize("process, field", [
    ({"user": {"uid": "root"}}, "process.user.uid"),
    ({"user": {"uid": 0, "gid": -1}}, "process.user.gid"),
    ({"user": {"uid": True}}, "process.user.uid"),
    ({"user": "0:0"}, "process.user"),
    ({"env": "HAMI_VGPU_SPEC=mem=1g"}, "process.env"),
    ({"env": ["A=1", 7]}, "process.env"),
    ("not an object", "process"),
])
def test_a_malformed_config_json_is_a_refusal_naming_the_field(process, field):
    with pytest.raises(HamidError, match=field.replace(".", r"\.")):  # HamidError: the Docker face answers 400
        spec.user({"process": process})
        spec.env_list({"process": process})
    assert spec.user({"process": {"user": {"uid": 1000, "gid": 1000}}}) == (1000, 1000)


def test_metrics_listen_on_loopback_unless_told_otherwise():
    assert Config().metricsAddress == "127.0.0.1"


def test_simulated_mig_instances_never_reuse_an_earlier_instances_uuid(tmp_path):
    b = SimulatedBackend(parse_simulate_spec("H100:1"), "n", mig_enabled=True, state_file=tmp_path / "mig.json")
    gpu = b.gpus()[0].uuid
    seen = set()
    for profile in ("3g.40gb", "4g.40gb", "3g.40gb"):  # same placement start and GPU instance id each time
        inst = b.create_mig_instance(gpu, profile, MigPlacement(0, 4))
        assert inst.uuid not in seen
        seen.add(inst.uuid)
        assert b.destroy_mig_instance(gpu, inst.gi_id)


def test_a_stranger_cannot_flood_the_log():
    t = Throttle(10.0)
    clock = [0.0]
    t._clock = lambda: clock[0]
    assert t.ready() == (True, 0)
    assert [t.ready()[0] for _ in range(1000)] == [False] * 1000
    clock[0] = 10.5
    assert t.ready() == (True, 1000)
