"""Property tests: random clusters and workloads never break the invariants.

Whatever the engine decides, applied in order: no GPU goes over its memory
(after scaling), cores or split count; MIG instances never overlap and are
valid for the model; filters and exclusivity hold; binpack and spread pick the
GPU the documented score says; and the ledger's re-check accepts every
decision the engine makes.
"""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from simnodes import node_view

from hamid.placement import Decision, check, place
from hamid.placement.fit import Use, score, try_gpu
from hamid.placement.usage import with_usage
from hamid.placement.view import MODE_MIG
from hamid.request.model import ContainerRequest, GpuRequest, Request

MODELS = ["T4", "H100-80GB-HBM3", "A100-SXM4-40GB", "A30", "H200-141GB", "A100-SXM4-80GB"]
PROFILES = ["1g.10gb", "1g.5gb", "2g.20gb", "3g.40gb", "1g.6gb", "2g.12gb", "4g.24gb", "7g.80gb", "1g.10gb+me"]


@st.composite
def clusters(draw):
    nodes = []
    for i in range(draw(st.integers(1, 4))):
        models = draw(st.lists(st.sampled_from(MODELS), min_size=1, max_size=6))
        n_gpus = len(models)
        settings_ = dict(
            deviceSplitCount=draw(st.integers(1, 6)),
            deviceMemoryScaling=draw(st.sampled_from([0.5, 1.0, 1.5, 2.0])),
            deviceCoreScaling=draw(st.sampled_from([1.0, 2.0])),
            operatingMode=draw(st.sampled_from(["hami-core", "mig"])),
            gpuSchedulerPolicy=draw(st.sampled_from(["spread", "binpack"])),
            filterDevices={"index": draw(st.lists(st.integers(0, n_gpus - 1), max_size=1))},
        )
        nodes.append(node_view(f"node-{i}", ",".join(models), **settings_))
    return nodes


@st.composite
def gpu_requests(draw, names):
    mig = draw(st.integers(0, 3))
    profile = draw(st.sampled_from(PROFILES)) if mig == 0 else None
    mode = "mig" if profile or mig == 1 else draw(st.sampled_from([None, "hami-core"]))
    if draw(st.booleans()):
        mem_mib, pct = draw(st.integers(256, 50000)), None
    else:
        mem_mib, pct = None, draw(st.integers(1, 100))
    return GpuRequest(
        count=draw(st.integers(1, 3)), mem_mib=mem_mib, mem_percent=pct,
        cores=0 if mode == "mig" else draw(st.sampled_from([0, 10, 30, 50, 100])),
        mig_profile=profile, mode=mode,
        use_types=tuple(draw(st.lists(st.sampled_from(["H100", "a100", "T4"]), max_size=1))),
        nouse_types=tuple(draw(st.lists(st.sampled_from(["H200", "a30"]), max_size=1))),
        nouse_uuids=tuple(draw(st.lists(st.sampled_from(names), max_size=1))) if names else (),
        numa_bind=draw(st.booleans()),
    )


@st.composite
def workloads(draw, names):
    out = []
    for i in range(draw(st.integers(1, 14))):
        conts = []
        for j in range(draw(st.integers(1, 3))):
            conts.append(ContainerRequest(f"c{j}", init=(j == 0 and draw(st.booleans())),
                                          gpu=draw(gpu_requests(names))))
        if all(c.init for c in conts):
            conts.append(ContainerRequest("app", gpu=None))
        out.append(Request(owner=f"pod:ns/p{i}", containers=tuple(conts),
                           node_policy=draw(st.sampled_from([None, "binpack", "spread"]))))
    return out


@st.composite
def scenario(draw):
    nodes = draw(clusters())
    names = [g.uuid for n in nodes for g in n.gpus]
    return nodes, draw(workloads(names))


