"""hamid.atomicfile: the one writer of state files, keys and CDI specs."""

from __future__ import annotations

import os
import stat

from hamid.atomicfile import replace_file
from hamid.nodekey import NodeIdentity, rotate


def test_the_file_appears_whole_with_its_mode_and_a_planted_link_is_not_followed(tmp_path):
    target = tmp_path / "key"
    victim = tmp_path / "victim"
    victim.write_text("untouched")
    os.symlink(victim, str(target) + ".tmp")  # planted where the temporary file goes
    replace_file(target, b"secret", 0o600)
    assert target.read_bytes() == b"secret"
    assert stat.S_IMODE(target.stat().st_mode) == 0o600
    assert victim.read_text() == "untouched"
    assert not os.path.lexists(str(target) + ".tmp")


def test_a_rotated_private_key_is_written_for_root_alone(tmp_path):
    NodeIdentity.load_or_create(tmp_path)
    rotate(tmp_path)
    keys = [p for p in tmp_path.iterdir() if p.is_file()]
    assert keys and all(stat.S_IMODE(p.stat().st_mode) == 0o600 for p in keys), keys
