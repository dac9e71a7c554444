"""Device backends: the catalog's facts and the simulated MIG bookkeeping."""

from __future__ import annotations

import pytest

from hamid.devices import DeviceError, open_backend
from hamid.devices.catalog import MODELS, lookup
from hamid.devices.simulated import SimulatedBackend, parse_simulate_spec
from hamid.devices.types import MigPlacement


def test_h100_table_matches_nvml_reading():
    m = lookup("H100-80GB-HBM3")
    assert m.memory_mib == 81559 and m.sm_count == 132
    got = {p.name: (p.profile_id, p.max_instances, p.sm_count) for p in m.mig_profiles}
    assert got == {
        "1g.10gb": (19, 7, 16), "1g.10gb+me": (20, 1, 16), "1g.20gb": (15, 4, 26),
        "2g.20gb": (14, 3, 32), "3g.40gb": (9, 2, 60), "4g.40gb": (5, 1, 64), "7g.80gb": (0, 1, 132),
    }
    assert [p.start for p in m.mig_profiles[0].placements] == list(range(7))


def test_catalog_has_the_required_models():
    for key in ("A100-SXM4-40GB", "A100-SXM4-80GB", "A30", "H100-80GB-HBM3", "H200-141GB", "T4"):
        assert lookup(key) is not None, key
    assert not lookup("T4").mig_capable
    assert lookup("A30").memory_slices == 4
    for m in MODELS.values():
        for p in m.mig_profiles:
            assert p.memory_mib < m.memory_mib
            for pl in p.placements:
                assert pl.start + pl.size <= m.memory_slices


@pytest.mark.parametrize("spec,err", [
    ("", "empty inventory"),
    ("B200", "unknown model 'B200'"),
    ("H100:0", "bad count '0'"),
    ("H100:x", "bad count 'x'"),
])
def test_bad_simulate_specs(spec, err):
    with pytest.raises(DeviceError, match=err):
        parse_simulate_spec(spec)


def test_uuids_are_stable_and_distinct_per_node():
    a = SimulatedBackend(parse_simulate_spec("T4:2"), "a").gpus()
    a2 = SimulatedBackend(parse_simulate_spec("T4:2"), "a").gpus()
    b = SimulatedBackend(parse_simulate_spec("T4:2"), "b").gpus()
    assert [g.uuid for g in a] == [g.uuid for g in a2]
    assert not {g.uuid for g in a} & {g.uuid for g in b}
    assert len({g.uuid for g in a}) == 2


def test_auto_backend_is_simulated_without_a_driver():
    b = open_backend(simulate=None, node_name="n")
    # This machine has no NVIDIA driver; the default inventory is used.
    assert b.kind == "simulated" and len(b.gpus()) >= 2


def test_mig_conflicts_like_nvml(tmp_path):
    state = tmp_path / "mig.json"
    b = SimulatedBackend(parse_simulate_spec("H100"), "n", mig_enabled=True, state_file=state)
    gpu = b.gpus()[0].uuid
    i1 = b.create_mig_instance(gpu, "3g.40gb", MigPlacement(4, 4))
    b.create_mig_instance(gpu, "4g.40gb", MigPlacement(0, 4))
    with pytest.raises(DeviceError, match="INSUFFICIENT_RESOURCES"):
        b.create_mig_instance(gpu, "1g.10gb", MigPlacement(0, 1))  # overlaps the 4g
    with pytest.raises(DeviceError, match="not valid"):
        b.create_mig_instance(gpu, "3g.40gb", MigPlacement(2, 4))
    with pytest.raises(DeviceError, match="no MIG profile"):
        b.create_mig_instance(gpu, "9g.99gb", MigPlacement(0, 8))
    # Another process (a second backend on the same state file) sees them.
    other = SimulatedBackend(parse_simulate_spec("H100"), "n", mig_enabled=True, state_file=state)
    assert {i.profile for i in other.gpus()[0].mig_instances} == {"3g.40gb", "4g.40gb"}
    assert other.destroy_mig_instance(gpu, i1.gi_id) is True
    assert other.destroy_mig_instance(gpu, i1.gi_id) is False  # idempotent
    assert [i.profile for i in b.gpus()[0].mig_instances] == ["4g.40gb"]
    assert oct(state.stat().st_mode & 0o777) == "0o600"


def test_mig_limits_per_profile_and_compute_slices():
    b = SimulatedBackend(parse_simulate_spec("A100-SXM4-40GB"), "n", mig_enabled=True)
    gpu = b.gpus()[0].uuid
    b.create_mig_instance(gpu, "1g.5gb+me", MigPlacement(0, 1))
    with pytest.raises(DeviceError, match="already has 1"):
        b.create_mig_instance(gpu, "1g.5gb+me", MigPlacement(1, 1))
    b.create_mig_instance(gpu, "3g.20gb", MigPlacement(4, 4))
    b.create_mig_instance(gpu, "2g.10gb", MigPlacement(2, 2))
    # 1 + 3 + 2 = 6 of 7 compute slices; another 2g cannot fit anywhere anyway
    with pytest.raises(DeviceError):
        b.create_mig_instance(gpu, "2g.10gb", MigPlacement(0, 2))


def test_non_mig_gpu_refuses_mig():
    b = SimulatedBackend(parse_simulate_spec("H100"), "n", mig_enabled=False)
    with pytest.raises(DeviceError, match="not in MIG mode"):
        b.create_mig_instance(b.gpus()[0].uuid, "1g.10gb", MigPlacement(0, 1))
