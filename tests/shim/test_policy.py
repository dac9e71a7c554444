"""GPU_CORE_UTILIZATION_POLICY as HAMi means it, on the stand-in driver
(tests/shim/csrc: a fake GPU, and a fake NVML whose per-process utilization
samples the test writes): ``default`` limits only while another container
runs kernels on the GPU, ``force`` always, ``disable`` never; where NVML
cannot tell (no per-process samples), ``default`` limits. Rates are measured
on the stand-in driver's virtual clock (shimharness.py): the same on a busy
machine as on a quiet one."""

from __future__ import annotations

import pytest

from hamid.shimregion import read_region
from shimharness import Shim, finish, wait_ready

KERNEL_US = 400
BUSY_NEIGHBOUR = "999999 60\n"  # a process of no container of ours (its NVML pid in no slot), 60 % busy


def share(res_line: list[str], bare: float) -> float:
    n, ns = res_line[1:3]
    return int(n) / (int(ns) / 1e9) / bare


@pytest.fixture
def shim(built, tmp_path) -> Shim:
    return Shim(built, tmp_path, vclock=True)


@pytest.fixture(scope="module")
def bare(built, tmp_path_factory) -> float:
    r = Shim(built, tmp_path_factory.mktemp("bare"), vclock=True).run("direct", "init", f"run:1.0:{KERNEL_US}:k",
                                                                      preload=False)
    n, ns = r.one("run")[1:3]
    return int(n) / (int(ns) / 1e9)


@pytest.mark.parametrize("policy,neighbour,limited", [
    ("default", "", False),               # alone: HAMi's default does not limit
    ("default", BUSY_NEIGHBOUR, True),    # another container busy: limited
    ("force", "", True),                  # force: always
    ("disable", BUSY_NEIGHBOUR, False),   # disable: never, even shared
    (None, BUSY_NEIGHBOUR, True),         # unset is default (HAMi-core's and the chart's)
    (None, "", False),
])
def test_policy_decides_when_the_limit_holds(shim, bare, tmp_path, policy, neighbour, limited):
    util = tmp_path / "nvml_util"
    util.write_text(neighbour)
    env = {"CUDA_DEVICE_SM_LIMIT": "30", "FAKE_NVML_UTIL": str(util)}
    if policy:
        env["GPU_CORE_UTILIZATION_POLICY"] = policy
    r = shim.run("direct", "init", f"run:0.4:{KERNEL_US}:k", f"run:1.2:{KERNEL_US}:k", **env)
    s = share(r.find("run")[-1], bare)
    if limited:
        assert abs(s - 0.30) <= 0.07, (policy, neighbour, s, r.stderr[-2000:])
    else:
        assert s > 0.85, (policy, neighbour, s, r.stderr[-2000:])
    d = read_region(shim.region).device(0)
    if policy == "disable":
        assert d.launches == 0 and d.gpu_time_ns == 0  # no limiter work at all
    else:  # the accounting goes on whether held back or not (the daemon's utilization metric reads it)
        assert d.gpu_time_ns > 0.1e9


def test_default_limits_when_nvml_cannot_tell(shim, bare):
    """No per-process samples (NVML answers NOT_SUPPORTED): a limit that cannot see contention holds."""
    r = shim.run("direct", "init", f"run:0.4:{KERNEL_US}:k", f"run:1.2:{KERNEL_US}:k", CUDA_DEVICE_SM_LIMIT="30",
                 GPU_CORE_UTILIZATION_POLICY="default")
    assert abs(share(r.find("run")[-1], bare) - 0.30) <= 0.07


def test_default_switches_as_a_neighbour_comes_and_goes(shim, bare, tmp_path):
    """A process runs alone (unlimited), a neighbour becomes busy (held to 30 %), within one process."""
    util = tmp_path / "nvml_util"
    util.write_text("")
    p = shim.spawn("direct", "init", f"run:1.0:{KERNEL_US}:k", "wait", "sleep:400", f"run:1.2:{KERNEL_US}:k",
                   CUDA_DEVICE_SM_LIMIT="30", GPU_CORE_UTILIZATION_POLICY="default", FAKE_NVML_UTIL=str(util))
    first = wait_ready(p)
    util.write_text(BUSY_NEIGHBOUR)
    out = finish(p)
    alone = share([ln for ln in first if ln.startswith("run ")][-1].split(), bare)
    shared = share([ln for ln in out if ln.startswith("run ")][-1].split(), bare)
    assert alone > 0.85, alone
    assert abs(shared - 0.30) <= 0.07, shared


