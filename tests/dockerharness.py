"""A real Docker engine and a hamid daemon for the runtime tests and bench.

Starts dockerd as root with its own data root, exec root and socket
(``--storage-driver=vfs --iptables=false --bridge=none``; another storage
driver on request), registers
``hamid-runtime`` as runtime ``hami`` through a daemon.json with
``runtimeArgs`` (as ``contrib/docker/daemon.json`` does), imports a busybox
image with ``docker import``, and runs ``hamid run`` on simulated GPUs with
its own state directory. The simulated GPUs get device nodes made with
``mknod`` in a directory of their own (major 195, as the NVIDIA driver's),
and MIG capability files like the driver's, so the container's view can be
checked; nothing here touches the host's real /dev.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
IMAGE = "hamid-test:busybox"
IMAGE_PRELOAD_LINK = "hamid-test:preload-link"  # /etc/ld.so.preload -> the host's /etc/ld.so.preload
IMAGE_USR_LINK = "hamid-test:usr-link"  # /usr -> the host's /usr


def missing_tools() -> list[str]:
    need = ["dockerd", "docker", "runc", "busybox", "containerd"]
    return [t for t in need if shutil.which(t) is None]


def _mknod(path: Path, major: int, minor: int) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    if not path.exists():
        os.mknod(path, 0o666 | 0o020000, os.makedev(major, minor))


class Env:
    def __init__(self, root: Path, simulate: str = "H100-80GB-HBM3:1,T4:1", mode: str = "mig",
                 storage_driver: str = "vfs", extra_config: dict | None = None, bin_dir: Path = BIN,
                 daemon_json: dict | None = None) -> None:
        self.root = root
        self.extra_config = extra_config or {}  # more hamid config keys (gossip, the web view)
        self.bin_dir = bin_dir  # where hamid and hamid-runtime are (the test venv's, or a `make install`'s)
        self.daemon_json = daemon_json  # dockerd's config as given; None: hamid-runtime of bin_dir as `hami`
        self.storage_driver = storage_driver  # vfs works on any filesystem; overlay2 is faster where it works
        self.state = root / "hamid"
        self.devroot = root / "dev"
        self.caps = root / "caps"
        self.sock = root / "docker.sock"
        self.exec_root = root / "exec"
        self.runc_root = self.exec_root / "runtime-runc" / "moby"
        self.simulate = simulate
        self.mode = mode
        self.dockerd: subprocess.Popen | None = None
        self.hamid: subprocess.Popen | None = None

    # --- docker ---------------------------------------------------------

    def docker(self, *args: str, check: bool = False, timeout: float = 120) -> subprocess.CompletedProcess:
        r = subprocess.run(["docker", "-H", f"unix://{self.sock}", *args], capture_output=True, text=True,
                           timeout=timeout)
        if check and r.returncode != 0:
            raise AssertionError(f"docker {' '.join(args)} failed: {r.stderr}")
        return r

    def start_docker(self) -> None:
        cfg = self.root / "daemon.json"
        cfg.write_text(json.dumps(self.daemon_json or {"runtimes": {"hami": {
            "path": str(self.bin_dir / "hamid-runtime"), "runtimeArgs": ["--state-dir", str(self.state)]}}}))
        log = open(self.root / "dockerd.log", "w")
        self.dockerd = subprocess.Popen(
            ["dockerd", "--data-root", str(self.root / "data"), "--exec-root", str(self.exec_root),
             "-H", f"unix://{self.sock}", "--pidfile", str(self.root / "docker.pid"),
             f"--storage-driver={self.storage_driver}", "--iptables=false", "--ip6tables=false", "--bridge=none",
             "--config-file", str(cfg)], stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.time() + 60
        while time.time() < deadline:
            if self.dockerd.poll() is not None:
                raise AssertionError("dockerd exited: " + (self.root / "dockerd.log").read_text()[-2000:])
            if self.sock.exists() and self.docker("version").returncode == 0:
                break
            time.sleep(0.2)
        else:
            raise AssertionError("dockerd did not come up")
        self._import_images()

    def _import_images(self) -> None:
        rootfs = self.root / "rootfs"
        for d in ("bin", "etc", "tmp", "proc", "sys", "dev", "root"):
            (rootfs / d).mkdir(parents=True, exist_ok=True)
        shutil.copy2(shutil.which("busybox"), rootfs / "bin" / "busybox")
        applets = subprocess.run([str(rootfs / "bin" / "busybox"), "--list"], capture_output=True,
                                 text=True, check=True).stdout.split()
        for a in applets:
            if a != "busybox" and not (rootfs / "bin" / a).exists():
                os.symlink("busybox", rootfs / "bin" / a)
        (rootfs / "etc" / "passwd").write_text("root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534::/:/bin/sh\n")
        self._import(rootfs, IMAGE)
        # Hostile images: links out of the rootfs where hamid mounts things.
        # (Docker's init layer replaces a linked /etc with a directory, so the
        # /etc case itself is tested against runc directly in test_runtime.py.)
        os.symlink("/etc/ld.so.preload", rootfs / "etc" / "ld.so.preload")
        self._import(rootfs, IMAGE_PRELOAD_LINK)
        os.unlink(rootfs / "etc" / "ld.so.preload")
        os.symlink("/usr", rootfs / "usr")
        self._import(rootfs, IMAGE_USR_LINK)
        os.unlink(rootfs / "usr")

    def _import(self, rootfs: Path, tag: str) -> None:
        tar = subprocess.Popen(["tar", "-C", str(rootfs), "-c", "."], stdout=subprocess.PIPE)
        r = subprocess.run(["docker", "-H", f"unix://{self.sock}", "import", "--change", "ENV PATH=/bin",
                            "-", tag], stdin=tar.stdout, capture_output=True, text=True, timeout=120)
        tar.wait()
        if r.returncode != 0:
            raise AssertionError(f"docker import failed: {r.stderr}")

    # --- fake device nodes ------------------------------------------------

    def make_nodes(self, gpus: int) -> None:
        for i in range(gpus):
            _mknod(self.devroot / f"nvidia{i}", 195, i)
        _mknod(self.devroot / "nvidiactl", 195, 255)
        _mknod(self.devroot / "nvidia-uvm", 235, 0)
        for gpu in range(gpus):
            for gi in range(1, 9):
                base = self.caps / f"gpu{gpu}" / "mig" / f"gi{gi}"
                (base / "ci0").mkdir(parents=True, exist_ok=True)
                gi_minor = 100 + gpu * 100 + gi * 10
                (base / "access").write_text(f"DeviceFileMinor: {gi_minor}\nDeviceFileMode: 292\n")
                (base / "ci0" / "access").write_text(f"DeviceFileMinor: {gi_minor + 1}\nDeviceFileMode: 292\n")
                _mknod(self.devroot / "nvidia-caps" / f"nvidia-cap{gi_minor}", 238, gi_minor)
                _mknod(self.devroot / "nvidia-caps" / f"nvidia-cap{gi_minor + 1}", 238, gi_minor + 1)

    # --- hamid --------------------------------------------------------------

    def start_hamid(self) -> None:
        cfg = self.root / "hamid.yaml"
        cfg.write_text(
            f"simulate: {self.simulate}\noperatingMode: {self.mode}\nstateDir: {self.state}\n"
            f"devRoot: {self.devroot}\nmigCapsRoot: {self.caps}\nmetricsPort: 0\nnodeName: docker-node\n"
            "dockerStartGrace: 2\nreconcileInterval: 1\nlogFormat: json\n"
            + "".join(f"{k}: {json.dumps(v)}\n" for k, v in self.extra_config.items()))
        log = open(self.root / "hamid.log", "a")
        self.hamid = subprocess.Popen([str(self.bin_dir / "hamid"), "run", "--config", str(cfg)], stdout=log,
                                      stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.time() + 30
        while time.time() < deadline:
            if self.hamid.poll() is not None:
                raise AssertionError("hamid exited: " + (self.root / "hamid.log").read_text()[-2000:])
            if (self.state / "hamid.sock").exists():
                return
            time.sleep(0.05)
        raise AssertionError("hamid did not come up")

    def kill_hamid(self) -> None:
        if self.hamid and self.hamid.poll() is None:
            self.hamid.send_signal(signal.SIGKILL)
            self.hamid.wait(timeout=10)

    def stop(self) -> None:
        if self.hamid and self.hamid.poll() is None:
            self.hamid.terminate()
            self.hamid.wait(timeout=15)
        if self.dockerd and self.dockerd.poll() is None:
            ids = self.docker("ps", "-aq").stdout.split()
            if ids:
                self.docker("rm", "-f", *ids)
            os.killpg(self.dockerd.pid, signal.SIGTERM)
            try:
                self.dockerd.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(self.dockerd.pid, signal.SIGKILL)
        subprocess.run(["umount", "-R", str(self.exec_root)], capture_output=True)

    # --- the ledger and the simulated MIG state ------------------------------

    def reservations(self) -> list[dict]:
        from hamid.ledger import Ledger

        led = Ledger(self.state / "ledger.db")
        try:
            return [r.to_dict() for r in led.list()]
        finally:
            led.close()

    def mig_instances(self) -> dict:
        path = self.state / "simulated-mig.json"
        data = json.loads(path.read_text()) if path.exists() else {}
        return {k: v for k, v in data.items() if v}

    def wait_for(self, pred, timeout: float = 20.0, what: str = "condition"):
        deadline = time.time() + timeout
        while time.time() < deadline:
            got = pred()
            if got:
                return got
            time.sleep(0.1)
        raise AssertionError(f"timed out waiting for {what}")


def new_env(**kw) -> Env:
    root = Path(tempfile.mkdtemp(prefix="hamid-docker-"))
    os.chmod(root, 0o755)
    env = Env(root, **kw)
    env.make_nodes(2)
    env.start_hamid()
    env.start_docker()
    return env
