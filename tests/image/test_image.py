"""The repository's Dockerfile, built by a real Docker engine with no network.

Owns the proof that the image the Helm chart runs builds and works: a Debian
base made here with debootstrap (from the mirror this machine's apt uses) and
``docker import``, wheels of hamid's dependencies made on the host with pip,
then ``docker build`` of the repository's Dockerfile on a dockerd started by
tests/dockerharness.py. That engine has no bridge (``--bridge=none``), so
every build step runs with loopback only: the build must work offline, from
the wheels in the context's ``.whl/`` (the Dockerfile's documented offline
path). The image must then answer ``hamid version``, carry the shim where the
daemon looks for it by default, and import every part of the daemon.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import tomllib
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import dockerharness as dh  # noqa: E402

REPO = dh.REPO
BASE_TAG = "hamid-test-base:{codename}"
IMAGE_TAG = "hamid-test:image"
REVISION = "0123456789abcdef0123456789abcdef01234567"  # what a release build passes (--build-arg REVISION)
# What the Dockerfile's two stages need from a base (python:3.11-slim-bookworm
# has Python; its build stage adds gcc, make and libc6-dev with apt-get).
BASE_PACKAGES = ["python3", "python3-venv", "gcc", "make", "libc6-dev", "ca-certificates"]
PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


def _project_version() -> str:
    return tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]


def test_dockerfile_labels_the_version_in_pyproject():
    """The image's version label defaults to the package's version (no docker needed)."""
    import hamid

    m = re.search(r"^ARG (?:.* )?VERSION=(\S+)", (REPO / "Dockerfile").read_text(), re.M)
    assert m, "the Dockerfile has no `ARG VERSION=<default>` line"
    assert m.group(1) == _project_version() == hamid.__version__


# ---- the base image: debootstrap from this machine's Debian mirror ----------

def _codename() -> str:
    for line in Path("/etc/os-release").read_text().splitlines():
        if line.startswith("VERSION_CODENAME="):
            return line.split("=", 1)[1].strip().strip('"')
    return ""


def apt_mirror(codename: str) -> str | None:
    """The URI of the first ``deb`` source apt reads here for suite ``codename``."""
    d = Path("/etc/apt")
    files = [d / "sources.list"] + sorted((d / "sources.list.d").glob("*.list")) + \
        sorted((d / "sources.list.d").glob("*.sources"))
    for f in files:
        if not f.is_file():
            continue
        text = f.read_text()
        if f.suffix == ".sources":  # deb822 stanzas
            for stanza in re.split(r"\n\s*\n", text):
                fields = {}
                for line in stanza.splitlines():
                    if line and not line.startswith("#") and ":" in line and not line[0].isspace():
                        k, v = line.split(":", 1)
                        fields[k.strip().lower()] = v.split()
                if ("deb" in fields.get("types", []) and codename in fields.get("suites", [])
                        and fields.get("enabled", ["yes"])[0].lower() != "no" and fields.get("uris")):
                    return fields["uris"][0]
        else:  # one-line format: deb [options] uri suite component...
            for line in text.splitlines():
                words = re.sub(r"\[[^]]*\]", " ", line.split("#", 1)[0]).split()
                if len(words) >= 3 and words[0] == "deb" and words[2] == codename:
                    return words[1]
    return None


@pytest.fixture(scope="session")
def base_tree(tmp_path_factory):
    """A minbase Debian tree of the host's release, made once per test session."""
    if os.geteuid() != 0:
        pytest.skip("needs root for debootstrap and dockerd (CI runs as root)")
    if shutil.which("debootstrap") is None:
        pytest.skip("missing debootstrap (make test installs it through tests/prepare_host.py)")
    codename = _codename()
    mirror = apt_mirror(codename) if codename else None
    if mirror is None:
        pytest.skip(f"no apt source for this machine's release {codename!r} in /etc/apt to debootstrap from")
    tree = tmp_path_factory.mktemp("debootstrap") / codename
    r = subprocess.run(["debootstrap", "--variant=minbase", "--include=" + ",".join(BASE_PACKAGES), codename,
                        str(tree), mirror], capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, f"debootstrap {codename} from {mirror} failed:\n{r.stdout[-3000:]}{r.stderr[-3000:]}"
    # What a base image leaves out anyway: the downloaded packages, apt's
    # lists, documentation. Less to copy into every layer (vfs copies whole).
    for sub in ("var/cache/apt/archives", "var/lib/apt/lists", "usr/share/doc", "usr/share/man",
                "usr/share/locale", "usr/share/info"):
        p = tree / sub
        if p.is_dir():
            for child in p.iterdir():
                if child.is_dir() and not child.is_symlink():
                    shutil.rmtree(child)
                elif child.name != "lock":
                    child.unlink()
    for bin_cache in (tree / "var/cache/apt").glob("*.bin"):
        bin_cache.unlink()
    yield tree, codename
    shutil.rmtree(tree, ignore_errors=True)


# ---- the engine, the context, the build ---------------------------------------

def _start_engine(driver: str) -> dh.Env:
    root = Path(tempfile.mkdtemp(prefix="hamid-image-"))
    os.chmod(root, 0o755)
    e = dh.Env(root, storage_driver=driver)
    try:
        e.start_docker()
    except BaseException:
        _remove_engine(e)
        raise
    return e


def _remove_engine(e: dh.Env) -> None:
    e.stop()
    # dockerd mounts its data root on itself; one that failed to start leaves it.
    subprocess.run(["umount", "-R", str(e.root / "data")], capture_output=True)
    shutil.rmtree(e.root, ignore_errors=True)


@pytest.fixture(scope="module")
def engine():
    """dockerd on overlay2 where this filesystem takes it (each layer and
    container is then not a whole copy), else on vfs as the other tests."""
    if os.geteuid() != 0:
        pytest.skip("needs root to run dockerd (CI runs as root)")
    missing = dh.missing_tools()
    if missing:
        pytest.skip(f"missing {', '.join(missing)} (make test installs docker.io, runc, busybox-static)")
    try:
        e = _start_engine("overlay2")
    except AssertionError:
        e = _start_engine("vfs")
    try:
        yield e
    finally:
        _remove_engine(e)


def _python_of(tree: Path) -> str:
    """``python3.X`` that the tree's ``python3`` is."""
    return os.readlink(tree / "usr/bin/python3")


def build_context(dest: Path) -> Path:
    """The repository's files as a fresh clone has them, plus ``.whl/``.

    Tracked and untracked-but-not-ignored files, so the repository's own
    .dockerignore decides what reaches the build, as in ``docker build .``.
    """
    files = subprocess.run(["git", "-C", str(REPO), "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                           capture_output=True, check=True).stdout.decode().split("\0")
    for rel in filter(None, files):
        src = REPO / rel
        if not src.exists() and not src.is_symlink():
            continue  # deleted in the working tree
        dst = dest / rel
        dst.parent.mkdir(parents=True, exist_ok=True)
        if src.is_symlink():
            os.symlink(os.readlink(src), dst)
        else:
            shutil.copy2(src, dst)
    return dest


@pytest.fixture(scope="module")
def base_image(engine, base_tree) -> str:
    """The debootstrap tree imported into the engine as an image."""
    tree, codename = base_tree
    tag = BASE_TAG.format(codename=codename)
    tar = subprocess.Popen(["tar", "-C", str(tree), "-c", "."], stdout=subprocess.PIPE)
    r = subprocess.run(["docker", "-H", f"unix://{engine.sock}", "import", "--change", f"ENV PATH={PATH}", "-", tag],
                       stdin=tar.stdout, capture_output=True, text=True, timeout=300)
    tar.wait()
    assert r.returncode == 0, f"docker import of the base failed: {r.stderr}"
    return tag


@pytest.fixture(scope="module")
def image(engine, base_tree, base_image, tmp_path_factory) -> str:
    tree, _ = base_tree
    here = f"python{sys.version_info.major}.{sys.version_info.minor}"
    if _python_of(tree) != here:
        pytest.skip(f"the host's {here} cannot make wheels for the base's {_python_of(tree)}")
    if shutil.which("git") is None or not (REPO / ".git").exists():
        pytest.skip("needs git and a git checkout to assemble the build context")
    ctx = build_context(tmp_path_factory.mktemp("context"))
    wheels = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--wheel-dir", str(ctx / ".whl"), str(ctx),
                             "setuptools", "wheel"], capture_output=True, text=True, timeout=600)
    assert wheels.returncode == 0, f"pip wheel failed:\n{wheels.stderr[-3000:]}"

    # The legacy builder: what Debian's docker.io has (no buildx plugin needed).
    env = dict(os.environ, DOCKER_BUILDKIT="0")
    build = subprocess.run(["docker", "-H", f"unix://{engine.sock}", "build", "--build-arg", f"BASE={base_image}",
                            "--build-arg", "PIP_NO_INDEX=1", "--build-arg", f"REVISION={REVISION}",
                            "-t", IMAGE_TAG, str(ctx)],
                           capture_output=True, text=True, env=env, timeout=900)
    (engine.root / "build.log").write_text(build.stdout + build.stderr)
    assert build.returncode == 0, f"docker build failed:\n{build.stdout[-5000:]}\n{build.stderr[-3000:]}"
    shutil.rmtree(ctx, ignore_errors=True)
    return IMAGE_TAG


PROBE = """
import json, os, pathlib, shutil, subprocess, sys
out = {"uid": os.getuid()}
import hamid.daemon.service, hamid.kubelet.face, hamid.scheduling.face  # every face's dependencies
from hamid.shimlimits.codec import limits_size
from hamid.shimregion.reader import region_struct_size
out["limits_size"], out["region_size"] = limits_size(), region_struct_size()
r = subprocess.run(["hamid", "run", "--help"], capture_output=True, text=True)
out["run_help"] = [r.returncode, r.stdout + r.stderr]
out["link"] = os.readlink("/usr/lib/hamid/libvgpu.so")
rt = shutil.which("hamid-runtime")
out["runtime"] = [rt, open(rt, "rb").read(4).hex() if rt else "", shutil.which("hamid-runtime-py")]
ad = shutil.which("hamid-runtime-admit")
out["admit"] = [ad, open(ad, "rb").read(4).hex() if ad else ""]
out["front_help"] = subprocess.run(["hamid", "front", "--help"], capture_output=True, text=True).returncode
from hamid.config.load import load_config
from hamid.daemon.service import install_shim_for
state = pathlib.Path("/tmp/state")
state.mkdir(mode=0o700)
out["installed"] = install_shim_for(load_config(None), state)["library"]  # no shimLibrary set
shutil.copy("/usr/lib/hamid/libvgpu.so", "/probe/libvgpu.so")
json.dump(out, open("/probe/result.json", "w"))
"""


@pytest.fixture(scope="module")
def probe(engine, image, tmp_path_factory) -> tuple[dict, Path]:
    """One container of the image answering every question below (a container costs seconds on vfs)."""
    d = tmp_path_factory.mktemp("probe")
    (d / "probe.py").write_text(PROBE)
    r = engine.docker("run", "--rm", "-v", f"{d}:/probe", image, "python3", "/probe/probe.py", timeout=300)
    assert r.returncode == 0, r.stderr
    return json.loads((d / "result.json").read_text()), d / "libvgpu.so"


@pytest.mark.docker
@pytest.mark.slow
def test_the_engine_gives_build_steps_no_network(engine, base_image):
    """What makes the image's build an offline one: containers here have loopback only."""
    probe = "import os; print(sorted(os.listdir('/sys/class/net')), open('/proc/net/route').read().count(chr(10)))"
    r = engine.docker("run", "--rm", base_image, "python3", "-c", probe)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["['lo']", "1"], r.stdout  # no interface but lo, no route (the header line alone)


@pytest.mark.docker
@pytest.mark.slow
def test_hamid_version_runs_in_the_image(engine, image):
    import hamid

    r = engine.docker("run", "--rm", image, "hamid", "version", timeout=300)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.strip().splitlines()
    shim_version = (Path(REPO) / "shim" / "VERSION").read_text().strip()
    assert lines[:3] == [f"hamid {hamid.__version__}", f"shim {shim_version}", f"commit {REVISION}"], r.stdout


@pytest.mark.docker
@pytest.mark.slow
def test_image_metadata_is_what_the_chart_expects(engine, image):
    info = json.loads(engine.docker("image", "inspect", image, check=True).stdout)[0]["Config"]
    labels = info["Labels"]
    assert labels["org.opencontainers.image.version"] == _project_version()
    assert labels["org.opencontainers.image.title"] == "hamid"
    assert labels["org.opencontainers.image.licenses"] == "Apache-2.0"
    assert not info.get("Entrypoint")  # the chart's `command: ["hamid"]` is the whole command
    assert info["Cmd"] == ["hamid", "run"]
    assert info.get("User") in ("", "root", None)


@pytest.mark.docker
@pytest.mark.slow
def test_every_part_of_the_daemon_imports_and_run_takes_the_charts_options(probe):
    from hamid.shimlimits.codec import limits_size
    from hamid.shimregion.reader import region_struct_size

    out, _ = probe
    assert out["uid"] == 0  # a node daemon: device nodes, kubelet's sockets, root-owned limits files
    # The shim's headers are packaged: the image's daemon reads the same layouts as the source tree's.
    assert (out["limits_size"], out["region_size"]) == (limits_size(), region_struct_size())
    rc, text = out["run_help"]
    assert rc == 0, text
    for flag in ("--config", "--gossip-advertise", "--peer-advertise"):
        assert flag in text
    # the Docker runtime beside the daemon (the C program, then hamid-runtime-py), and the chart's front
    rt, magic, py = out["runtime"]
    assert rt == "/opt/hamid/bin/hamid-runtime" and magic == "7f454c46" and py == "/opt/hamid/bin/hamid-runtime-py"
    assert out["admit"] == ["/opt/hamid/bin/hamid-runtime-admit", "7f454c46"]  # what the front hands create to
    assert out["front_help"] == 0


@pytest.mark.docker
@pytest.mark.slow
def test_the_daemon_installs_the_images_shim_by_default(probe):
    """No shimLibrary configured: the daemon finds /usr/lib/hamid/libvgpu.so and installs it, versioned."""
    version = (REPO / "shim" / "VERSION").read_text().strip()
    out, _ = probe
    assert out["link"] == f"libvgpu.so.{version}"
    assert out["installed"] == f"/tmp/state/shim/libvgpu.so.{version}"


@pytest.mark.docker
@pytest.mark.slow
def test_the_images_shim_exports_the_driver_entry_points(probe):
    if shutil.which("nm") is None:
        pytest.skip("missing nm (binutils)")
    _, lib = probe
    nm = subprocess.run(["nm", "-D", "--defined-only", str(lib)], capture_output=True, text=True, check=True).stdout
    exported = {ln.split()[-1] for ln in nm.splitlines() if ln.strip()}
    mapfile = (REPO / "shim" / "libvgpu.map").read_text()
    listed = set(re.findall(r"\b((?:cu|nvml)\w+|dlsym|hamid_shim_version)\b",
                            mapfile.split("global:")[1].split("local:")[0]))
    assert {"cuMemAlloc_v2", "cuLaunchKernel", "nvmlDeviceGetMemoryInfo", "hamid_shim_version"} <= exported
    assert exported == listed