@pytest.mark.parametrize("bad", ["sometimes", "forced", "0"])
def test_a_bad_policy_refuses_cuda_and_names_the_accepted_values(shim, bad):
    r = shim.run("direct", "init", CUDA_DEVICE_SM_LIMIT="30", GPU_CORE_UTILIZATION_POLICY=bad)
    assert r.one("init")[1] == "3", r
    assert f"GPU_CORE_UTILIZATION_POLICY={bad}" in r.stderr and "default, force or disable" in r.stderr


def test_samples_of_a_process_gone_before_this_one_began_are_not_a_neighbour(shim, bare, tmp_path):
    """NVML keeps seconds of per-process samples: a neighbour busy 5 s ago (before this process started; the
    bench's unlimited run just before a limited one) must not make `default` limit a process that is alone
    (on the H200 it held one at 0.76-0.91 of its unlimited throughput)."""
    util = tmp_path / "nvml_util"
    util.write_text("999999 60 5000\n")  # busy 5 s ago, nothing since
    r = shim.run("direct", "init", f"run:0.4:{KERNEL_US}:k", f"run:1.2:{KERNEL_US}:k", CUDA_DEVICE_SM_LIMIT="30",
                 GPU_CORE_UTILIZATION_POLICY="default", FAKE_NVML_UTIL=str(util))
    assert share(r.find("run")[-1], bare) > 0.85, r.stderr[-2000:]


@pytest.mark.parametrize("queue_ms", ["20", "1000"])  # the driver's queue holds about a second of GEMMs
def test_a_light_stretch_leaves_a_bounded_burst(shim, bare, queue_ms):
    """The burst credit (up to 500 ms of GPU time), earned while the process keeps launching under its limit:
    after 1.5 s at a tenth of the GPU (300 ms earned at a 30 % limit), a process runs a burst of 0.2 s of
    kernels unheld, and a long run afterwards gets the limit plus only what is left of the credit (spent,
    never more): 2 s at 30 % with at most 300 - 140 ms left reads at most 38 % (36.7 seen with a short
    driver queue, 32.2 with a deep one, whose burst queued more); with the burst not taken off the credit it
    would read 45."""
    r = shim.run("direct", "init", f"run:0.4:{KERNEL_US}:k", f"pace:1.5:{KERNEL_US}:3600",
                 f"run:0.2:{KERNEL_US}:k", f"run:2.0:{KERNEL_US}:k", CUDA_DEVICE_SM_LIMIT="30",
                 GPU_CORE_UTILIZATION_POLICY="force", FAKE_QUEUE_MS=queue_ms)
    runs = r.find("run")
    assert share(runs[1], bare) > 0.8, (runs, r.stderr[-2000:])
    assert 0.28 <= share(runs[2], bare) <= 0.30 + 0.16 / 2 + 0.03, runs


def test_a_pause_leaves_only_the_idle_credit(shim, bare):
    """A pause (no launch for 50 ms or more) earns no more than 50 ms of credit, however long: a measurement
    that starts after a pause reads the limit, not the limit plus the whole credit. 0.2 s of kernels after
    a 1 s pause at 30 %: (60 + 50) ms of GPU time in 200 ms, 55 %, not the 100 % a full credit would allow."""
    r = shim.run("direct", "init", f"run:0.4:{KERNEL_US}:k", "sleep:1000", f"run:0.2:{KERNEL_US}:k",
                 f"run:1.0:{KERNEL_US}:k", CUDA_DEVICE_SM_LIMIT="30", GPU_CORE_UTILIZATION_POLICY="force")
    runs = r.find("run")
    assert 0.42 <= share(runs[1], bare) <= 0.68, (runs, r.stderr[-2000:])
    assert abs(share(runs[2], bare) - 0.30) <= 0.05, runs


