"""The DRA scheduler stand-in's allocation rules, as resource.k8s.io/v1's field comments state them:
request policies round up (and refuse over max), only a pool's newest complete generation is used,
shared devices sum consumed capacity, counters bound partitionable devices, taints keep claims off."""

from __future__ import annotations

from fractions import Fraction

from dynamicresources import Allocator, Device, Usage, consumption

NODE = {"metadata": {"name": "n"}}
CLASS = {"metadata": {"name": "c"}, "spec": {"selectors": [{"cel": {"expression": 'device.driver == "d.io"'}}]}}


def _slice(name, devices=None, counters=None, gen=1, count=1):
    spec = {"driver": "d.io", "nodeName": "n", "pool": {"name": "n", "generation": gen, "resourceSliceCount": count}}
    if devices is not None:
        spec["devices"] = devices
    if counters is not None:
        spec["sharedCounters"] = counters
    return {"metadata": {"name": name}, "spec": spec}


def _claim(requests=None, **exactly):
    return {"devices": {"requests": [{"name": "r", "exactly": {"deviceClassName": "c", "allocationMode": "ExactCount",
                                                                 "count": 1, **exactly,
                                                                 **({"capacity": {"requests": requests}}
                                                                    if requests else {})}}]}}


SHARED = {"name": "g0", "allowMultipleAllocations": True, "capacity": {
    "memory": {"value": "10Gi", "requestPolicy": {"default": "1Gi", "validRange": {"min": "1Gi", "step": "1Gi"}}},
    "cores": {"value": "100", "requestPolicy": {"default": "0", "validRange": {"min": "0", "max": "50", "step": "10"}}}}}


def test_request_policy_rounds_up_defaults_and_refuses_over_max():
    dev = Device("d.io", "n", 0, SHARED)
    got = consumption(dev, {"memory": "1500Mi", "cores": "11"})
    assert got == {"memory": Fraction(2 << 30), "cores": Fraction(20)}
    assert consumption(dev, {}) == {"memory": Fraction(1 << 30), "cores": Fraction(0)}
    assert consumption(dev, {"cores": "60"}) is None
    assert consumption(dev, {"shares": "1"}) is None  # a capacity the device does not have


def test_shared_capacity_sums_and_the_next_claim_does_not_fit():
    a = Allocator([_slice("s", [SHARED])], [CLASS], [])
    usage = a.usage
    first = a.allocate_claim(_claim({"memory": "6Gi"}), NODE, usage)
    assert first["devices"]["results"][0]["consumedCapacity"] == {"memory": str(6 << 30), "cores": "0"}
    assert first["devices"]["results"][0]["shareID"]
    assert a.allocate_claim(_claim({"memory": "5Gi"}), NODE, usage) is None
    assert a.allocate_claim(_claim({"memory": "4Gi"}), NODE, usage) is not None


def test_only_the_newest_complete_generation_of_a_pool_is_used():
    old = _slice("old", [{"name": "gone"}], gen=1)
    new = _slice("new", [{"name": "g1"}], gen=2, count=2)  # says two slices, has one: incomplete
    a = Allocator([old, new], [CLASS], [])
    assert a.allocate_claim(_claim(), NODE, a.usage) is None
    a = Allocator([old, new, _slice("new2", [{"name": "g2"}], gen=2, count=2)], [CLASS], [])
    assert a.allocate_claim(_claim(), NODE, a.usage)["devices"]["results"][0]["device"] == "g1"


def test_counters_bound_partitionable_devices_and_taints_keep_claims_off():
    counters = [{"name": "set", "counters": {"s0": {"value": "1"}, "s1": {"value": "1"}}}]

    def part(name, slices, taints=None):
        d = {"name": name, "consumesCounters": [{"counterSet": "set", "counters": {
            f"s{i}": {"value": "1"} for i in slices}}]}
        if taints:
            d["taints"] = taints
        return d

    devices = [part("whole", [0, 1]), part("half0", [0]), part("half1", [1])]
    a = Allocator([_slice("d", devices, count=2), _slice("c", counters=counters, count=2)], [CLASS], [])
    usage = Usage()
    got = a.allocate_claim(_claim(), NODE, usage)
    assert got["devices"]["results"][0]["device"] == "whole"
    assert a.allocate_claim(_claim(), NODE, usage) is None  # every slice counter is spent
    tainted = [part("half0", [0], [{"key": "k", "value": "v", "effect": "NoSchedule"}]), part("half1", [1])]
    a = Allocator([_slice("d", tainted, count=2), _slice("c", counters=counters, count=2)], [CLASS], [])
    assert a.allocate_claim(_claim(), NODE, Usage())["devices"]["results"][0]["device"] == "half1"
    tolerated = _claim(tolerations=[{"key": "k", "operator": "Exists", "effect": "NoSchedule"}])
    assert a.allocate_claim(tolerated, NODE, Usage())["devices"]["results"][0]["device"] == "half0"
