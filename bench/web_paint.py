#!/usr/bin/env python3
"""The web view's first paint and first full drawing at 100 nodes x 8 GPUs, against 1 node in the same run.

Starts tests/web/simcluster.py twice (a stand-in cluster document served by one real node's web face: 1 node
and 100 nodes of 8 simulated GPUs), opens the page ``--rounds`` times in each in headless Chromium (Debian's,
through Playwright, as the web tests do), the two sizes in turn, and reports per size the median first
contentful paint and the median time to the page's own 'hamid-rendered' mark, then 100 nodes over 1 node as a
ratio: what the page's size costs, whatever the machine's speed or load. The suite checks that the 100-node
page paints correctly (tests/web/test_web_scale.py); how fast is this bench's question. Also the what-if box
on 100 nodes, against the same box on 1 node.

Target: the 100-node page first paints within 1.5x of the 1-node page, and is drawn within 3x (the ratios a
page whose cost grows with the cluster would miss).
"""

from __future__ import annotations

import argparse
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "web"))
from browserharness import launch, no_errors, open_page  # noqa: E402

SIM = ROOT / "tests" / "web" / "simcluster.py"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def cluster(nodes: int, gpus: int):
    port = free_port()
    with tempfile.TemporaryDirectory() as tmp:
        log = open(Path(tmp) / "log", "w")
        proc = subprocess.Popen([sys.executable, str(SIM), str(port), str(Path(tmp) / "state"), str(nodes),
                                 str(gpus)], stdout=subprocess.PIPE, stderr=log, text=True)
        try:
            for line in proc.stdout:
                if line.strip() == "ready":
                    break
            else:
                raise SystemExit(f"simcluster ({nodes} nodes) did not start: {(Path(tmp) / 'log').read_text()[-2000:]}")
            yield f"http://127.0.0.1:{port}"
        finally:
            proc.terminate()
            proc.wait(10)
            log.close()


def open_once(browser, url: str) -> dict:
    page = open_page(browser, url + "/", viewport={"width": 1280, "height": 900})
    got = page.evaluate("""() => ({
        rendered: performance.getEntriesByName('hamid-rendered')[0].startTime,
        fcp: (performance.getEntriesByName('first-contentful-paint')[0] || {startTime: null}).startTime})""")
    t0 = time.perf_counter()
    page.fill("#whatif-text", "mem=70g,cores=50")
    page.click("#whatif-form button[type=submit]")
    page.wait_for_selector("#whatif-out [data-result]", timeout=60000)
    got["whatif"] = (time.perf_counter() - t0) * 1e3
    no_errors(page)
    page.context.close()
    return got


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--gpus", type=int, default=8)
    args = ap.parse_args()
    from playwright.sync_api import sync_playwright

    sizes = (1, 100)
    got: dict[int, list[dict]] = {n: [] for n in sizes}
    with cluster(sizes[0], args.gpus) as small, cluster(sizes[1], args.gpus) as big, sync_playwright() as p:
        browser = launch(p)
        for url in (small, big):  # a first, unmeasured opening of each: the browser's own start-up
            open_once(browser, url)
        for _ in range(args.rounds):
            for n, url in zip(sizes, (small, big)):
                got[n].append(open_once(browser, url))
        browser.close()
    med = {n: {k: statistics.median(r[k] for r in got[n]) for k in ("fcp", "rendered", "whatif")} for n in sizes}
    print(f"{'nodes':>6} {'first paint ms':>15} {'drawn ms':>9} {'what-if ms':>11}   (medians of {args.rounds})")
    for n in sizes:
        print(f"{n:>6} {med[n]['fcp']:>15.0f} {med[n]['rendered']:>9.0f} {med[n]['whatif']:>11.0f}")
    ratio = {k: med[100][k] / med[1][k] for k in ("fcp", "rendered", "whatif")}
    print(f"100 nodes / 1 node: first paint {ratio['fcp']:.2f}x (target <= 1.5x), drawn {ratio['rendered']:.2f}x "
          f"(target <= 3x), what-if {ratio['whatif']:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
