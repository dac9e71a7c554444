"""A container owns its region directory, and the daemon reads it as root.

What sits there (a FIFO, a symbolic link, a device node, a hard link, a file
of another user, a huge file, thousands of files) must neither hang a scrape,
nor make root open something outside the directory, nor starve the local
API's threads; such files are skipped and counted, real regions still export.
"""

from __future__ import annotations

import os
import stat
import sys
import threading
import time
from pathlib import Path

import anyio
import httpx
import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from hamid.metrics import exporter
from hamid.shimregion import collector as collector_mod
from hamid.shimregion import read_region, register_collector
from hamid.shimregion.reader import RegionError, _consts, _ffi, region_struct_size

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from test_daemon import start, stop  # noqa: E402

from hamid.localapi.client import LocalClient  # noqa: E402

CTR_UID = 4321  # the container's user, as the runtime chowns its directory


def make_region(path: Path, limit_bytes: int, uuid: str = "GPU-test") -> None:
    """A valid region file as the shim would leave it (one device)."""
    ffi, c = _ffi(), _consts()
    buf = bytearray(region_struct_size())
    r = ffi.from_buffer("struct hamid_region *", buf)
    r.magic = c["HAMID_REGION_MAGIC"]
    r.abi_version = c["HAMID_REGION_ABI_VERSION"]
    r.struct_size = region_struct_size()
    r.device_count = 1
    r.devices[0].flags = 1
    r.devices[0].limit_bytes = limit_bytes
    r.devices[0].uuid = uuid.encode()
    ffi.release(r)
    path.write_bytes(bytes(buf))


def limits(text: str) -> dict[str, float]:
    out = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if s.name == "hami_vgpu_memory_limit_bytes":
                out[s.labels["pod"]] = s.value
    return out


def refusals(text: str) -> dict[str, float]:
    return {s.labels["reason"]: s.value for fam in text_string_to_metric_families(text)
            for s in fam.samples if s.name == "hamid_vgpu_region_refusals_total"}


def scrape_within(reg: CollectorRegistry, seconds: float) -> str:
    """generate_latest in a thread that may hang (today it does on a FIFO)."""
    out: list[str] = []
    t = threading.Thread(target=lambda: out.append(generate_latest(reg).decode()), daemon=True)
    t.start()
    t.join(seconds)
    assert not t.is_alive(), f"the scrape did not finish within {seconds} s"
    return out[0]


@pytest.fixture
def containers(tmp_path) -> Path:
    root = tmp_path / "containers"
    root.mkdir(mode=0o755)
    return root


def ctr_dir(root: Path, name: str, uid: int = CTR_UID) -> Path:
    d = root / name
    d.mkdir(mode=0o700)
    os.chown(d, uid, uid)
    return d


def test_a_fifo_named_cache_neither_hangs_the_scrape_nor_hides_the_others(containers):
    good = ctr_dir(containers, "good")
    make_region(good / "vgpu.cache", 1 << 30)
    os.chown(good / "vgpu.cache", CTR_UID, CTR_UID)
    bad = ctr_dir(containers, "bad")
    os.mkfifo(bad / "vgpu.cache")
    os.chown(bad / "vgpu.cache", CTR_UID, CTR_UID)
    reg = CollectorRegistry()
    col = register_collector(reg, containers)
    text = scrape_within(reg, 5)
    assert limits(text) == {"good": 1 << 30}
    assert refusals(text) == {"type": 1}
    assert col.read_errors == 1


def test_a_symlink_is_not_followed_even_to_a_valid_region(containers, tmp_path):
    outside = tmp_path / "outside.cache"  # stands for any root-owned file the container names
    make_region(outside, 7 << 30)
    d = ctr_dir(containers, "evil")
    (d / "vgpu.cache").symlink_to(outside)
    os.lchown(d / "vgpu.cache", CTR_UID, CTR_UID)
    reg = CollectorRegistry()
    register_collector(reg, containers)
    text = scrape_within(reg, 5)
    assert limits(text) == {}
    assert refusals(text) == {"symlink": 1}
    with pytest.raises(RegionError, match="symbolic link"):
        read_region(d / "vgpu.cache")


