"""The web view in a real browser, against real daemons gossiping on simulated GPUs.

Three ``hamid run`` daemons (an H100 node serving the page, a T4 node, an
A100 node in MIG mode) gossip on loopback; headless Chromium (Debian's,
driven by Playwright) opens node a's page. The page must list what
``hamid status --cluster`` lists, follow a change within 2 s without a
reload, draw MIG instances on their slices, answer the what-if box as
``hamid plan --live`` does, log no console error and pass axe-core's WCAG
A/AA rules in light and dark. The screenshots in docs/web/ are taken here.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "gossip"))
from browserharness import axe_source, axe_violations, launch, no_errors, open_page, screenshot  # noqa: E402
from gossipharness import FAST, HAMID, Node, free_port, start_all, wait_until  # noqa: E402

from hamid.localapi.client import LocalClient  # noqa: E402
from hamid.request import parse_docker_env  # noqa: E402

pytestmark = pytest.mark.slow


def _reserve(node: Node, name: str, spec: str) -> dict:
    req = parse_docker_env({"HAMI_VGPU_SPEC": spec}, name)
    with LocalClient(node.state) as cl:
        return cl.reserve(req.to_dict(), "docker")


def _cli(*args: str) -> dict | list:
    r = subprocess.run([*HAMID, *args, "-o", "json"], capture_output=True, text=True, timeout=60)
    assert r.returncode in (0, 1), r.stderr
    return json.loads(r.stdout)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    root = tmp_path_factory.mktemp("web")
    web_port = free_port()

    def peer() -> dict:  # the peer API, through which a's page asks b and c for their tenants
        return {"peerListen": f"127.0.0.1:{free_port()}", "peerInsecure": True}
    a = Node(root, "a", simulate="H100-80GB-HBM3:2", config={**FAST, **peer(), "webListen": f"127.0.0.1:{web_port}"})
    b = Node(root, "b", simulate="T4", join=(a.addr,), config={**FAST, **peer()})
    c = Node(root, "c", simulate="A100-SXM4-40GB", join=(a.addr,), config={**FAST, **peer(), "operatingMode": "mig"})
    nodes = start_all([a, b, c])
    try:
        everyone = {"a", "b", "c"}
        wait_until(lambda: {n for n, m in a.members().items() if m["state"] == "alive" and m["capacity"]}
                   == everyone, 30, "a to see every member with its capacity")
        _reserve(a, "trainer", "mem=20g,cores=40")  # a tenant on the page's own node
        _reserve(b, "infer", "mem=4g,cores=30")
        _reserve(c, "mig-job", "1g.5gb")
        wait_until(lambda: sum(g["use"][0] for g in a.members()["b"]["capacity"]["gpus"]) == 4096
                   and a.members()["c"]["capacity"]["gpus"][0]["use"][4], 15, "a to see b's and c's tenants")
        yield {"a": a, "b": b, "c": c, "url": f"http://127.0.0.1:{web_port}/", "root": root}
    finally:
        for n in nodes:
            n.stop()


@pytest.fixture(scope="module")
def browser():
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = launch(p)
        yield b
        b.close()


@pytest.fixture(scope="module")
def axe(tmp_path_factory):
    return axe_source(tmp_path_factory.mktemp("axe"))


def _page_members(page) -> dict:
    return page.evaluate("""() => Object.fromEntries([...document.querySelectorAll('details.node')].map(d => [
        d.dataset.node, {state: d.dataset.state, gpus: [...d.querySelectorAll('.gpu')].map(g => ({
            uuid: g.dataset.gpu, index: Number(g.dataset.index), used: Number(g.dataset.memUsed),
            total: Number(g.dataset.memTotal), cores: Number(g.dataset.coresUsed),
            model: g.querySelector('.model').textContent}))}]))""")


def test_the_page_lists_what_status_cluster_lists_and_follows_changes(cluster, browser, axe):
    a = cluster["a"]
    page = open_page(browser, cluster["url"], viewport={"width": 1280, "height": 900}, color_scheme="light")
    st = _cli("status", "--state-dir", str(a.state), "--cluster")
    shown = _page_members(page)
    assert set(shown) == {m["name"] for m in st["members"]}
    for m in st["members"]:
        assert shown[m["name"]]["state"] == m["state"]
        want = [{"uuid": g["uuid"], "index": g["index"], "used": g["memory_used_mib"], "total": g["memory_total_mib"],
                 "cores": g["cores_used"], "model": g["name"]} for g in m["gpus"]]
        assert shown[m["name"]]["gpus"] == want, m["name"]
    # MIG: c's instance drawn on the GPU's slices, at its placement
    slices = page.locator("details[data-node='c'] .slices")
    assert slices.get_attribute("data-slices") == "8"
    used = slices.locator("span.used")
    assert used.count() == 1 and used.get_attribute("title").startswith("1g.5gb at ")
    inst = a.members()["c"]["capacity"]["gpus"][0]["use"][4][0]  # [profile, start, size]
    assert page.locator("details[data-node='c'] .mig-list").inner_text() == f"1g.5gb at slice {inst[1]}"
    assert "1/8 memory slices" in page.locator("details[data-node='c'] .gpu").inner_text()
    # tenants: this node's and, through the peer API, b's and c's: node, asked and given
    row = page.locator("#tenants tr[data-name='trainer']")
    assert "20480 MiB" in row.inner_text() and "40% cores" in row.inner_text()
    page.wait_for_selector("#tenants tr[data-name='mig-job']", timeout=5000)
    cells = page.locator("#tenants tr[data-name='infer'] td").all_inner_texts()
    assert cells[0] == "b" and cells[2] == "infer" and "4096 MiB, 30% cores" in cells[5]
    cells = page.locator("#tenants tr[data-name='mig-job'] td").all_inner_texts()
    assert cells[0] == "c" and "MIG 1g.5gb" in cells[5] and "MIG 1g.5gb at" in cells[6]
    assert page.locator("#tenants-unknown").count() == 0
    # health: gossip members and the leader (none outside Kubernetes)
    assert page.locator("#members-by-state").inner_text() == "3 alive"
    assert "outside Kubernetes" in page.locator("#leader-card").inner_text()

    # a change on b reaches the open page without a reload (the page has no polling: only its event stream
    # can bring it; how soon is printed, not bounded: a busy machine delays it)
    before = int(page.locator("details[data-node='b'] .gpu").get_attribute("data-mem-used"))
    page.evaluate("window.hamidSameLoad = true")
    t0 = time.monotonic()
    _reserve(cluster["b"], "infer-2", "mem=2g")
    page.wait_for_function("() => document.querySelector(\"details[data-node='b'] .gpu\").dataset.memUsed == "
                           f"'{before + 2048}'", timeout=30000)
    print(f"the page showed b's new tenant after {time.monotonic() - t0:.2f} s")
    assert page.evaluate("window.hamidSameLoad") is True, "the page was reloaded"
    page.wait_for_selector("#tenants tr[data-name='infer-2']", timeout=30000)  # asked of b once its document moved

    assert axe_violations(page, axe) == []
    screenshot(page, "overview-light.png")
    no_errors(page)
    page.context.close()

    dark = open_page(browser, cluster["url"], viewport={"width": 1280, "height": 900}, color_scheme="dark")
    assert axe_violations(dark, axe) == []
    screenshot(dark, "overview-dark.png")
    no_errors(dark)
    dark.context.close()

    phone = open_page(browser, cluster["url"], viewport={"width": 390, "height": 844}, is_mobile=True,
                      has_touch=True, color_scheme="dark")
    # usable on a phone: nothing wider than the screen but the tenants table, which scrolls in its box
    wide = phone.evaluate("() => document.documentElement.scrollWidth")
    assert wide <= 390, f"the page is {wide}px wide on a 390px phone"
    assert axe_violations(phone, axe) == []
    screenshot(phone, "phone-dark.png")
    no_errors(phone)
    phone.context.close()


def test_filter_narrows_nodes_and_tenants_and_mig_is_shown_as_mig(cluster, browser):
    page = open_page(browser, cluster["url"], viewport={"width": 1280, "height": 900})
    page.wait_for_selector("#tenants tr[data-name='mig-job']", timeout=5000)
    assert page.locator("#nodes-count").inner_text() == "(3 nodes, 4 GPUs)"
    # a MIG GPU's compute is its instances' slices, not a cores figure nothing books
    card = page.locator("details[data-node='c'] .gpu").inner_text()
    assert "% booked" not in card and "1/7 compute slices booked" in card, card
    # a MIG tenant's ask says it asked for MIG mode
    asked = page.locator("#tenants tr[data-name='mig-job'] td").all_inner_texts()[5]
    assert "mode=mig" in asked and "MIG 1g.5gb" in asked, asked
    assert "mode=" not in page.locator("#tenants tr[data-name='trainer'] td").all_inner_texts()[5]

    # the filter narrows the node count and the tenants table to the nodes it shows
    page.fill("#node-filter", "T4")
    page.wait_for_function("() => document.getElementById('nodes-count').textContent.includes('of 3')")
    assert page.locator("#nodes-count").inner_text() == "(1 of 3 nodes shown, 1 GPU)"
    assert page.locator("details.node").evaluate_all("els => els.map(e => e.dataset.node)") == ["b"]
    nodes = page.locator("#tenants tbody tr td:first-child").all_inner_texts()
    assert nodes and set(nodes) == {"b"}, nodes
    assert "filtered by node" in page.locator("#tenants-count").inner_text()
    page.fill("#node-filter", "no-such-node")
    page.wait_for_selector("#no-tenants")
    assert page.locator("#nodes-count").inner_text() == "(0 of 3 nodes shown, 0 GPUs)"
    page.fill("#node-filter", "")
    page.wait_for_function("() => document.getElementById('nodes-count').textContent === '(3 nodes, 4 GPUs)'")
    assert {"a", "b", "c"} <= set(page.locator("#tenants tbody tr td:first-child").all_inner_texts())
    no_errors(page)
    page.context.close()


def test_the_what_if_box_agrees_with_hamid_plan_live(cluster, browser, axe):
    a, root = cluster["a"], cluster["root"]
    page = open_page(browser, cluster["url"] + "#whatif", viewport={"width": 1280, "height": 900})
    cases = {
        "mem=30g,cores=30": "kind: Docker\nname: what-if\nenv: {HAMI_VGPU_SPEC: 'mem=30g,cores=30'}\n",
        "mem=10g": "kind: Docker\nname: what-if\nenv: {HAMI_VGPU_SPEC: 'mem=10g'}\n",
    }
    pod = ("apiVersion: v1\nkind: Pod\nmetadata: {name: huge, namespace: ml}\nspec:\n  containers:\n"
           "  - name: main\n    image: x\n    resources:\n      limits: {nvidia.com/gpu: 1, nvidia.com/gpumem: 100000}\n")
    cases[pod] = pod
    for text, workload in cases.items():
        wl = root / "wl.yaml"
        wl.write_text(workload)
        (want,) = _cli("plan", "--live", "--state-dir", str(a.state), "--workload", str(wl))
        page.fill("#whatif-text", text)
        page.evaluate("() => { document.getElementById('whatif-out').innerHTML = ''; }")
        page.click("#whatif-form button[type=submit]")
        page.wait_for_selector("#whatif-out [data-result]")
        got = page.locator("#whatif-out [data-result]").first
        if "error" in want:
            assert got.get_attribute("data-result") == "nofit"
            shown = set(got.locator("li").evaluate_all("els => els.map(e => e.dataset.node)"))
            assert shown == set(want["reasons"]), text
        else:
            assert got.get_attribute("data-result") == "fit"
            assert got.get_attribute("data-node") == want["node"], text
            dev = want["containers"][0]["devices"][0]
            assert f"GPU {dev['index']}: {dev['mem_mib']} MiB" in got.inner_text()
    # a bad value is refused with the reason, not a traceback
    page.fill("#whatif-text", "mem=lots")
    page.click("#whatif-form button[type=submit]")
    page.wait_for_selector("#whatif-out [data-result='error']")
    assert "mem" in page.locator("#whatif-out").inner_text()
    page.fill("#whatif-text", "mem=30g,cores=30")
    page.click("#whatif-form button[type=submit]")
    page.wait_for_selector("#whatif-out [data-result='fit']")
    assert axe_violations(page, axe) == []
    page.locator("#whatif").scroll_into_view_if_needed()
    screenshot(page, "whatif.png")
    no_errors(page)
    page.context.close()
