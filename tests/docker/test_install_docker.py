"""The README's Docker install, as written: `make install`, contrib/docker/daemon.json, a real dockerd.

`make install` goes to a temporary PREFIX instead of /usr/local, and
daemon.json's paths are moved there (the one rewrite: /usr/local -> PREFIX,
/var/lib/hamid -> the test's state dir); everything else is the file as
shipped. The containers run under the installed launcher through its link in
PREFIX/bin, the installed C client, and, with the daemon stopped, the
installed hamid-runtime-py, each found beside the launcher's real path.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import dockerharness as dh  # noqa: E402

pytestmark = [pytest.mark.docker, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]


def readme_docker_block() -> str:
    text = (REPO / "README.md").read_text()
    section = text[text.index("### Plain Docker: `--runtime=hami`"):]
    return section[:section.index("\n\n`make install`")]


def test_readme_install_block_is_what_this_test_does():
    block = readme_docker_block()
    assert re.search(r"^\s+sudo make install\s", block, re.M), block
    assert "sudo cp contrib/docker/daemon.json /etc/docker/daemon.json" in block
    assert "sudo hamid run" in block and "docker run --rm --runtime=hami" in block
    shipped = json.loads((REPO / "contrib" / "docker" / "daemon.json").read_text())
    assert shipped == {"runtimes": {"hami": {"path": "/usr/local/bin/hamid-runtime",
                                             "runtimeArgs": ["--state-dir", "/var/lib/hamid"]}}}


@pytest.fixture(scope="module")
def installed():
    if os.geteuid() != 0:
        pytest.skip("needs root to run dockerd (CI runs as root)")
    missing = dh.missing_tools()
    if missing:
        pytest.skip(f"missing {', '.join(missing)} (make test installs docker.io, runc, busybox-static)")
    root = Path(tempfile.mkdtemp(prefix="hamid-install-"))
    os.chmod(root, 0o755)
    prefix = root / "usr-local"
    r = subprocess.run(["make", "install", f"PREFIX={prefix}"], cwd=REPO, capture_output=True, text=True,
                       timeout=600)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    shipped = (REPO / "contrib" / "docker" / "daemon.json").read_text()
    state = root / "hamid"
    daemon_json = json.loads(shipped.replace("/usr/local", str(prefix)).replace("/var/lib/hamid", str(state)))
    env = dh.Env(root, simulate="T4:2", mode="hami-core", bin_dir=prefix / "bin", daemon_json=daemon_json)
    try:
        env.make_nodes(2)
        env.start_hamid()
        env.start_docker()
        yield env, prefix
    finally:
        env.stop()
        shutil.rmtree(root, ignore_errors=True)


def test_install_lays_out_links_and_helpers(installed):
    _, prefix = installed
    for name in ("hamid", "hamid-runtime"):
        link = prefix / "bin" / name
        assert link.is_symlink() and os.access(link, os.X_OK), link
    home = prefix / "lib" / "hamid"
    for name in ("hamid-runtime", "hamid-runtime-admit", "hamid-runtime-py"):
        assert os.access(home / "bin" / name, os.X_OK), name
    for name in ("hamid-runtime", "hamid-runtime-admit"):  # the C runtime: no shell, no Python
        assert (home / "bin" / name).read_bytes()[:4] == b"\x7fELF", name
    assert (home / "shim" / "libvgpu.so").resolve().name.startswith("libvgpu.so.")


def test_container_through_the_installed_runtime_gets_its_limits_and_the_shim(installed):
    env, _ = installed
    r = env.docker("run", "--rm", "--runtime=hami", "-e", "HAMI_VISIBLE_DEVICES=0",
                   "-e", "HAMI_VGPU_SPEC=mem=4g,cores=30", dh.IMAGE, "sh", "-c",
                   "env; test -s /usr/local/vgpu/libvgpu.so && echo SHIM ok")
    assert r.returncode == 0, r.stderr
    assert "CUDA_DEVICE_MEMORY_LIMIT_0=4096m" in r.stdout and "SHIM ok" in r.stdout
    env.wait_for(lambda: env.reservations() == [], what="release after --rm")


def test_refusal_reaches_docker_run(installed):
    env, _ = installed
    r = env.docker("run", "--rm", "--runtime=hami", "-e", "HAMI_VGPU_SPEC=mem=100g", dh.IMAGE, "true")
    assert r.returncode != 0
    assert "hamid: no room for this container" in r.stderr and "102400 requested" in r.stderr, r.stderr


def test_without_the_daemon_the_installed_python_runtime_admits(installed):
    env, _ = installed
    env.kill_hamid()
    try:
        r = env.docker("run", "--rm", "--runtime=hami", "-e", "HAMI_VISIBLE_DEVICES=1",
                       "-e", "HAMI_VGPU_SPEC=mem=2g", dh.IMAGE, "sh", "-c", "env")
        assert r.returncode == 0, r.stderr
        assert "CUDA_DEVICE_MEMORY_LIMIT_0=2048m" in r.stdout
    finally:
        env.start_hamid()