def test_the_credit_never_exceeds_its_bound(shim, bare):
    """However long the light stretch, the credit is 500 ms of GPU time: a 3 s run after 4 s at a tenth of
    the GPU (800 ms of unused share) at a 30 % limit reads at most 30 + 50/3 points (46.7; the whole 800 ms
    would read 56.7): any window of 10 s or more within 5 points of the limit."""
    r = shim.run("direct", "init", f"run:0.4:{KERNEL_US}:k", f"pace:4.0:{KERNEL_US}:3600",
                 f"run:3.0:{KERNEL_US}:k", CUDA_DEVICE_SM_LIMIT="30", GPU_CORE_UTILIZATION_POLICY="force")
    s = share(r.find("run")[-1], bare)
    assert 0.40 <= s <= 0.30 + 0.50 / 3 + 0.03, (s, r.stderr[-2000:])


# ---- the measured-busy feedback (k_all): the device's busy time, not the process's own samples ----

@pytest.mark.parametrize("device_samples", [True, False], ids=["device-samples", "no-device-samples"])
def test_charges_follow_the_devices_measured_busy_time(shim, bare, tmp_path, device_samples):
    """Kernel times that read half what the GPU really spent (events misled: clocks, shapes measured rarely)
    are corrected by NVML's device utilization samples while the process runs alone: at a 30 % limit the GPU
    is busy 30 % of the time, not 60. Where NVML has no device samples the feedback is off and says so: the
    charge is the measured times alone (60 %)."""
    util = tmp_path / "nvml_util"
    util.write_text("")  # per-process samples: nobody else busy
    env = dict(CUDA_DEVICE_SM_LIMIT="30", GPU_CORE_UTILIZATION_POLICY="force", FAKE_EVENT_SCALE="0.5",
               FAKE_NVML_UTIL=str(util))
    if not device_samples:
        env["FAKE_NVML_NO_SAMPLES"] = "1"
    r = shim.run("direct", "init", f"run:3.0:{KERNEL_US}:k", f"run:2.0:{KERNEL_US}:k", HAMID_SHIM_LOG_LEVEL="3", **env)
    s = share(r.find("run")[-1], bare)
    if device_samples:
        assert abs(s - 0.30) <= 0.06, (s, r.stderr[-3000:])
    else:
        assert abs(s - 0.60) <= 0.08, (s, r.stderr[-3000:])
        assert "no device utilization samples" in r.stderr


def test_a_warm_up_with_idle_periods_does_not_inflate_the_charge(shim, bare, tmp_path):
    """NVML reports a process only for the sample periods it was busy. A warm-up that runs 0.3 s and then
    waits (how every workload starts) must not teach the limiter that the whole window was busy: on the
    H200 a GEMM tenant learned 1.43x from such a window and was held to 23 % at a 30 % limit. The run after
    it reads its limit."""
    util = tmp_path / "nvml_util"
    util.write_text("self\n")  # the process's own samples, as NVML gives them: only for its busy periods
    r = shim.run("direct", "init", f"run:0.3:{KERNEL_US}:k", "sleep:900", f"run:0.3:{KERNEL_US}:k", "sleep:900",
                 f"run:2.0:{KERNEL_US}:k", CUDA_DEVICE_SM_LIMIT="30", GPU_CORE_UTILIZATION_POLICY="force",
                 FAKE_NVML_UTIL=str(util), HAMID_SHIM_LOG_LEVEL="3")
    s = share(r.find("run")[-1], bare)
    assert abs(s - 0.30) <= 0.05, (s, r.stderr[-3000:])


def test_the_schedule_follows_a_gpu_that_falls_behind_it(shim, bare):
    """A limited process the GPU serves slower than its schedule (kernel times read half: charged 70 % while
    the GPU would need 140 %; no device samples, so the feedback cannot fix it) must not queue up seconds of
    work behind its limit (the driver's queue holds about a second of GEMMs): its schedule follows the GPU, so
    its synchronize at the end waits for tens of ms, not the whole queue; and it is not held back further than
    the GPU's pace: the GPU stays busy with its work (it asks for 140 %)."""
    r = shim.run("direct", "init", f"run:3.0:{KERNEL_US}:k", CUDA_DEVICE_SM_LIMIT="70",
                 GPU_CORE_UTILIZATION_POLICY="force", FAKE_EVENT_SCALE="0.5", FAKE_NVML_NO_SAMPLES="1",
                 FAKE_QUEUE_MS="1000")
    n, ns = (int(x) for x in r.find("run")[-1][1:3])
    assert ns - 3.0e9 < 0.15e9, (n, ns, r.stderr[-2000:])
    assert n * KERNEL_US * 1e3 / ns > 0.9, (n, ns)
