"""hamid.shiminstall: the shim is installed atomically under a versioned name,
identical content is not rewritten, an installed file is never changed in
place, and racing installers agree on one file."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest

from hamid.shiminstall import ShimInstallError, install_shim, shim_version_of


def make_build(d: Path, version: str, content: bytes) -> Path:
    d.mkdir(parents=True, exist_ok=True)
    f = d / f"libvgpu.so.{version}"
    f.write_bytes(content)
    link = d / "libvgpu.so"
    if link.is_symlink():
        link.unlink()
    link.symlink_to(f.name)
    return link


def test_installs_under_the_versioned_name_and_links_it(tmp_path):
    src = make_build(tmp_path / "build", "1.2.3", b"ELF-one")
    assert shim_version_of(src) == "1.2.3"
    dest = install_shim(src, tmp_path / "host")
    assert dest == tmp_path / "host" / "libvgpu.so.1.2.3"
    assert dest.read_bytes() == b"ELF-one" and os.access(dest, os.X_OK)
    assert os.readlink(tmp_path / "host" / "libvgpu.so") == "libvgpu.so.1.2.3"
    assert [p.name for p in (tmp_path / "host").iterdir() if p.name.startswith(".")] == []  # no temporaries left


def test_identical_content_is_not_rewritten(tmp_path):
    src = make_build(tmp_path / "build", "1.2.3", b"ELF-one")
    first = install_shim(src, tmp_path / "host")
    st = first.stat()
    again = install_shim(src, tmp_path / "host")
    assert again == first and again.stat().st_ino == st.st_ino and again.stat().st_mtime_ns == st.st_mtime_ns


def test_an_installed_file_is_never_changed_in_place(tmp_path):
    host = tmp_path / "host"
    first = install_shim(make_build(tmp_path / "b1", "1.2.3", b"ELF-one"), host)
    ino = first.stat().st_ino
    with open(first, "rb") as mapped:  # a running container holding the old library
        second = install_shim(make_build(tmp_path / "b2", "1.2.3", b"ELF-two"), host)
        assert second != first and second.name.startswith("libvgpu.so.1.2.3+")
        assert first.read_bytes() == b"ELF-one" and first.stat().st_ino == ino
        assert mapped.read() == b"ELF-one"
    assert os.readlink(host / "libvgpu.so") == second.name
    third = install_shim(make_build(tmp_path / "b3", "1.3.0", b"ELF-three"), host)
    assert third.name == "libvgpu.so.1.3.0" and first.read_bytes() == b"ELF-one"


def test_racing_installers_agree(tmp_path):
    src = make_build(tmp_path / "build", "2.0.0", os.urandom(1 << 20))
    out: list[Path] = []
    ts = [threading.Thread(target=lambda: out.append(install_shim(src, tmp_path / "host"))) for _ in range(8)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert len(set(out)) == 1
    assert sorted(p.name for p in (tmp_path / "host").iterdir()) == ["libvgpu.so", "libvgpu.so.2.0.0"]


def test_bad_sources_are_refused(tmp_path):
    with pytest.raises(ShimInstallError, match="no such file"):
        install_shim(tmp_path / "nope" / "libvgpu.so.1.0.0", tmp_path / "host")
    odd = tmp_path / "libvgpu.so"
    odd.write_bytes(b"x")
    with pytest.raises(ShimInstallError, match="libvgpu.so.<version>"):
        install_shim(odd, tmp_path / "host")


def test_the_real_build_installs(tmp_path, built):
    dest = install_shim(built.shim.parent / "libvgpu.so", tmp_path / "host")
    assert dest.name == built.shim.name and dest.read_bytes() == built.shim.read_bytes()
