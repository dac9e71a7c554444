"""A Docker-only cluster joined by gossip: the web view follows ``docker run``, and
a refused ``docker run`` says where the same request fits now.

A real dockerd with hamid's runtime (tests/dockerharness.py) on a node with one
T4, serving the web view; two more daemons (an H100 node and an A100 node)
gossip with it. Headless Chromium (Debian's, through Playwright) watches the
page while containers come and go.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "gossip"))
import dockerharness as dh  # noqa: E402
from browserharness import launch, no_errors, open_page  # noqa: E402
from gossipharness import FAST, Node, free_port, start_all, wait_until  # noqa: E402

pytestmark = [pytest.mark.docker, pytest.mark.slow]


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    if os.geteuid() != 0:
        pytest.skip("needs root to run dockerd (CI runs as root)")
    missing = dh.missing_tools()
    if missing:
        pytest.skip(f"missing {', '.join(missing)} (make test installs docker.io, runc, busybox-static)")
    gossip, web = free_port(), free_port()
    e = dh.new_env(simulate="T4:1", mode="hami-core",
                   extra_config={**FAST, "gossipListen": f"127.0.0.1:{gossip}", "webListen": f"127.0.0.1:{web}"})
    e.web_url = f"http://127.0.0.1:{web}/"
    root = tmp_path_factory.mktemp("peers")
    peers = start_all([Node(root, "big", simulate="H100-80GB-HBM3", join=(f"127.0.0.1:{gossip}",)),
                       Node(root, "mid", simulate="A100-SXM4-40GB", join=(f"127.0.0.1:{gossip}",))])
    try:
        wait_until(lambda: {n for n, m in peers[0].members().items() if m["state"] == "alive" and m["capacity"]}
                   == {"docker-node", "big", "mid"}, 30, "the three daemons to see each other")
        yield e
    finally:
        for p in peers:
            p.stop()
        e.stop()


def test_a_container_appears_and_leaves_when_removed_without_a_reload(env):
    """The page follows Docker through its event stream alone (it has no polling): how soon is printed, not
    bounded (a busy machine delays it)."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = launch(p)
        page = open_page(browser, env.web_url)
        assert page.locator("#no-tenants").count() == 1
        page.evaluate("window.hamidSameLoad = true")
        r = env.docker("run", "-d", "--name", "web-tenant", "--runtime=hami", "-e",
                       "HAMI_VGPU_SPEC=mem=4g,cores=30", dh.IMAGE, "sleep", "60")
        t0 = time.monotonic()
        assert r.returncode == 0, r.stderr
        cid = r.stdout.strip()
        row = f"#tenants tr[data-owner='docker:{cid}']"
        page.wait_for_selector(row, timeout=30000)
        print(f"the container showed after {time.monotonic() - t0:.2f} s")
        text = page.locator(row).inner_text()
        assert "web-tenant" in text and "4096 MiB, 30% cores" in text and "docker" in text  # Docker's own name

        env.docker("rm", "-f", cid, check=True)
        t0 = time.monotonic()
        page.wait_for_selector(row, state="detached", timeout=30000)
        print(f"the removed container left the page after {time.monotonic() - t0:.2f} s")
        assert page.evaluate("window.hamidSameLoad") is True, "the page was reloaded"
        no_errors(page)
        browser.close()


def test_a_refused_docker_run_names_where_it_fits_now(env):
    # 20 GiB is more than this node's T4 has; the H100 and A100 nodes have room
    r = env.docker("run", "--rm", "--runtime=hami", "-e", "HAMI_VGPU_SPEC=mem=20g,cores=10", dh.IMAGE, "true")
    assert r.returncode != 0
    assert "it fits now on: big (79.6 GiB, 100% cores free), mid (40 GiB, 100% cores free)" in r.stderr, r.stderr
    assert "on this node:" in r.stderr and "does not fit on docker-node" in r.stderr, r.stderr
    # nothing fits anywhere: it says so instead of naming nodes
    r = env.docker("run", "--rm", "--runtime=hami", "-e", "HAMI_VGPU_SPEC=mem=100g", dh.IMAGE, "true")
    assert r.returncode != 0
    assert "it fits on none of the 2 other node(s) of the gossiped view now" in r.stderr, r.stderr
    assert env.reservations() == []
