"""hamid.shimregion: the cffi reader agrees with the C compiler about the
region's layout, refuses what it cannot read, and the Prometheus collector
exports a live container's usage with HAMi's names and labels."""

from __future__ import annotations

import subprocess

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from hamid.shimregion import RegionError, read_region, register_collector
from hamid.shimregion.reader import _ffi, region_struct_size
from shimharness import SHIM_DIR, finish, wait_ready

FIELDS = [
    ("struct hamid_region", "magic"), ("struct hamid_region", "lock_storage"), ("struct hamid_region", "devices"),
    ("struct hamid_region", "procs"), ("struct hamid_region", "reserved_tail"), ("struct hamid_device", "tat_ns"),
    ("struct hamid_device", "uuid"), ("struct hamid_device", "launches"), ("struct hamid_proc", "used"),
    ("struct hamid_proc", "context"), ("struct hamid_proc", "start_time"),
]


def key(labels: dict[str, str]) -> frozenset:
    return frozenset(labels.items())


def scrape(reg) -> dict:
    out = {}
    for fam in text_string_to_metric_families(generate_latest(reg).decode()):
        for s in fam.samples:
            out[(s.name, key(s.labels))] = s.value
    return out


def test_cffi_layout_matches_the_c_compiler(tmp_path):
    src = tmp_path / "layout.c"
    lines = ['#include <stdio.h>', '#include <stddef.h>', '#include "hamid_region.h"', "int main(void){"]
    lines.append('printf("%zu %zu %zu\\n", sizeof(struct hamid_region), sizeof(struct hamid_device), sizeof(struct hamid_proc));')
    for st, f in FIELDS:
        lines.append(f'printf("%zu\\n", offsetof({st}, {f}));')
    lines.append("return 0;}")
    src.write_text("\n".join(lines))
    subprocess.run(["gcc", f"-I{SHIM_DIR / 'include'}", "-o", str(tmp_path / "layout"), str(src)], check=True)
    out = subprocess.run([str(tmp_path / "layout")], capture_output=True, text=True, check=True).stdout.split()
    ffi = _ffi()
    assert [int(x) for x in out[:3]] == [region_struct_size(), ffi.sizeof("struct hamid_device"), ffi.sizeof("struct hamid_proc")]
    assert [int(x) for x in out[3:]] == [ffi.offsetof(st, f) for st, f in FIELDS]


def test_reader_refuses_what_it_cannot_read(tmp_path):
    with pytest.raises(RegionError, match="No such file"):
        read_region(tmp_path / "missing.cache")
    small = tmp_path / "small.cache"
    small.write_bytes(b"\0" * 100)
    with pytest.raises(RegionError, match="bytes, a region needs"):
        read_region(small)
    zero = tmp_path / "zero.cache"
    zero.write_bytes(b"\0" * region_struct_size())
    with pytest.raises(RegionError, match="bad magic"):
        read_region(zero)


def test_reader_and_collector_on_a_live_container(built, tmp_path):
    from shimharness import Shim
    ctr = tmp_path / "containers" / "pod-1234_web"
    ctr.mkdir(parents=True)
    s = Shim(built, tmp_path)
    env = dict(CUDA_DEVICE_MEMORY_LIMIT="2g", CUDA_DEVICE_SM_LIMIT="40",
               CUDA_DEVICE_MEMORY_SHARED_CACHE=str(ctr / "vgpu.cache"))
    procs = [s.spawn("procaddr", "init", f"alloc:mem:{m}m", "wait", **env) for m in (100, 300)]
    for p in procs:
        wait_ready(p)
    snap = read_region(ctr / "vgpu.cache")
    by_pid = {p.pid: p for p in snap.processes}
    assert set(by_pid) == {p.pid for p in procs}
    ctx = 40 << 20
    assert by_pid[procs[0].pid].used_bytes == {0: (100 << 20) + ctx}
    assert by_pid[procs[1].pid].context_bytes == {0: ctx}
    d0 = snap.device(0)
    assert d0.used_bytes == (400 << 20) + 2 * ctx and d0.limit_bytes == 2 << 30 and d0.sm_limit_percent == 40
    assert d0.uuid.startswith("GPU-")

    reg = CollectorRegistry()
    col = register_collector(reg, tmp_path / "containers")
    samples = scrape(reg)
    lbl = dict(namespace="", pod="pod-1234", container="web", vdevice_index="0", device_uuid=d0.uuid)
    hl = dict(lbl, zone="vGPU")  # HAMi's series carry its zone label
    assert samples[("hami_vgpu_memory_used_bytes", key(hl))] == d0.used_bytes
    assert samples[("hami_container_device_memory_bytes", key(hl))] == d0.used_bytes
    assert samples[("hami_vgpu_memory_limit_bytes", key(hl))] == 2 << 30
    assert samples[("hami_vgpu_memory_context_bytes", key(hl))] == 2 * ctx
    assert samples[("hami_vgpu_memory_buffer_bytes", key(hl))] == 400 << 20
    assert samples[("hami_vgpu_memory_module_bytes", key(hl))] == 0
    assert samples[("hamid_vgpu_core_limit_ratio", key(lbl))] == 0.4
    # no pid namespace here: NVML's pid (nvml_pid) is the process's own
    assert all(by_pid[p.pid].nvml_pid == p.pid for p in procs)
    pl = dict(lbl, pid=str(procs[1].pid))
    assert samples[("hamid_vgpu_process_memory_used_bytes", key(pl))] == (300 << 20) + ctx
    for p in procs:
        finish(p)
    assert read_region(ctr / "vgpu.cache").device(0).used_bytes == 0
    (ctr / "junk.cache").write_bytes(b"x")
    generate_latest(reg)
    assert col.read_errors == 1


def test_utilization_ratio_is_the_containers_share_of_gpu_time(built, tmp_path):
    """hami_container_device_utilization_ratio: the GPU time the shim accounted between two scrapes over the
    time between them (issue 22, point 5), in percent as HAMi's series is (issue 26); a container at 40 % (force)
    on the stand-in GPU shows about 40."""
    import time

    from shimharness import Shim
    ctr = tmp_path / "containers" / "pod-77_train"
    ctr.mkdir(parents=True)
    p = Shim(built, tmp_path).spawn("direct", "init", "wait", "run:2.5:400:k", CUDA_DEVICE_SM_LIMIT="40",
                                    GPU_CORE_UTILIZATION_POLICY="force",
                                    CUDA_DEVICE_MEMORY_SHARED_CACHE=str(ctr / "vgpu.cache"))
    wait_ready(p)
    reg = CollectorRegistry()
    register_collector(reg, tmp_path / "containers")
    p.stdin.write("go\n")
    p.stdin.flush()
    time.sleep(0.5)
    first = scrape(reg)
    assert not any(name == "hami_container_device_utilization_ratio" for name, _ in first)  # no interval yet
    time.sleep(1.2)
    second = scrape(reg)
    p.communicate(timeout=30)
    got = {dict(lbl)["vdevice_index"]: v for (name, lbl), v in second.items()
           if name == "hami_container_device_utilization_ratio"}
    assert abs(got.pop("0") - 40) <= 8, got
    assert all(v == 0 for v in got.values()), got  # the stand-in's other device: nothing ran there
