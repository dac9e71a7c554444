"""The web view at 100 nodes x 8 GPUs (tests/web/simcluster.py): what its size must not break.

- every asset is the daemon's own and all of them together are under 200 KB;
- the page paints (a first contentful paint) and draws the whole cluster,
  100 nodes and 800 GPUs, in headless Chromium, and its what-if box answers
  over them; how fast is bench/web_paint.py's question (a ratio against one
  node in the same run: a time bound here would fail on a busy machine);
- nobody looking costs nothing: the daemon's CPU time does not move while no
  page is open, before one is opened and after the last one closes (the
  watcher stops with the last stream).
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from browserharness import launch, no_errors, open_page

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "gossip"))
from gossipharness import free_port  # noqa: E402

pytestmark = pytest.mark.slow

SIM = Path(__file__).resolve().parent / "simcluster.py"
ASSET_BUDGET = 200 * 1024
IDLE_TICKS = 3  # CPU clock ticks (10 ms each) an idle face may use in IDLE_S: timer noise, not work
IDLE_S = 3.0


def _cpu_ticks(pid: int) -> int:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])  # utime + stime


@pytest.fixture(scope="module")
def sim(tmp_path_factory):
    port = free_port()
    state = tmp_path_factory.mktemp("sim") / "state"
    proc = subprocess.Popen([sys.executable, str(SIM), str(port), str(state), "100", "8"],
                            stdout=subprocess.PIPE, stderr=open(state.parent / "log", "w"), text=True)
    try:
        seen = []
        for line in proc.stdout:  # the daemon's log lines, then "ready"
            seen.append(line)
            if line.strip() == "ready":
                break
        else:
            raise AssertionError("".join(seen)[-2000:] + (state.parent / "log").read_text()[-2000:])
        yield proc, f"http://127.0.0.1:{port}"
    finally:
        proc.terminate()
        proc.wait(10)


def _idle_ticks(pid: int) -> int:
    before = _cpu_ticks(pid)
    time.sleep(IDLE_S)
    return _cpu_ticks(pid) - before


def test_100_nodes_paint_whole_small_assets_and_no_idle_cost(sim):
    from playwright.sync_api import sync_playwright

    proc, url = sim
    time.sleep(1.0)  # start-up done
    idle = _idle_ticks(proc.pid)
    assert idle <= IDLE_TICKS, f"the daemon used {idle} ticks in {IDLE_S} s with nobody looking"

    sizes = {p: len(httpx.get(url + p, timeout=10).content)
             for p in ("/", "/static/app.js", "/static/app.css", "/login")}
    assert sum(sizes.values()) < ASSET_BUDGET, sizes

    with sync_playwright() as p:
        browser = launch(p)
        page = open_page(browser, url + "/", viewport={"width": 1280, "height": 900})
        timing = page.evaluate("""() => ({
            rendered: performance.getEntriesByName('hamid-rendered')[0].startTime,
            fcp: (performance.getEntriesByName('first-contentful-paint')[0] || {startTime: null}).startTime,
            resources: performance.getEntriesByType('resource').map(r => r.name)})""")
        assert page.locator("#nodes-count").inner_text() == "(100 nodes, 800 GPUs)"
        assert page.locator(".gpu").count() == 800
        assert timing["fcp"] is not None and timing["rendered"] > 0, timing
        assert all(r.startswith(url + "/") for r in timing["resources"]), timing["resources"]
        print(f"\n100 nodes x 8 GPUs: first contentful paint {timing['fcp']:.0f} ms, "
              f"cluster drawn {timing['rendered']:.0f} ms, assets {sum(sizes.values())} bytes")
        # the what-if box on 100 nodes (a generous wait: an answer, not its speed)
        t0 = time.monotonic()
        page.fill("#whatif-text", "mem=70g,cores=50")
        page.click("#whatif-form button[type=submit]")
        page.wait_for_selector("#whatif-out [data-result='fit']", timeout=60000)
        print(f"what-if on 100 nodes: {time.monotonic() - t0:.2f} s")
        no_errors(page)
        browser.close()

    time.sleep(1.0)  # the stream's end reaches the daemon; its watcher stops
    idle = _idle_ticks(proc.pid)
    assert idle <= IDLE_TICKS, f"the daemon used {idle} ticks in {IDLE_S} s after the last page closed"
