"""Real ``hamid run`` daemons with gossip, for the gossip tests.

Each node is a subprocess with its own state dir, simulated GPUs and a gossip
port on loopback (or inside a network namespace); the test reads its view
through the unix socket, as ``hamid status --cluster`` does.
"""

from __future__ import annotations

import base64
import os
import signal
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import yaml

from hamid.localapi.client import LocalClient

HAMID = [sys.executable, "-m", "hamid.cli.main"]
SETPRIV = shutil.which("setpriv")  # util-linux: drops the front's capabilities, as the chart's securityContext

# Fast but not twitchy: a loaded 2-core CI machine must not see false deaths.
FAST = {
    "gossipProbeInterval": 0.4,
    "gossipProbeTimeout": 0.2,
    "gossipInterval": 0.1,
    "gossipPushPullInterval": 3.0,
    "gossipReconnectInterval": 1.0,
    "gossipCapacityInterval": 0.3,
    "gossipConnectTimeout": 2.0,
}


from netports import free_port, listening_ports  # noqa: E402,F401 - ports outside the ephemeral range


def new_key() -> str:
    return base64.b64encode(os.urandom(32)).decode()


def wait_until(pred: Callable[[], object], timeout: float, what: str, every: float = 0.1):
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        try:
            got = pred()
        except Exception as e:  # a daemon still starting
            got, last = None, e
        if got:
            return got
        time.sleep(every)
    raise AssertionError(f"timed out after {timeout}s waiting for {what} (last error: {last!r})")


class Node:
    def __init__(self, root: Path, name: str, *, host: str = "127.0.0.1", port: int | None = None,
                 join: tuple[str, ...] = (), keys: list[str] | None = None, simulate: str = "T4",
                 config: dict | None = None, netns: str | None = None, env: dict | None = None,
                 metrics_port: int = 0, front: bool = False) -> None:
        """``front``: as the chart runs it, ``hamid front`` (every capability dropped) holds the gossip port,
        the links and the keyring; the daemon's membership talks to it over ``frontDir/gossip.sock``."""
        self.name = name
        self.dir = root / name
        self.dir.mkdir(parents=True, exist_ok=True)
        self.state = self.dir / "state"
        self.port = port or free_port()
        self.addr = f"{host}:{self.port}"
        self.join = join
        self.simulate = simulate
        self.netns = netns
        self.env = env
        self.metrics_port = metrics_port
        self.proc: subprocess.Popen | None = None
        self.front_proc: subprocess.Popen | None = None
        cfg = dict(FAST if config is None else config)
        self.front = front
        if front:  # short: a unix socket path is at most 107 bytes
            self.front_dir = Path(tempfile.mkdtemp(prefix="hg-")) / "front"
            cfg.update(frontDir=str(self.front_dir), frontGroup=os.getgid() + 1, gossipListen=self.addr,
                       metricsPort=0, controlMode="none")
        if keys is not None:
            kf = self.dir / "keys"
            kf.write_text("\n".join(keys) + "\n")
            cfg["gossipKeyFile"] = str(kf)
        self.config_file = self.dir / "config.yaml"
        self.config_file.write_text(yaml.safe_dump(cfg))
        self.log = self.dir / "daemon.log"

    def start(self) -> "Node":
        cmd = [*HAMID, "run", "--config", str(self.config_file), "--state-dir", str(self.state),
               "--metrics-port", str(self.metrics_port), "--node-name", self.name, "--simulate", self.simulate,
               "--log-format", "json", "--gossip-listen", self.addr]
        if self.join:
            cmd += ["--join", ",".join(self.join)]
        if self.netns:
            cmd = ["ip", "netns", "exec", self.netns, *cmd]
        env = dict(os.environ, **(self.env or {}))
        self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=open(self.log, "a"), env=env)
        if self.front:
            self.start_front()
        return self

    def start_front(self) -> None:
        drop = [SETPRIV, "--inh-caps=-all", "--bounding-set=-all", "--no-new-privs", "--"] if SETPRIV else []
        cmd = [*drop, *HAMID, "front", "--config", str(self.config_file), "--node-name", self.name,
               "--log-format", "json"]
        if self.netns:
            cmd = ["ip", "netns", "exec", self.netns, *cmd]
        self.front_log = self.dir / "front.log"
        self.front_proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=open(self.front_log, "a"),
                                           env=dict(os.environ, **(self.env or {})))

    def stop_front(self, sig: int = signal.SIGTERM) -> None:
        p = self.front_proc
        if p is None or p.poll() is not None:
            return
        p.send_signal(sig)
        try:
            p.wait(10)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()

    def ready(self, timeout: float = 30) -> "Node":
        def up():
            if self.proc.poll() is not None:
                raise AssertionError(f"{self.name} exited {self.proc.returncode}: {self.log.read_text()[-2000:]}")
            return self.cluster()
        wait_until(up, timeout, f"{self.name} to serve")
        if self.front:  # and its front to relay gossip (it dials the daemon's socket every half second)
            wait_until(lambda: "gossip relayed for the daemon" in self.front_log.read_text(), timeout,
                       f"{self.name}'s front to reach its daemon")
        return self

    def cluster(self) -> dict:
        with LocalClient(self.state, timeout=5) as c:
            return c.cluster()

    def members(self) -> dict[str, dict]:
        return {m["name"]: m for m in self.cluster()["members"]}

    def states(self) -> dict[str, str]:
        return {n: m["state"] for n, m in self.members().items()}

    def kill(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(10)
        self.stop_front(signal.SIGKILL)

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            self.stop_front()
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.stop_front()  # after the daemon: its leave notice goes out through the front
        if self.front:
            shutil.rmtree(self.front_dir.parent, ignore_errors=True)


def start_all(nodes: list[Node]) -> list[Node]:
    """Starts ``nodes`` and waits for each to serve; if one does not, stops them all before raising (a
    fixture that fails in its setup never reaches its teardown: its daemons outlived the test run)."""
    try:
        for n in nodes:
            n.start()
        for n in nodes:
            n.ready()
    except BaseException:
        for n in nodes:
            try:
                n.stop()
            except Exception:  # noqa: BLE001 - one that never started; the others are still stopped
                pass
        raise
    return nodes


def sees(node: Node, expect: dict[str, str]) -> bool:
    st = node.states()
    return all(st.get(k) == v for k, v in expect.items())
