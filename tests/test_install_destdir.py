"""``make install DESTDIR=...`` (packaging): everything lands under DESTDIR, and
nothing installed names DESTDIR, so the tree works once moved to PREFIX."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.slow  # a pip install of the package into a fresh venv
def test_make_install_honours_destdir(tmp_path):
    stage, prefix = tmp_path / "stage", "/opt/hamid-destdir-test"
    r = subprocess.run(["make", "install", f"DESTDIR={stage}", f"PREFIX={prefix}"], cwd=REPO,
                       capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stdout + r.stderr
    assert not Path(prefix).exists()  # nothing outside DESTDIR
    home = stage / prefix.lstrip("/") / "lib" / "hamid"
    assert (home / "bin" / "hamid-runtime").exists() and (home / "shim" / "libvgpu.so").exists()
    assert os.readlink(stage / prefix.lstrip("/") / "bin" / "hamid") == f"{prefix}/lib/hamid/bin/hamid"
    leaked = subprocess.run(["grep", "-rlI", str(stage), str(home / "bin"), str(home / "pyvenv.cfg")],
                            capture_output=True, text=True).stdout.split()
    assert not leaked, leaked
    build = json.loads((home / "hamid-build.json").read_text())
    assert build["shim_version"] == (REPO / "shim" / "VERSION").read_text().strip()
    assert build["revision"] and build["build_date"]
    # moved to PREFIX it runs, and says what it is
    shutil.move(str(stage / prefix.lstrip("/")), prefix)
    try:
        v = subprocess.run([f"{prefix}/bin/hamid", "version"], capture_output=True, text=True, timeout=60)
        assert v.returncode == 0 and f"commit {build['revision']}" in v.stdout, v.stdout + v.stderr
    finally:
        shutil.rmtree(prefix)