def _bare(n):
    return [g.with_use(0, 0, 0, False, ()) for g in n.gpus]


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenario())
def test_invariants_hold_for_any_workload(sc):
    nodes, work = sc
    caps = {n.name: _bare(n) for n in nodes}
    decided: dict[str, list[Decision]] = {n.name: [] for n in nodes}
    views = {n.name: n for n in nodes}
    for req in work:
        got = place(req, list(views.values()))
        if not isinstance(got, Decision):
            assert got.reasons and all(got.reasons.values())
            continue
        before = views[got.node]
        assert check(got, before) == [], "the ledger's re-check must accept the engine's own decision"
        by_uuid = {g.uuid: g for g in before.gpus}
        for creq, cass in zip(req.containers, got.containers):
            assert creq.name == cass.name
            if creq.gpu is None:
                assert cass.devices == ()
                continue
            g_req = creq.gpu
            uuids = [d.uuid for d in cass.devices]
            assert len(uuids) == g_req.count and len(set(uuids)) == len(uuids)
            numas = set()
            for d in cass.devices:
                g = by_uuid[d.uuid]
                numas.add(g.numa)
                assert not g.filtered and g.healthy
                if g_req.use_types:
                    assert any(t.lower() in g.name.lower() for t in g_req.use_types)
                assert not any(t.lower() in g.name.lower() for t in g_req.nouse_types)
                assert g.uuid not in g_req.nouse_uuids
                if g_req.wants_mig:
                    assert g.mode == MODE_MIG and d.mig_profile is not None
                if g_req.mig_profile:
                    assert d.mig_profile == g_req.mig_profile
                if g.mode == MODE_MIG:
                    prof = g.profile(d.mig_profile)
                    assert prof is not None and d.mig_placement in prof.placements
                    if g_req.mig_profile is None:
                        want = g_req.mem_mib if g_req.mem_mib is not None else g.mem_total * g_req.mem_percent // 100
                        assert prof.memory_mib >= want and not prof.media_extensions
                else:
                    want = g_req.mem_mib if g_req.mem_mib is not None else g.mem_total * g_req.mem_percent // 100
                    assert d.mem_mib == want and d.cores == g_req.cores
            if g_req.numa_bind:
                assert len(numas) == 1
        decided[got.node].append(got)
        views[got.node] = with_usage(got.node, caps[got.node], decided[got.node], before.gpu_policy)

    for name, view in views.items():
        holders: dict[str, set[str]] = {}
        exclusive: set[str] = set()
        for dec in decided[name]:
            for c in dec.containers:
                for d in c.devices:
                    holders.setdefault(d.uuid, set()).add(dec.containers[0].name + "@" + str(id(dec)))
                    own = next(g for g in caps[name] if g.uuid == d.uuid)  # this GPU's cores, not the node's first
                    if d.cores >= 100 and d.mig_profile is None and own.cores_total == 100:
                        exclusive.add(d.uuid)
        for g in view.gpus:
            assert g.mem_used <= g.mem_total, g
            assert g.cores_used <= g.cores_total, g
            assert g.shares_used <= g.shares_total, g
            if g.uuid in exclusive:
                assert len(holders[g.uuid]) == 1, "an exclusive GPU has exactly one pod on it"
            if g.mode == MODE_MIG:
                spans = sorted(s.placement for s in g.mig_used)
                for a, b in zip(spans, spans[1:]):
                    assert a.start + a.size <= b.start, f"overlap {a} {b}"
                slices = sum(g.profile(s.profile).slices for s in g.mig_used)
                assert slices <= g.compute_slices
                for s in g.mig_used:
                    p = g.profile(s.profile)
                    assert s.placement in p.placements
                    assert sum(1 for t in g.mig_used if t.profile == s.profile) <= p.max_instances


@settings(max_examples=150, deadline=None)
@given(scenario(), st.sampled_from(["spread", "binpack"]), st.integers(256, 20000), st.sampled_from([0, 10, 40]))
def test_gpu_order_follows_the_documented_score(sc, policy, mem, cores):
    nodes, work = sc
    # load the cluster a little, then ask for one shim GPU on the first node
    node = nodes[0]
    cap = _bare(node)
    decs = []
    view = node
    for req in work[:6]:
        got = place(req, [view])
        if isinstance(got, Decision):
            decs.append(got)
            view = with_usage(node.name, cap, decs, node.gpu_policy)
    req = Request("docker:x", (ContainerRequest("main", gpu=GpuRequest(count=1, mem_mib=mem, mem_percent=None,
                                                                         cores=cores, mode="hami-core")),),
                  gpu_policy=policy)
    got = place(req, [view])
    fits = []
    for g in view.gpus:
        u = Use.of(g)
        if not isinstance(try_gpu(req.containers[0].gpu, g, u), str):
            fits.append((score(g, u, mem, cores), g.index))
    if not fits:
        assert not isinstance(got, Decision)
        return
    chosen = got.containers[0].devices[0].index
    chosen_score = next(s for s, i in fits if i == chosen)
    if policy == "binpack":
        assert chosen_score == max(s for s, _ in fits)
    else:
        assert chosen_score == min(s for s, _ in fits)


