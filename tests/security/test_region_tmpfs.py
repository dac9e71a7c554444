"""A tenant cannot fill the node's disk through its region directory.

The region directory is the one host directory a container may write. It is
now a 4 MiB tmpfs of its own (nosuid, nodev, noexec), owned by the
container's user, made before the container starts and unmounted before the
directory is removed at release.
"""

from __future__ import annotations

import errno
import os

import pytest

from nodeharness import make_node

from hamid.node import layout, regionfs
from hamid.node.identity import Owner
from hamid.request import parse_docker_env


def test_a_region_directory_is_a_small_tmpfs_of_the_containers_user_and_goes_at_release(tmp_path):
    d = make_node(tmp_path / "s", "H100:1")
    try:
        req = parse_docker_env({"HAMI_VGPU_SPEC": "mem=1g"}, "c0ffee")
        d.core.admit(Owner("docker", "c0ffee"), req, user=(1234, 1234))
        rdir = layout.region_dir(d.state_dir, "c0ffee")
        assert regionfs.is_mounted(rdir)
        st = os.stat(rdir)
        assert (st.st_uid, st.st_gid, st.st_mode & 0o777) == (1234, 1234, 0o700)  # not world-writable
        opts = next(line.split()[5] for line in open("/proc/self/mountinfo") if line.split()[4] == rdir)
        assert {"nosuid", "nodev", "noexec"} <= set(opts.split(","))
        with pytest.raises(OSError) as e, open(os.path.join(rdir, "fill"), "wb") as f:
            for _ in range(64):  # 64 MiB asked; the tmpfs holds 4
                f.write(b"\0" * (1 << 20))
                f.flush()
        assert e.value.errno == errno.ENOSPC
        d.core.release("docker:c0ffee")
        assert not regionfs.is_mounted(rdir) and not os.path.exists(rdir)
    finally:
        d.close()


def test_region_tmpfs_can_be_turned_off(tmp_path):
    d = make_node(tmp_path / "s", "H100:1", regionTmpfs=False)
    try:
        req = parse_docker_env({"HAMI_VGPU_SPEC": "mem=1g"}, "c0ffee")
        d.core.admit(Owner("docker", "c0ffee"), req, user=(0, 0))
        assert not regionfs.is_mounted(layout.region_dir(d.state_dir, "c0ffee"))
        d.core.release("docker:c0ffee")
    finally:
        d.close()