def test_only_regular_files_of_the_directory_owner_or_root_are_read(containers, tmp_path):
    d = ctr_dir(containers, "c1")
    make_region(d / "a-own.cache", 1 << 30)
    os.chown(d / "a-own.cache", CTR_UID, CTR_UID)
    make_region(d / "b-root.cache", 2 << 30)  # root's: the daemon's own or an older runtime's
    make_region(d / "c-other.cache", 3 << 30)
    os.chown(d / "c-other.cache", CTR_UID + 1, CTR_UID + 1)  # another container's user
    make_region(tmp_path / "victim", 4 << 30)
    os.link(tmp_path / "victim", d / "d-link.cache")  # a hard link to a file outside
    os.mknod(d / "e-dev.cache", 0o600 | stat.S_IFCHR, os.makedev(1, 3))  # /dev/null's numbers
    with open(d / "f-huge.cache", "wb") as f:
        f.truncate(64 << 20)  # sparse, over the size cap
    os.chown(d / "f-huge.cache", CTR_UID, CTR_UID)
    (d / "g-dir.cache").mkdir()
    reg = CollectorRegistry()
    register_collector(reg, containers)
    text = scrape_within(reg, 5)
    per_file = [s for fam in text_string_to_metric_families(text) for s in fam.samples
                if s.name == "hami_vgpu_memory_limit_bytes"]
    assert sorted(s.value for s in per_file) == [1 << 30, 2 << 30]
    assert refusals(text) == {"owner": 1, "links": 1, "type": 2, "size": 1}


def test_a_directory_that_is_a_symlink_or_has_thousands_of_files_is_bounded(containers, tmp_path):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    make_region(elsewhere / "vgpu.cache", 5 << 30)
    (containers / "linked").symlink_to(elsewhere)  # only root can do this, still not followed
    many = ctr_dir(containers, "many")
    for i in range(50):
        (many / f"{i:03}.cache").write_bytes(b"")
    reg = CollectorRegistry()
    register_collector(reg, containers)
    text = scrape_within(reg, 5)
    assert limits(text) == {}
    r = refusals(text)
    assert r["count"] == 1 and r["unreadable"] == collector_mod.MAX_REGIONS_PER_CONTAINER
    # a budget of 0: nothing is read, the scrape says why
    reg2 = CollectorRegistry()
    register_collector(reg2, containers, budget_s=0.0)
    assert refusals(scrape_within(reg2, 5)).get("budget", 0) >= 1


class Blocking:
    """A collector stuck in a blocking call, as a scrape was on a FIFO."""

    def __init__(self) -> None:
        self.release = threading.Event()

    def collect(self):
        self.release.wait(30)
        return iter(())


async def test_stuck_scrapes_answer_503_and_leave_the_shared_threads_free(monkeypatch):
    monkeypatch.setattr(exporter, "SCRAPE_TIMEOUT_S", 0.3, raising=False)
    reg = CollectorRegistry()
    stuck = Blocking()
    reg.register(stuck)
    app = exporter.metrics_app(reg)
    try:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://m") as client:
            codes: list[int] = []

            async def one():
                with anyio.move_on_after(3):
                    codes.append((await client.get("/metrics")).status_code)

            async with anyio.create_task_group() as tg:
                for _ in range(45):  # more than the shared pool's 40 threads
                    tg.start_soon(one)
            assert codes == [503] * 45
            # the pool the local API uses still runs work at once
            with anyio.fail_after(2):
                assert await anyio.to_thread.run_sync(lambda: 42) == 42
    finally:
        stuck.release.set()


def test_daemon_scrapes_stay_bounded_and_the_api_answers_with_a_fifo_region(tmp_path, free_port):
    state = tmp_path / "state"
    daemon = start(state, free_port, "--simulate", "T4")
    try:
        d = state / "containers" / "c0ffee"
        d.mkdir(parents=True, mode=0o700)
        os.chown(d, CTR_UID, CTR_UID)
        make_region(d / "other.cache", 1 << 30)
        os.chown(d / "other.cache", CTR_UID, CTR_UID)

        def per_scrape(n: int) -> tuple[float, str]:
            t0 = time.monotonic()
            for _ in range(n):
                r = httpx.get(f"http://127.0.0.1:{free_port}/metrics", timeout=30)
                assert r.status_code == 200
            return (time.monotonic() - t0) / n, r.text

        # against scrapes of the same daemon without the FIFO, on the machine as busy as it is now: a read
        # that waited on the FIFO (for a writer that never comes) would cost each scrape its whole timeout
        base, _ = per_scrape(15)
        os.mkfifo(d / "vgpu.cache")
        with_fifo, text = per_scrape(45)
        assert with_fifo < 5 * base + 0.1, (with_fifo, base)
        assert limits(text) == {"c0ffee": 1 << 30}
        assert refusals(text) == {"type": 45}
        with LocalClient(state) as c:
            assert c.status()["gpus"]
    finally:
        err = stop(daemon)
    # logged once, not once per scrape
    assert err.count("region skipped") == 1, err