@settings(max_examples=100, deadline=None)
@given(scenario(), st.integers(256, 100000))
def test_nofit_only_when_no_gpu_has_room(sc, mem):
    """An independent oracle for one shim GPU of ``mem`` MiB and no cores."""
    nodes, _ = sc
    req = Request("docker:x", (ContainerRequest("main", gpu=GpuRequest(count=1, mem_mib=mem, mem_percent=None,
                                                                         cores=0, mode="hami-core")),))
    got = place(req, nodes)
    room = any(g.mode != MODE_MIG and not g.filtered and g.healthy and g.mem_total - g.mem_used >= mem
               and g.shares_used < g.shares_total and not g.exclusive and g.cores_used < g.cores_total
               for n in nodes for g in n.gpus)
    assert isinstance(got, Decision) == room


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenario(), st.sampled_from([None, "mutex", "binpack,numa", "topology-aware", "spread"]))
def test_feasible_agrees_with_fit_node(sc, policy):
    """The extender's fast feasibility check says yes exactly when the engine can place the request,
    on nodes filling up as the workload is placed."""
    from dataclasses import replace

    from hamid.placement.engine import feasible, fit_node

    nodes, work = sc
    caps = {n.name: _bare(n) for n in nodes}
    decided: dict[str, list[Decision]] = {n.name: [] for n in nodes}
    views = {n.name: n for n in nodes}
    for req in work:
        req = replace(req, gpu_policy=policy)
        for v in views.values():
            assert (feasible(req, v) == []) == isinstance(fit_node(req, v), Decision), (req, v.name)
        got = place(req, list(views.values()))
        if isinstance(got, Decision):
            decided[got.node].append(got)
            views[got.node] = with_usage(got.node, caps[got.node], decided[got.node], views[got.node].gpu_policy)


def test_feasible_keeps_the_mutex_rule():
    """A GPU that has a tenant is no candidate under mutex, though its room would fit."""
    from dataclasses import replace

    from hamid.placement.engine import feasible, fit_node
    from hamid.request import parse_docker_env

    n = node_view("n", "H100:1")
    first = place(parse_docker_env({"HAMI_VGPU_SPEC": "mem=1g"}, "a"), [n])
    busy = with_usage("n", _bare(n), [first], n.gpu_policy)
    req = replace(parse_docker_env({"HAMI_VGPU_SPEC": "mem=1g"}, "b"), gpu_policy="mutex")
    assert feasible(replace(req, gpu_policy="spread"), busy) == []
    assert not isinstance(fit_node(req, busy), Decision)
    assert feasible(req, busy) and "mutex" in " ".join(feasible(req, busy))


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenario(), st.integers(1, 5), st.sampled_from(["binpack", "spread"]), st.integers(1, 3))
def test_the_ranked_index_makes_the_engine_s_decisions(sc, copies, policy, block):
    """RankedNodes (nodes kept in placement order, blocks skipped by their summaries) answers what
    place() over the list answers, decision after decision, with nodes updated and removed on the way;
    tiny blocks so that many blocks and skips happen on these small clusters."""
    from dataclasses import replace

    from hamid.placement import ranked

    nodes, work = sc
    nodes = [replace(n, name=f"{n.name}-{k}") for k in range(copies) for n in nodes]
    caps = {n.name: _bare(n) for n in nodes}
    decided: dict[str, list[Decision]] = {n.name: [] for n in nodes}
    views = {n.name: n for n in nodes}
    old, ranked.BLOCK = ranked.BLOCK, block
    try:
        index = {p: ranked.RankedNodes(views.values(), p) for p in ("binpack", "spread")}
        for i, req in enumerate(work):
            want = place(req, list(views.values()), policy)
            got = index[req.node_policy or policy].place(req)
            assert got == want, (i, req)
            if isinstance(got, Decision):
                decided[got.node].append(got)
                views[got.node] = with_usage(got.node, caps[got.node], decided[got.node], views[got.node].gpu_policy)
                for idx in index.values():
                    idx.update(views[got.node])
                if i % 5 == 4 and len(views) > 1:  # a node leaves the cluster
                    del views[got.node]
                    for idx in index.values():
                        idx.remove(got.node)
    finally:
        ranked.BLOCK = old


def test_the_ranked_index_takes_a_request_of_exactly_the_memory_left():
    """The summaries' bounds are inclusive: a GPU with exactly the asked memory free is not skipped,
    nor is a MIG node for a request that names no mode."""
    from hamid.placement.ranked import RankedNodes
    from hamid.request import parse_docker_env

    full = node_view("a", "H100:1")
    mig = node_view("m", "H100:1", operatingMode="mig")
    first = place(parse_docker_env({"HAMI_VGPU_SPEC": "mem=50000m"}, "x"), [full])
    nodes = [with_usage("a", _bare(full), [first], full.gpu_policy), mig]
    for spec in ("mem=81559m", f"mem={full.gpus[0].mem_total - 50000}m", "1g.10gb", "mem=10g"):
        req = parse_docker_env({"HAMI_VGPU_SPEC": spec, "HAMI_VISIBLE_DEVICES": "0"}, "y")
        want = place(req, nodes)
        assert RankedNodes(nodes).place(req) == want, spec
    left = full.gpus[0].mem_total - 50000
    req = parse_docker_env({"HAMI_VGPU_SPEC": f"mem={left}m", "HAMI_VISIBLE_DEVICES": "0"}, "y")
    assert isinstance(RankedNodes(nodes).place(req), Decision)
