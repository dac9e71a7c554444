"""``realize`` is pure and gives a Docker container exactly what the old runtime gave it.

``tests/data/old_runtime_edits.json`` was captured from the runtime as it was
before the node core existed (``hamid/runtime/create.py`` turning a
reservation into ``config.json`` edits itself), for a vGPU share, a
compute-limited share with (then) time slots and a priority, a two-GPU share and a
MIG instance, on a fake device tree (the same ``mknod`` layout as
``dockerharness``). Each case's recorded reservation goes through today's
``realize`` with the facts today's daemon writes for the same tree; applied to
the same spec, the result must be the recorded one, plus the limits file
mount that is new.
"""

from __future__ import annotations

import copy
import json
import os
from pathlib import Path

import pytest

from hamid.ledger import Reservation
from hamid.node import devnodes
from hamid.node.layout import LIMITS_IN_CONTAINER
from hamid.node.realize import RealizeError, realize
from hamid.docker import spec as ocispec
from nodeharness import make_node

GOLDEN = json.loads((Path(__file__).parent / "data" / "old_runtime_edits.json").read_text())

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="mknod needs root")


def _tree(root: Path) -> tuple[Path, Path]:
    dev, caps = root / "dev", root / "caps"
    (dev / "nvidia-caps").mkdir(parents=True)

    def mk(p, maj, mi):
        os.mknod(p, 0o644 | 0o020000, os.makedev(maj, mi))
        os.chmod(p, 0o644)  # whatever the umask (the daemon's prepare() tightens it)

    for i in range(2):
        mk(dev / f"nvidia{i}", 195, i)
    mk(dev / "nvidiactl", 195, 255)
    mk(dev / "nvidia-uvm", 235, 0)
    for gpu in range(2):
        for gi in range(1, 9):
            base = caps / f"gpu{gpu}" / "mig" / f"gi{gi}"
            (base / "ci0").mkdir(parents=True)
            m = 100 + gpu * 100 + gi * 10
            (base / "access").write_text(f"DeviceFileMinor: {m}\nDeviceFileMode: 292\n")
            (base / "ci0" / "access").write_text(f"DeviceFileMinor: {m + 1}\nDeviceFileMode: 292\n")
            mk(dev / "nvidia-caps" / f"nvidia-cap{m}", 238, m)
            mk(dev / "nvidia-caps" / f"nvidia-cap{m + 1}", 238, m + 1)
    return dev, caps


@pytest.mark.parametrize("case", sorted(GOLDEN))
def test_realize_gives_what_the_old_runtime_gave(tmp_path, case):
    g = json.loads(json.dumps(GOLDEN[case]).replace("@ROOT@", str(tmp_path)))
    dev, caps = _tree(tmp_path)
    d = make_node(tmp_path / "state", simulate="H100:2", mode=g["mode"], devRoot=str(dev),
                  migCapsRoot=str(caps), node="gold")  # the simulated UUIDs follow the node's name
    try:
        facts = d.core.facts
        old_shim = f"{tmp_path}/state/shim/libvgpu.so.0.2.0"
        res_d = g["reservation"]
        for uuid, inst in res_d["mig"].items():  # what admission records today: the capability nodes too
            minor = facts.gpu_minors[uuid]
            inst["caps"] = [n.to_cdi() for n in devnodes.mig_cap_nodes(str(dev), str(caps), minor, inst["gi"],
                                                                      inst["ci"], required=True)]
        res = Reservation.from_dict(res_d)
        edits = realize(res, facts)
        assert realize(res, facts) == edits  # pure: same input, same output, nothing read in between
        spec = copy.deepcopy(g["before"])
        ocispec.apply_edits(spec, edits)
        spec.setdefault("hooks", {})["poststop"] = g["after"]["hooks"]["poststop"]
        got = json.loads(json.dumps(spec).replace(facts.shim_library or "@none@", old_shim))
        limits = [m for m in got.get("mounts", []) if m["destination"] == LIMITS_IN_CONTAINER]
        got["mounts"] = [m for m in got.get("mounts", []) if m["destination"] != LIMITS_IN_CONTAINER]
        # the one deliberate change since: no time slots (HAMID_SM_SLOTS_<i>), which are not work-conserving
        # (issue 22); the compute limit is the shim's rate limit alone
        want = copy.deepcopy(g["after"])
        want["process"]["env"] = [e for e in want["process"]["env"] if not e.startswith("HAMID_SM_SLOTS_")]
        assert got == want
        if g["mode"] == "mig":
            assert limits == []
        else:
            assert limits == [{"destination": LIMITS_IN_CONTAINER, "type": "bind",
                               "source": f"{tmp_path}/state/limits/{res.uid}",
                               "options": ["rbind", "nosuid", "nodev", "ro"]}]
    finally:
        d.close()


def test_realize_refuses_what_it_cannot_honour(tmp_path):
    d = make_node(tmp_path / "state", simulate="H100:1", mode="mig")
    try:
        res = Reservation.from_dict(json.loads(json.dumps(GOLDEN["mig"]["reservation"]).replace("@ROOT@", "/x")))
        no_instance = Reservation.from_dict({**res.to_dict(), "mig": {}})
        with pytest.raises(RealizeError, match="no MIG instance recorded"):
            realize(no_instance, d.core.facts)
        with pytest.raises(RealizeError, match="has no container 'other'"):
            realize(res, d.core.facts, "other")
    finally:
        d.close()
