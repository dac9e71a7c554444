"""One Kubernetes node for the tests: the API-server stand-in, the kubelet
stand-in and a real ``hamid run`` process between them (simulated GPUs).

``NodeEnv`` starts the three, creates the Node object, and offers what a test
does as a cluster would: create a pod bound to the node, have kubelet admit
it and start its containers, delete it.
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
import uuid
from pathlib import Path

from hamid.shimlimits import decode
from kubelet import KubeletStandIn

RESOURCE = "nvidia.com/gpu"
NODE_RESOURCES = {"cpu": "16", "memory": "64Gi", "pods": "110", "ephemeral-storage": "100Gi"}
HAMID = [sys.executable, "-m", "hamid.cli.main"]
SETPRIV = shutil.which("setpriv")  # util-linux: drops the front's capabilities, as the chart's securityContext


class NodeEnv:
    def __init__(self, root: Path, api, *, node: str = "node-a", simulate: str = "H100:2", split: int = 10,
                 strategy: str = "envvar", pick: str = "first", seed: int = 0, mode: str = "hami-core",
                 extra_config: str = "", reconcile_interval: float = 1.0, front: bool = False,
                 dra: str = "") -> None:
        """``front``: as the chart runs it, ``hamid front`` beside the daemon with every
        capability dropped serves the webhook and extender ports; the daemon answers
        on ``frontDir``'s sockets only. ``dra``: ``draDevices`` (those GPUs are DRA's,
        the device plugin serves the others)."""
        self.root = root
        root.mkdir(parents=True, exist_ok=True)
        self.api = api
        self.node = node
        self.split = split
        self.gpus = len(simulate.split(",")) if ":" not in simulate else int(simulate.rsplit(":", 1)[1])
        self.dra_gpus = self.gpus if dra == "all" else len([x for x in dra.split(",") if x.strip()])
        if dra:
            extra_config += f"draDevices: '{dra}'\n"
        self.state = root / "state"
        # short: unix socket paths are at most 107 bytes, pytest's tmp paths are long
        self.kubelet_dir = Path(tempfile.mkdtemp(prefix="hk-"))
        self.cdi = root / "cdi"
        self.kubeconfig = api.write_kubeconfig(root / "kubeconfig")
        self.config = root / "hamid.yaml"
        self.front_dir = Path(tempfile.mkdtemp(prefix="hf-")) / "front" if front else None
        if self.front_dir is not None:
            extra_config += f"frontDir: {self.front_dir}\nfrontGroup: {os.getgid() + 1}\n"
        self.front_proc: subprocess.Popen | None = None
        self.config.write_text(
            f"simulate: {simulate}\ndeviceSplitCount: {split}\noperatingMode: {mode}\n"
            f"deviceListStrategy: {strategy}\ncdiSpecDir: {self.cdi}\nhealthCheckInterval: 0.2\n"
            f"reconcileInterval: {reconcile_interval:g}\n"
            f"{'' if 'metricsPort' in extra_config else 'metricsPort: 0' + chr(10)}{extra_config}")
        if "controlMode" not in extra_config:  # one node alone: no cluster placement
            self.config.write_text(self.config.read_text() + "controlMode: none\n")
        self.kubelet = KubeletStandIn(self.kubelet_dir, node_name=node, cdi_dirs=[self.cdi], pick=pick, seed=seed)
        self.proc: subprocess.Popen | None = None
        self.log = root / "hamid.log"

    # --- lifecycle -----------------------------------------------------------------

    def start(self) -> "NodeEnv":
        try:
            return self._start()
        except BaseException:
            self.stop()  # no daemon outlives a failed start
            raise

    def _start(self) -> "NodeEnv":
        self.root.mkdir(parents=True, exist_ok=True)
        try:
            self.api.create({"apiVersion": "v1", "kind": "Node",
                             "metadata": {"name": self.node, "labels": {"kubernetes.io/hostname": self.node}},
                             "status": {"capacity": dict(NODE_RESOURCES), "allocatable": dict(NODE_RESOURCES),
                                        # Ready, as a kubelet posts it: the new Node's not-ready taint is lifted
                                        "conditions": [{"type": "Ready", "status": "True"}]}})
        except Exception:
            pass  # already there (a restart)
        self.kubelet.start()
        self.start_hamid()
        return self

    def start_hamid(self) -> None:
        log = open(self.log, "a")
        self.proc = subprocess.Popen([*HAMID, "run", "--config", str(self.config), "--state-dir", str(self.state),
                                      "--node-name", self.node, "--kubelet-dir", str(self.kubelet_dir),
                                      "--kubeconfig", self.kubeconfig, "--log-format", "json"],
                                     stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        self.wait_for_api()
        self.wait_for_devices()
        self.publish_device_capacity()
        if self.front_dir is not None and (self.front_proc is None or self.front_proc.poll() is not None):
            drop = [SETPRIV, "--inh-caps=-all", "--bounding-set=-all", "--no-new-privs", "--"] if SETPRIV else []
            self.front_proc = subprocess.Popen([*drop, *HAMID, "front", "--config", str(self.config), "--node-name",
                                                self.node, "--log-format", "json"],
                                               stdout=log, stderr=subprocess.STDOUT, start_new_session=True)

    def publish_device_capacity(self) -> None:
        """What kubelet's node status does for a device plugin's resource (the kubelet
        stand-in does not write node status): capacity = all devices, allocatable = healthy."""
        n = str(len(self.kubelet.healthy(RESOURCE)))
        total = str(len(self.kubelet.devices(RESOURCE)))
        if total == "0":
            return  # no device plugin devices: kubelet lists no such resource
        self.api.set_status("Node", None, self.node, {"capacity": {RESOURCE: total}, "allocatable": {RESOURCE: n}})

    def wait_for_api(self, timeout: float = 30.0) -> None:
        """Until the daemon's local API answers (its faces start after it; a kubelet that
        still lists the last daemon's devices proves nothing about this one)."""
        from hamid.localapi.client import LocalClient

        deadline = time.time() + timeout
        while time.time() < deadline:
            if self.proc is not None and self.proc.poll() is not None:
                raise AssertionError(f"hamid exited {self.proc.returncode}: {self.log.read_text()[-3000:]}")
            try:
                with LocalClient(self.state) as c:
                    c.status()
                return
            except Exception:
                time.sleep(0.05)
        raise AssertionError(f"hamid's local API never answered: {self.log.read_text()[-3000:]}")

    def wait_for_devices(self, n: int | None = None, timeout: float = 30.0) -> list[str]:
        want = (self.gpus - self.dra_gpus) * self.split if n is None else n
        deadline = time.time() + timeout
        while time.time() < deadline:
            if self.proc is not None and self.proc.poll() is not None:
                raise AssertionError(f"hamid exited {self.proc.returncode}: {self.log.read_text()[-3000:]}")
            if len(self.kubelet.healthy(RESOURCE)) >= want:
                return self.kubelet.healthy(RESOURCE)
            time.sleep(0.05)
        raise AssertionError(f"kubelet never saw {want} healthy devices: {self.log.read_text()[-3000:]}")

    def stop_hamid(self, sig=signal.SIGTERM) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None

    def stop(self) -> None:
        self.stop_hamid()
        if self.front_proc is not None and self.front_proc.poll() is None:
            self.front_proc.terminate()
            try:
                self.front_proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.front_proc.kill()
                self.front_proc.wait()
        self.kubelet.stop()
        shutil.rmtree(self.kubelet_dir, ignore_errors=True)
        if self.front_dir is not None:
            shutil.rmtree(self.front_dir.parent, ignore_errors=True)

    # --- pods ------------------------------------------------------------------------

    def pod(self, name: str, containers: list[dict], *, init: list[dict] | None = None, namespace: str = "default",
            annotations: dict | None = None, node: str | None = "") -> dict:
        """Create a pod (bound to this node unless ``node`` is None) in the API server and return it."""
        def spec(c):
            out = {"name": c["name"], "image": "busybox",
                   "resources": {"limits": {k: str(v) for k, v in c.get("limits", {}).items()}}}
            if "securityContext" in c:
                out["securityContext"] = c["securityContext"]
            return out

        obj = {"apiVersion": "v1", "kind": "Pod",
               "metadata": {"name": name, "namespace": namespace, "annotations": annotations or {}},
               "spec": {"containers": [spec(c) for c in containers]}}
        if init:
            obj["spec"]["initContainers"] = [spec(c) for c in init]
        if node is not None:
            obj["spec"]["nodeName"] = node or self.node
        return self.api.create(obj)

    def delete(self, pod: dict) -> None:
        self.kubelet.remove_pod(pod)
        m = pod["metadata"]
        self.api.delete("Pod", m["namespace"], m["name"], grace_period=0)

    def limits_of(self, cfg) -> dict:
        """The limits file a container got, decoded (``ContainerConfig`` from the kubelet stand-in)."""
        m = cfg.mount("/usr/local/vgpu/hamid.limits")
        data = Path(m.host_path).read_bytes()
        return decode(data)

    def reservations(self) -> list[dict]:
        from hamid.localapi.client import LocalClient

        with LocalClient(self.state) as c:
            return c.reservations()


def uid() -> str:
    return str(uuid.uuid4())


def mib(n: int) -> int:
    return n << 20


__all__ = ["NodeEnv", "RESOURCE", "json", "os"]
