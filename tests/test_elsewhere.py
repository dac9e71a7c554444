"""Where else a refused request fits (hamid.placement.elsewhere): the hint in a refusal."""

from __future__ import annotations

from simnodes import node_view

from hamid.placement.elsewhere import describe, fits_elsewhere, hint
from hamid.placement.usage import with_usage
from hamid.placement import place
from hamid.request import parse_docker_env


def _req(spec: str, name: str = "c1"):
    return parse_docker_env({"HAMI_VGPU_SPEC": spec}, name)


def _book(view, spec: str, n: int = 1):
    decisions = []
    for i in range(n):
        got = place(_req(spec, f"x{i}"), [with_usage(view.name, view.gpus, decisions, view.gpu_policy)])
        decisions.append(got)
    return with_usage(view.name, view.gpus, decisions, view.gpu_policy)


def test_names_fitting_nodes_most_free_first_with_free_memory_and_cores():
    full = _book(node_view("full", "T4"), "mem=15g,cores=100")
    small = node_view("small", "T4")  # 15 GiB, too small for 20g
    half = _book(node_view("half", "A100-SXM4-80GB"), "mem=40g,cores=50")
    idle = node_view("idle", "A100-SXM4-80GB:2")
    big = node_view("big", "H100-80GB-HBM3")
    views = [full, small, half, idle, big]
    fits = fits_elsewhere(_req("mem=20g,cores=30"), views, exclude=["full"])
    assert [f.node for f in fits] == ["idle", "big", "half"]
    assert (fits[0].free_mib, fits[0].free_cores) == (2 * 81920, 200)
    assert (fits[2].free_mib, fits[2].free_cores) == (81920 - 40960, 50)
    line = describe(fits, 4)
    assert line.startswith("it fits now on: idle (160 GiB, 200% cores free), big (")
    assert "half (40 GiB, 50% cores free)" in line


def test_top_three_only_and_nothing_when_nothing_fits():
    views = [node_view(f"n{i}", "T4") for i in range(5)]
    assert len(fits_elsewhere(_req("mem=1g"), views)) == 3
    assert fits_elsewhere(_req("mem=40g"), views) == []
    assert hint(_req("mem=40g"), views, exclude=["n0"]) == \
        "it fits on none of the 4 other node(s) of the gossiped view now"
    assert hint(_req("mem=1g"), [views[0]], exclude=["n0"]) == \
        "no other node is in this node's gossiped view to suggest"


def test_without_exclusion_the_nodes_are_not_called_other():
    views = [node_view(f"n{i}", "T4") for i in range(3)]
    assert hint(_req("mem=40g"), views) == "it fits on none of the 3 node(s) of the gossiped view now"
    assert hint(_req("mem=1g"), views).startswith("it fits now on: n0 (15 GiB, 100% cores free), n1 (")
