"""A STAND-IN for kubelet's pod start (and the few control-plane steps around
it), for tests: it runs a DaemonSet's pods on this machine as real processes,
each in its own network namespace on a pod network, with the command,
arguments, environment, volumes and service-account token kubelet and a
container runtime would give them, on several "nodes" of one machine.

No kubelet or container runtime can run here, and the daemon under test is a
host process anyway (the repository's ``.venv``), so the "container" is the
host's own filesystem seen through a private mount namespace in which each
volume is bind-mounted at its ``mountPath``; the rest is as kubelet does it.

What it does:

* **The pod network** (:class:`PodNetwork`): a Linux bridge in the host's
  network namespace with ``10.<N>.0.1/24`` (N picked at random in 100..199,
  checked against every address and route of the host, under a lock file so
  that parallel test processes never pick the same N); per pod a network
  namespace (``ip netns add``), a veth pair into the bridge, the pod's IP
  ``10.<N>.0.<k>/24`` on ``eth0``, ``lo`` up, a default route via the bridge
  address, and an ``iptables`` OUTPUT filter in the pod's namespace so a pod
  reaches the other pods and the bridge address and nothing else. Where the
  host passes bridged traffic through iptables (``br_netfilter`` loaded with
  ``bridge-nf-call-iptables=1``, as Docker leaves it, with FORWARD DROP), one
  ACCEPT rule for this bridge is inserted in the host's FORWARD chain and
  removed at the end. Everything is removed by :meth:`PodNetwork.close` (also
  at interpreter exit), and leftovers of dead test processes (names carry
  the creator's pid) are swept at the next start.
* **Control-plane steps** kubelet relies on: the ServiceAccount admission
  plugin (:func:`install_serviceaccount_admission`: ``serviceAccountName``
  defaulted, the account must exist when the server serves ServiceAccounts,
  the ``kube-api-access-<random>`` projected volume and its read-only mount at
  ``/var/run/secrets/kubernetes.io/serviceaccount`` unless
  ``automountServiceAccountToken`` is false on the pod, else on the account),
  the ``default`` ServiceAccount and the ``kube-root-ca.crt`` ConfigMap
  (the serviceaccount and root-ca-cert-publisher controllers), the DaemonSet
  controller's pods (:meth:`PodRunner.pods_for`: ``generateName
  <ds>-``, the template's labels plus ``controller-revision-hash`` and
  ``pod-template-generation``, its annotations, ``ownerReferences`` to the
  DaemonSet (controller, blockOwnerDeletion), the required node affinity
  replaced by ``matchFields metadata.name In [node]``, the default
  tolerations (not-ready and unreachable NoExecute; disk-pressure,
  memory-pressure, pid-pressure, unschedulable NoSchedule; network-unavailable
  for hostNetwork pods), only for nodes whose labels and taints the template
  accepts, one pod a node), the default scheduler's bind (``pods/binding``),
  and the DaemonSet's status subresource (desired, current, ready,
  available after ``minReadySeconds``, updated numbers), kept current.
* **Kubelet**: the Node object (registered when missing: hostname, os and
  arch labels, InternalIP, Ready, every ``nodeInfo`` field); per pod a directory under the runner's
  root with the volumes laid out as kubelet lays them out: ``configMap``,
  ``secret``, ``downwardAPI`` and ``projected`` (``serviceAccountToken``,
  ``configMap``, ``secret``, ``downwardAPI``) written the way kubelet's
  AtomicWriter writes them (``..<timestamp>`` directory, ``..data`` symlink,
  one symlink per top-level name), all keys or ``items`` with ``path``, modes
  from ``mode`` or ``defaultMode`` (420 = 0644 by default), ``optional``
  honoured with kubelet's error texts, always mounted read-only;
  :meth:`PodRunner.refresh` re-projects them as kubelet's periodic sync would;
  ``hostPath`` through the test's ``host_path(node, path)`` mapping (so each
  node has its own ``/var/lib/...``) with ``type`` checked or created as
  kubelet does (``DirectoryOrCreate`` 0755, ``FileOrCreate`` 0644,
  ``Directory``, ``File``, ``Socket``, ``CharDevice``, ``BlockDevice``;
  an untyped missing path is created as a directory, as containerd does);
  ``emptyDir`` (a directory kept across container restarts); the
  service-account token from the stand-in's ``issue_token`` (or, on a server
  without it, an opaque token registered with ``add_token`` for
  ``system:serviceaccount:<ns>:<sa>``); a kubelet-managed ``/etc/hosts`` and
  ``/etc/hostname``; the UTS hostname = the pod's name.
  Environment as ``makeEnvironmentVariables`` builds it: ``envFrom``
  (configMapRef/secretRef, ``prefix``, ``optional``, invalid names skipped
  with an ``InvalidEnvironmentVariableNames`` event), then ``env`` in order
  (``value`` with ``$(VAR)`` expansion against the variables declared so far
  and the service variables, ``fieldRef``, ``resourceFieldRef``,
  ``configMapKeyRef``, ``secretKeyRef``), then the service-link variables
  (``KUBERNETES_SERVICE_HOST``/``_PORT``/``_PORT_HTTPS`` and the docker-link
  ``KUBERNETES_PORT*`` always, the other Services of the namespace while
  ``enableServiceLinks``), over the runtime's image environment,
  ``HOSTNAME`` and (runc's) ``HOME=/root``. ``command``/``args`` expanded with kubelet's exact rules
  (:func:`expand`) and combined with the image's entrypoint/cmd as runtimes
  do. Container start: ``ip netns exec <pod-ns> unshare --mount --uts
  --propagation private`` runs this file as a tiny init that bind-mounts
  (recursively) every mount, shallowest first, remounts read-only where
  asked, sets the hostname, changes to ``workingDir`` and execs the command
  with exactly that environment (``PATH`` from the image mapping). A mount
  point missing on the host is never created on the host: its deepest
  existing host directory is first covered, inside the pod's mount namespace
  only, by a tmpfs on which every entry of the original is bind-mounted back
  (so ``/etc/hamid`` appears inside while ``/etc`` keeps its content and the
  host is untouched); only a missing top-level directory (``/data``) is made
  on the host, and removed at the end. Errors before the exec come back over a
  sync pipe (as runc's) and fail :meth:`PodRunner.start` with the reason.
  One process group (session) per container; logs (stdout and stderr) to a
  file per container (:meth:`PodRunner.logs`); kubelet's status writes through
  ``pods/status`` (``podIP(s)``, ``hostIP(s)``, ``startTime``, phase,
  ``containerStatuses`` with state, lastState, restartCount, ready, started,
  the conditions PodReadyToStartContainers, Initialized, ContainersReady,
  Ready, PodScheduled); startup, readiness and liveness probes
  (``tcpSocket``, ``httpGet``, ``exec``; ``initialDelaySeconds``,
  ``periodSeconds``, ``timeoutSeconds``, ``successThreshold``,
  ``failureThreshold`` honoured, a liveness failure kills and restarts the
  container); restarts by ``restartPolicy`` with kubelet's back-off (at once,
  then 10 s doubling to 300 s; ``backoff=`` and ``max_probe_period=``
  shorten the waits for tests); a pod
  deleted in the API is stopped (SIGTERM, SIGKILL after its grace) and its
  deletion finished, as kubelet does; ``init`` containers run to completion
  first; events (Created, Started, Killing, Unhealthy, BackOff, FailedMount).
* A ``kube-proxy``-like resolver for the API stand-in's webhook calls
  (:meth:`PodRunner.service_resolver`: a ready pod behind the Service, its
  named or numbered targetPort), a Service's NodePort on the host
  (:meth:`PodRunner.expose_node_port`, an endpoint chosen per connection),
  and, when the API server listens on loopback only, a TCP relay on the
  bridge address so pods still reach it.

What it does NOT do: images (the image name picks a ``PATH`` prefix, an
environment and files in :class:`Image`; the root filesystem is the host's),
cgroups and resource limits, a PID or IPC namespace (``/proc`` shows the
host), user namespaces, capabilities and seccomp (processes run as root,
as the chart's privileged pod does), DNS (no cluster DNS; ``*.svc`` names do
not resolve; ``/etc/resolv.conf`` is the host's), Service ClusterIPs (no
kube-proxy beyond the two relays above), hostNetwork pods,
``mountPropagation``, recursive read-only mounts (only the top mount of a
read-only ``hostPath`` is read-only), tmpfs-backed secret volumes (secret
files are plain files under the runner's root), ``emptyDir``
``medium``/``sizeLimit``, fsGroup and volume ownership, other volume kinds
(PVCs, CSI, ...), lifecycle hooks (postStart, preStop), grpc probes,
readiness gates, the termination-message file, ephemeral containers, token
rotation, image pull policies, the DaemonSet controller's loop (a deleted
pod is not recreated; call :meth:`PodRunner.pods_for` again), rolling
updates, node leases and Node status updates (one Node object at
registration; every node's InternalIP is the bridge address), and the
kube-scheduler's filters (pods are bound to the node the DaemonSet targets).
The pod's phase stays Running after :meth:`PodRunner.stop` of a
``restartPolicy: Always`` pod (kubelet would be deleting it); logs are plain
text, not the CRI log format. On the host it leaves only ``/run/hamid-podnet.lock``
(the lock file), and, while pods run, the top-level directories of mount
points that did not exist (removed by :meth:`PodRunner.close`).

Intended use (the lead's chart test; the API stand-in listens on the bridge;
the chart's ``nodeSelector`` is ``gpu: "on"``, its ``/dev`` and kubelet
hostPaths are ``type: Directory``)::

    with PodNetwork() as net, ApiServer(tls=True, host=net.gateway, authorize=True) as api:
        kubelets = {n: KubeletStandIn(Path(tempfile.mkdtemp(prefix="hk-")), node_name=n) for n in nodes}
        runner = PodRunner(api, net, tmp_path / "pods",
                           images={"*": Image(path=str(REPO / ".venv/bin"))},
                           host_path=lambda node, path: {
                               "/var/lib/kubelet/device-plugins": kubelets[node].root / "device-plugins",
                               "/var/lib/kubelet/pod-resources": kubelets[node].root / "pod-resources",
                               "/dev": "/dev",
                           }.get(path))   # None: the node's own directory, root/nodes/<node>/<path>
        with runner:
            api.webhooks.service_resolver = runner.service_resolver
            kubectl("apply", "-f", rendered_chart)
            for n in nodes:
                runner.register_node(n, labels={"gpu": "on"})
            pods = runner.pods_for(api.get("DaemonSet", "kube-system", "hamid"), nodes)
            for pod in pods:
                runner.start(pod)
            for pod in pods:
                runner.wait_ready(pod)                     # the chart's HTTPS readinessProbe on /healthz
            print(runner.logs(pods[0]))
            runner.kill(pods[0]); runner.restart(pods[0])  # SIGKILL, then the same pod's container again
            runner.expose_node_port("kube-system", "hamid-extender")   # extender mode: 127.0.0.1:31999

(Tried with the chart as it stands: both daemons found each other through
the pod list, gossiped over their pod IPs, registered with their node's
kubelet stand-in, served the webhook and elected a leader.)
"""

from __future__ import annotations

# Only the standard library at module level: this file is also the container
# init that runs inside each pod (``python -I podrunner.py --init ...``).
import base64
import contextlib
import copy
import ctypes
import datetime as _dt
import errno
import fcntl
import hashlib
import http.client
import ipaddress
import itertools
import json
import logging
import os
import random
import re
import secrets
import select
import shutil
import signal
import socket
import ssl
import stat
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

log = logging.getLogger("tests.k8s.podrunner")

# ---------------------------------------------------------------------------
# kubelet's $(VAR) expansion (third_party/forked/golang/expansion)

_OPERATOR, _OPENER, _CLOSER = "$", "(", ")"


def mapping_for(*contexts: Mapping[str, str]) -> Callable[[str], str]:
    """``MappingFuncFor``: the first context that has the name wins; an unknown
    name stays as written, ``$(NAME)``. The contexts are read at call time, so a
    dict that grows while env vars are resolved is seen growing, as in kubelet."""
    def mapping(name: str) -> str:
        for ctx in contexts:
            if name in ctx:
                return ctx[name]
        return _OPERATOR + _OPENER + name + _CLOSER
    return mapping


def _read_name(rest: str) -> tuple[str, bool, int]:
    """``tryReadVariableName``: (what was read, is it a variable name, bytes consumed)."""
    first = rest[0]
    if first == _OPERATOR:  # "$$": an escaped operator
        return _OPERATOR, False, 1
    if first == _OPENER:
        end = rest.find(_CLOSER, 1)
        if end >= 1:
            return rest[1:end], True, end + 1
        return _OPERATOR + _OPENER, False, 1  # no closer: left as written
    return _OPERATOR + first, False, 1  # "$x": not an expression


def expand(text: str, mapping: Callable[[str], str] | Mapping[str, str]) -> str:
    """``expansion.Expand``: ``$(NAME)`` is replaced through ``mapping``, ``$$`` is
    one ``$``, anything else (``$x``, a lone trailing ``$``, ``$(`` without a
    closer) is copied unchanged."""
    if not callable(mapping):
        mapping = mapping_for(mapping)
    out: list[str] = []
    checkpoint, cursor, n = 0, 0, len(text)
    while cursor < n:
        if text[cursor] == _OPERATOR and cursor + 1 < n:
            out.append(text[checkpoint:cursor])
            read, is_var, advance = _read_name(text[cursor + 1:])
            out.append(mapping(read) if is_var else read)
            cursor += advance
            checkpoint = cursor + 1
        cursor += 1
    return "".join(out) + text[checkpoint:]


# ---------------------------------------------------------------------------
# the container init: runs inside the pod's network namespace, in a fresh
# private mount and UTS namespace, then execs the container's command

_MS_RDONLY, _MS_REMOUNT, _MS_BIND, _MS_REC = 1, 32, 4096, 16384


def _mount(src: str | None, dst: str, fstype: str | None, flags: int, data: str | None = None) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_char_p]
    def enc(s: str | None) -> bytes | None:
        return None if s is None else os.fsencode(s)
    if libc.mount(enc(src), enc(dst), enc(fstype), flags, enc(data)) != 0:
        e = ctypes.get_errno()
        raise OSError(e, f"mount {src or fstype} on {dst}: {os.strerror(e)}")


def _under(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip("/") + "/")


class _MountNamespace:
    """The init's view: which directories it may create entries in without
    touching the host (under the runner's root, inside volumes whose source is
    under it, tmpfs mirrors it made and directories it created in them)."""

    def __init__(self, owned: list[str]):
        self.prefixes = list(owned)  # anything below is the runner's own
        self.exact: set[str] = set()  # mirror roots and directories made inside them

    def writable(self, d: str) -> bool:
        return d in self.exact or any(_under(d, p) for p in self.prefixes)

    def mirror(self, d: str) -> None:
        """Cover ``d`` with a tmpfs that shows ``d``'s entries (bind mounts of the
        originals, symlinks recreated), so new entries can be made in it."""
        if d == "/":
            raise OSError(errno.EPERM, "the init will not cover / (the runner makes missing top-level "
                                       "directories on the host before the start)")
        fd = os.open(d, os.O_PATH | os.O_DIRECTORY)
        try:
            st = os.stat(d)
            base = f"/proc/self/fd/{fd}"
            names = os.listdir(base)
            _mount("tmpfs", d, "tmpfs", 0, f"mode={stat.S_IMODE(st.st_mode):o}")
            os.chown(d, st.st_uid, st.st_gid)
            for name in names:
                src, dst = f"{base}/{name}", f"{d}/{name}"
                lst = os.lstat(src)
                if stat.S_ISLNK(lst.st_mode):
                    os.symlink(os.readlink(src), dst)
                    continue
                if stat.S_ISDIR(lst.st_mode):
                    os.mkdir(dst)
                else:
                    os.close(os.open(dst, os.O_WRONLY | os.O_CREAT, 0o600))
                _mount(src, dst, None, _MS_BIND | _MS_REC)
        finally:
            os.close(fd)
        self.exact.add(d)

    def ensure(self, path: str, is_dir: bool) -> str:
        """The mount point ``path`` (symlinks resolved as on the host), created if
        missing, without changing anything outside this namespace."""
        real = os.path.realpath(path)
        anc, missing = real, []
        while not os.path.lexists(anc):
            missing.insert(0, os.path.basename(anc))
            anc = os.path.dirname(anc)
        if not missing:
            return real
        if not os.path.isdir(anc):
            raise NotADirectoryError(errno.ENOTDIR, f"mount point {path}: {anc} is not a directory")
        if not self.writable(anc):
            self.mirror(anc)
        cur = anc
        for i, name in enumerate(missing):
            cur = os.path.join(cur, name)
            if i == len(missing) - 1 and not is_dir:
                os.close(os.open(cur, os.O_WRONLY | os.O_CREAT, 0o644))
            else:
                os.mkdir(cur, 0o755)
                self.exact.add(cur)
        return real


def _init_main(spec_path: str, sync_fd: int) -> None:
    """Set the container up as runc would, then exec its process. Any failure is
    written to ``sync_fd`` (the runner reads it as the start error); a successful
    exec closes ``sync_fd`` (close-on-exec) with nothing written."""
    try:
        with open(spec_path) as f:
            spec = json.load(f)
        os.unlink(spec_path)  # it holds the environment (secrets): gone once read
        socket.sethostname(spec["hostname"])
        ns = _MountNamespace(spec["owned"])
        for m in sorted(spec["mounts"], key=lambda m: len(Path(m["dst"]).parts)):
            dst = ns.ensure(m["dst"], not m["file"])
            _mount(m["src"], dst, None, _MS_BIND | _MS_REC)
            if m["ro"]:
                _mount(None, dst, None, _MS_BIND | _MS_REMOUNT | _MS_RDONLY)
            if any(_under(m["src"], o) for o in spec["owned"]) and not m["file"]:
                ns.prefixes.append(dst)
        cwd = ns.ensure(spec["cwd"], True)
        os.chdir(cwd)
        os.set_inheritable(sync_fd, False)
        argv, env = spec["argv"], spec["env"]
        try:
            os.execvpe(argv[0], argv, env)
        except OSError as e:
            where = f"in $PATH ({env.get('PATH', '')})" if "/" not in argv[0] else ""
            raise OSError(e.errno, f'exec: "{argv[0]}": {e.strerror} {where}'.rstrip()) from None
    except BaseException as e:  # noqa: BLE001 - everything goes back to the runner
        msg = f"{type(e).__name__}: {e}" if not isinstance(e, OSError) else str(e)
        try:
            os.write(sync_fd, msg.encode(errors="replace"))
        finally:
            os._exit(128)


# ---------------------------------------------------------------------------
# the pod network

_SYS_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
_LOCK = "/run/hamid-podnet.lock"
_NET_LETTERS = itertools.count()


def _run(*cmd: str, stdin: str | None = None, check: bool = True) -> subprocess.CompletedProcess:
    out = subprocess.run(cmd, input=stdin, capture_output=True, text=True, timeout=30,
                         env={"PATH": _SYS_PATH, "LC_ALL": "C"})
    if check and out.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({out.returncode}): {out.stderr.strip()}")
    return out


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _netns_kill(ns: str) -> None:
    """SIGKILL every process still in our pod namespace ``ns`` (only ever started by a runner)."""
    out = _run("ip", "netns", "pids", ns, check=False)
    for line in out.stdout.split():
        with contextlib.suppress(ProcessLookupError, ValueError):
            os.kill(int(line), signal.SIGKILL)


def _sweep_stale() -> None:
    """Remove the bridges and pod namespaces of test processes that died without closing."""
    for line in _run("ip", "netns", "list", check=False).stdout.splitlines():
        m = re.match(r"^hpr-(\d+)[a-z]-\d+\b", line)
        if m and not _alive(int(m.group(1))):
            name = line.split()[0]
            _netns_kill(name)
            _run("ip", "netns", "del", name, check=False)
    for line in _run("ip", "-o", "link", "show", "type", "bridge", check=False).stdout.splitlines():
        m = re.match(r"^\d+:\s+(hpb(\d+)[a-z])[:@]", line)
        if m and not _alive(int(m.group(2))):
            _run("ip", "link", "del", m.group(1), check=False)
            _run("iptables", "-w", "-D", "FORWARD", "-i", m.group(1), "-o", m.group(1), "-j", "ACCEPT",
                 check=False)


def _host_networks() -> list[ipaddress.IPv4Network]:
    nets = []
    for line in _run("ip", "-o", "-4", "addr", "show", check=False).stdout.splitlines():
        m = re.search(r"\binet (\S+)", line)
        if m:
            nets.append(ipaddress.ip_interface(m.group(1)).network)
    for line in _run("ip", "-4", "route", "show", "table", "all", check=False).stdout.splitlines():
        first = line.split()[0] if line.split() else ""
        if first in ("local", "broadcast", "unreachable", "blackhole", "prohibit", "throw"):
            first = line.split()[1]
        with contextlib.suppress(ValueError):
            if first != "default":
                nets.append(ipaddress.ip_network(first, strict=False))
    return nets


@dataclass
class Sandbox:
    """A pod's network: its namespace (``ip netns``), its address, the host end of its veth."""

    netns: str
    ip: str
    veth: str
    index: int


class PodNetwork:
    """The pod network: a bridge with ``gateway`` = 10.<N>.0.1/24 in the host's
    namespace, one namespace per pod (:meth:`add_pod`). ``with PodNetwork() as net:``
    or :meth:`start`/:meth:`close`. ``octet`` forces N (else random in 100..199)."""

    def __init__(self, *, octet: int | None = None):
        if octet is not None and not 1 <= octet <= 254:
            raise ValueError(f"octet {octet}: the second octet of 10.<N>.0.0/24 must be in 1..254")
        self.octet = octet
        letter = chr(ord("a") + next(_NET_LETTERS) % 26)
        self.tag = f"{os.getpid()}{letter}"
        self.bridge = f"hpb{self.tag}"
        self.sandboxes: dict[str, Sandbox] = {}
        self.egress_filter = shutil.which("iptables", path=_SYS_PATH) is not None
        self._forward_rule = False
        self._lock = threading.Lock()
        self._started = False

    # -- lifecycle

    @staticmethod
    def missing_tools() -> list[str]:
        """What a pod network needs and this machine lacks (the tests skip with it)."""
        need = [t for t in ("ip", "unshare", "nsenter") if shutil.which(t, path=_SYS_PATH) is None]
        if os.geteuid() != 0:
            need.insert(0, "root")
        return need

    def start(self) -> "PodNetwork":
        if self._started:
            return self
        if self.missing_tools():
            raise RuntimeError(f"a pod network needs {', '.join(self.missing_tools())}")
        _sweep_stale()
        try:
            with open(_LOCK, "a") as lock:
                fcntl.flock(lock, fcntl.LOCK_EX)
                if self.octet is None:
                    self.octet = self._pick()
                _run("ip", "link", "add", self.bridge, "type", "bridge")
                self._started = True
                _run("ip", "addr", "add", f"{self.gateway}/24", "dev", self.bridge)
                _run("ip", "link", "set", self.bridge, "up")
            self._allow_bridged_forwarding()
        except BaseException:
            self.close()
            raise
        import atexit
        atexit.register(self.close)
        log.info("pod network %s on %s", self.subnet, self.bridge)
        return self

    def _pick(self) -> int:
        used = _host_networks()
        for octet in random.sample(range(100, 200), 100):
            net = ipaddress.ip_network(f"10.{octet}.0.0/24")
            if not any(net.overlaps(u) for u in used):
                return octet
        raise RuntimeError("no free 10.<N>.0.0/24 for a pod network (N in 100..199 all in use)")

    def _allow_bridged_forwarding(self) -> None:
        with contextlib.suppress(OSError):
            if Path("/proc/sys/net/bridge/bridge-nf-call-iptables").read_text().strip() == "1":
                _run("iptables", "-w", "-I", "FORWARD", "-i", self.bridge, "-o", self.bridge, "-j", "ACCEPT")
                self._forward_rule = True

    def close(self) -> None:
        """Remove every pod namespace (killing what still runs in it) and the bridge. Idempotent."""
        for key in list(self.sandboxes):
            with contextlib.suppress(Exception):
                self.remove_pod(key)
        if self._forward_rule:
            _run("iptables", "-w", "-D", "FORWARD", "-i", self.bridge, "-o", self.bridge, "-j", "ACCEPT",
                 check=False)
            self._forward_rule = False
        if self._started:
            _run("ip", "link", "del", self.bridge, check=False)
            self._started = False

    def __enter__(self) -> "PodNetwork":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.close()

    # -- addresses

    @property
    def gateway(self) -> str:
        """The bridge's address: the host as the pods see it."""
        return f"10.{self.octet}.0.1"

    @property
    def subnet(self) -> str:
        return f"10.{self.octet}.0.0/24"

    # -- pods

    def add_pod(self, key: str) -> Sandbox:
        """A namespace for the pod ``key`` (any unique string), wired into the bridge."""
        if not self._started:
            raise RuntimeError("the pod network is not started (PodNetwork.start())")
        with self._lock:
            if key in self.sandboxes:
                raise ValueError(f"pod {key!r} already has a sandbox ({self.sandboxes[key].ip})")
            taken = {s.index for s in self.sandboxes.values()}
            free = [k for k in range(2, 255) if k not in taken]
            if not free:
                raise RuntimeError(f"the pod network {self.subnet} is full (253 pods)")
            k = free[0]
            sb = Sandbox(netns=f"hpr-{self.tag}-{k}", ip=f"10.{self.octet}.0.{k}", veth=f"hpv{self.tag}{k}",
                         index=k)
            self.sandboxes[key] = sb
        try:
            _run("ip", "netns", "add", sb.netns)
            _run("ip", "link", "add", sb.veth, "type", "veth", "peer", "name", "eth0", "netns", sb.netns)
            _run("ip", "link", "set", sb.veth, "master", self.bridge, "up")
            _run("ip", "-n", sb.netns, "addr", "add", f"{sb.ip}/24", "dev", "eth0")
            _run("ip", "-n", sb.netns, "link", "set", "lo", "up")
            _run("ip", "-n", sb.netns, "link", "set", "eth0", "up")
            _run("ip", "-n", sb.netns, "route", "add", "default", "via", self.gateway)
            if self.egress_filter:
                rules = ("*filter\n:INPUT ACCEPT [0:0]\n:FORWARD ACCEPT [0:0]\n:OUTPUT ACCEPT [0:0]\n"
                         "-A OUTPUT -o lo -j ACCEPT\n"
                         f"-A OUTPUT -d {self.subnet} -j ACCEPT\n"
                         "-A OUTPUT -j REJECT --reject-with icmp-net-unreachable\nCOMMIT\n")
                _run("ip", "netns", "exec", sb.netns, "iptables-restore", stdin=rules)
        except BaseException:
            with contextlib.suppress(Exception):
                self.remove_pod(key)
            raise
        return sb

    def remove_pod(self, key: str) -> None:
        with self._lock:
            sb = self.sandboxes.pop(key, None)
        if sb is None:
            return
        _netns_kill(sb.netns)
        _run("ip", "netns", "del", sb.netns, check=False)
        _run("ip", "link", "del", sb.veth, check=False)  # gone with the namespace; in case it was not


class _Relay:
    """A TCP relay ``listen`` -> ``target`` (threads), standing in for kube-proxy:
    the path to the API server when the stand-in listens on loopback only, and a
    Service's NodePort. ``target`` is an address or a function giving one per
    connection (a connection it cannot place is closed)."""

    def __init__(self, listen: tuple[str, int],
                 target: tuple[str, int] | Callable[[], tuple[str, int]]):
        self.target = target
        self.sock = socket.create_server(listen, reuse_port=False)
        self.address = self.sock.getsockname()[:2]
        self._stop = False
        threading.Thread(target=self._accept, name="podrunner-relay", daemon=True).start()

    def _accept(self) -> None:
        while not self._stop:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        try:
            target = self.target() if callable(self.target) else self.target
            up = socket.create_connection(target, timeout=10)
            up.settimeout(None)
        except Exception:  # no endpoint, or it refused: as kube-proxy's REJECT, the client is cut off
            conn.close()
            return
        peer = {conn: up, up: conn}
        reading = {conn, up}
        try:
            while reading:
                ready, _, _ = select.select(list(reading), [], [], 1.0)
                for s in ready:
                    data = s.recv(65536)
                    if not data:
                        reading.discard(s)
                        with contextlib.suppress(OSError):
                            peer[s].shutdown(socket.SHUT_WR)
                        continue
                    peer[s].sendall(data)
        except OSError:
            pass
        finally:
            conn.close()
            up.close()

    def close(self) -> None:
        self._stop = True
        with contextlib.suppress(OSError):
            self.sock.close()


# ---------------------------------------------------------------------------
# errors


class PodStartError(RuntimeError):
    """A pod or container could not start (what kubelet reports as FailedMount,
    CreateContainerConfigError, RunContainerError...): the message says why."""


def _is_api_error(e: BaseException, code: int) -> bool:
    return getattr(e, "code", None) == code


def _now() -> str:
    return _dt.datetime.now(_dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _served(api, kind: str) -> bool:
    try:
        api.type_for(kind)
        return True
    except KeyError:
        return False


# ---------------------------------------------------------------------------
# the ServiceAccount admission plugin (plugin/pkg/admission/serviceaccount)

SERVICE_ACCOUNT_MOUNT = "/var/run/secrets/kubernetes.io/serviceaccount"
_NAME_ALPHABET = "bcdfghjklmnpqrstvwxz2456789"  # k8s.io/apimachinery/pkg/util/rand


def _random_suffix(n: int = 5) -> str:
    return "".join(secrets.choice(_NAME_ALPHABET) for _ in range(n))


def token_volume_source() -> dict:
    """``TokenVolumeSource()``: what the plugin mounts (kube-api-access-<random>)."""
    return {"defaultMode": 420, "sources": [
        {"serviceAccountToken": {"expirationSeconds": 3607, "path": "token"}},
        {"configMap": {"name": "kube-root-ca.crt", "items": [{"key": "ca.crt", "path": "ca.crt"}]}},
        {"downwardAPI": {"items": [{"path": "namespace",
                                    "fieldRef": {"apiVersion": "v1", "fieldPath": "metadata.namespace"}}]}},
    ]}


def _lookup_service_account(api, ns: str, name: str, pod_name: str) -> dict | None:
    """The ServiceAccount (None when the server does not serve the kind). The
    ``default`` one is created when missing, as the serviceaccounts controller
    would have done when the namespace appeared."""
    if not _served(api, "ServiceAccount"):
        return None
    try:
        return api.get("ServiceAccount", ns, name)
    except Exception as e:
        if not _is_api_error(e, 404):
            raise
    if name == "default":
        with contextlib.suppress(Exception):
            api.create({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "default", "namespace": ns}})
        return api.get("ServiceAccount", ns, name)
    from apiserver import ApiError
    raise ApiError(403, "Forbidden", f'pods "{pod_name}" is forbidden: error looking up service account {ns}/{name}: '
                                     f'serviceaccount "{name}" not found',
                   {"name": pod_name, "kind": "pods"})


def serviceaccount_admission(api) -> Callable:
    """The plugin as an :attr:`ApiServer.admission_hooks` hook (pods, CREATE)."""
    def hook(rt, operation: str, obj: dict, old: dict | None) -> dict:
        if rt.kind != "Pod" or rt.group != "" or operation != "CREATE":
            return obj
        meta = obj.get("metadata") or {}
        if "kubernetes.io/config.mirror" in (meta.get("annotations") or {}):
            return obj
        spec = obj.setdefault("spec", {})
        ns = meta.get("namespace") or "default"
        sa_name = spec.get("serviceAccountName") or "default"
        spec["serviceAccountName"] = sa_name
        sa = _lookup_service_account(api, ns, sa_name, meta.get("name") or "")
        automount = spec.get("automountServiceAccountToken")
        if automount is None:
            automount = (sa or {}).get("automountServiceAccountToken")
        if automount is None:
            automount = True
        if automount:
            _mount_service_account_token(spec)
        if not spec.get("imagePullSecrets") and sa and sa.get("imagePullSecrets"):
            spec["imagePullSecrets"] = [{"name": s.get("name", "")} for s in sa["imagePullSecrets"]]
        return obj
    hook.podrunner_serviceaccount = True  # type: ignore[attr-defined]
    return hook


def _mount_service_account_token(spec: dict) -> None:
    volumes = spec.get("volumes") or []
    name = next((v["name"] for v in volumes if str(v.get("name", "")).startswith("kube-api-access-")), None)
    has_volume = name is not None
    name = name or "kube-api-access-" + _random_suffix()
    needed = False
    for group in ("initContainers", "containers"):
        for c in spec.get(group) or []:
            mounts = c.setdefault("volumeMounts", [])
            if not any(m.get("mountPath") == SERVICE_ACCOUNT_MOUNT for m in mounts):
                mounts.append({"name": name, "readOnly": True, "mountPath": SERVICE_ACCOUNT_MOUNT})
                needed = True
    if needed and not has_volume:
        spec["volumes"] = [*volumes, {"name": name, "projected": token_volume_source()}]


def install_serviceaccount_admission(api) -> None:
    """Add the plugin to ``api.admission_hooks`` once (a second call does nothing)."""
    if not any(getattr(h, "podrunner_serviceaccount", False) for h in api.admission_hooks):
        api.admission_hooks.append(serviceaccount_admission(api))


# ---------------------------------------------------------------------------
# the DaemonSet controller's pods (pkg/controller/daemon)

DAEMONSET_TOLERATIONS: tuple[dict, ...] = (
    {"key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoExecute"},
    {"key": "node.kubernetes.io/unreachable", "operator": "Exists", "effect": "NoExecute"},
    {"key": "node.kubernetes.io/disk-pressure", "operator": "Exists", "effect": "NoSchedule"},
    {"key": "node.kubernetes.io/memory-pressure", "operator": "Exists", "effect": "NoSchedule"},
    {"key": "node.kubernetes.io/pid-pressure", "operator": "Exists", "effect": "NoSchedule"},
    {"key": "node.kubernetes.io/unschedulable", "operator": "Exists", "effect": "NoSchedule"},
)
HOST_NETWORK_TOLERATION = {"key": "node.kubernetes.io/network-unavailable", "operator": "Exists",
                           "effect": "NoSchedule"}


def _tol_key(t: Mapping) -> tuple:
    return (t.get("key", ""), t.get("operator") or "Equal", t.get("value", ""), t.get("effect", ""))


def add_or_update_toleration(spec: dict, toleration: dict) -> None:
    """``AddOrUpdateTolerationInPodSpec``: one with the same key, operator, value
    and effect is replaced (kept when equal), otherwise it is appended."""
    out, updated = [], False
    for t in spec.get("tolerations") or []:
        if _tol_key(t) == _tol_key(toleration):
            if t == toleration:
                return
            out.append(dict(toleration))
            updated = True
            continue
        out.append(t)
    if not updated:
        out.append(dict(toleration))
    spec["tolerations"] = out


def _fnv32a(data: bytes) -> int:
    h = 0x811C9DC5
    for b in data:
        h = ((h ^ b) * 0x01000193) & 0xFFFFFFFF
    return h


def revision_hash(template: dict, collision_count: int | None = None) -> str:
    """A stable ``controller-revision-hash`` for a template (fnv32a, encoded as
    ``rand.SafeEncodeString``); kube's own value hashes the Go struct's dump, so the
    string differs from a real cluster's, its role is the same."""
    data = json.dumps(template, sort_keys=True, separators=(",", ":")).encode()
    if collision_count:
        data += str(collision_count).encode()
    return "".join(_NAME_ALPHABET[ord(ch) % len(_NAME_ALPHABET)] for ch in str(_fnv32a(data)))


def daemonset_pod(ds: dict, node: str) -> dict:
    """The Pod the DaemonSet controller creates for ``node`` (before the
    scheduler binds it): ``CreatePodTemplate`` + ``ReplaceDaemonSetPodNodeNameNodeAffinity``
    + ``GetPodFromTemplate``."""
    meta, spec = ds["metadata"], ds.get("spec") or {}
    template = copy.deepcopy(spec.get("template") or {})
    tmeta, pspec = template.get("metadata") or {}, template.get("spec") or {}
    labels = dict(tmeta.get("labels") or {})
    generation = (meta.get("annotations") or {}).get("deprecated.daemonset.template.generation") \
        or str(meta.get("generation") or 1)
    labels["pod-template-generation"] = str(generation)
    labels["controller-revision-hash"] = revision_hash(spec.get("template") or {},
                                                       (ds.get("status") or {}).get("collisionCount"))
    for t in DAEMONSET_TOLERATIONS:
        add_or_update_toleration(pspec, t)
    if pspec.get("hostNetwork"):
        add_or_update_toleration(pspec, HOST_NETWORK_TOLERATION)
    term = {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node]}]}
    na = pspec.setdefault("affinity", {}).setdefault("nodeAffinity", {})
    na.setdefault("requiredDuringSchedulingIgnoredDuringExecution", {})["nodeSelectorTerms"] = [term]
    pod_meta = {"generateName": f"{meta['name']}-", "namespace": meta.get("namespace", "default"),
                "labels": labels,
                "ownerReferences": [{"apiVersion": "apps/v1", "kind": "DaemonSet", "name": meta["name"],
                                     "uid": meta.get("uid", ""), "controller": True, "blockOwnerDeletion": True}]}
    if tmeta.get("annotations"):
        pod_meta["annotations"] = dict(tmeta["annotations"])
    if tmeta.get("finalizers"):
        pod_meta["finalizers"] = list(tmeta["finalizers"])
    return {"apiVersion": "v1", "kind": "Pod", "metadata": pod_meta, "spec": pspec}


def _requirement_ok(req: Mapping, value: str | None) -> bool:
    op, values = req.get("operator"), req.get("values") or []
    if op == "In":
        return value is not None and value in values
    if op == "NotIn":
        return value is None or value not in values
    if op == "Exists":
        return value is not None
    if op == "DoesNotExist":
        return value is None
    if op in ("Gt", "Lt"):
        try:
            v, bound = int(value or ""), int(values[0])
        except (ValueError, IndexError):
            return False
        return v > bound if op == "Gt" else v < bound
    raise ValueError(f"node selector operator {op!r}: accepted In, NotIn, Exists, DoesNotExist, Gt, Lt")


def _tolerates(t: Mapping, taint: Mapping) -> bool:
    if t.get("effect") and t["effect"] != taint.get("effect"):
        return False
    if (t.get("operator") or "Equal") == "Exists":
        return not t.get("key") or t["key"] == taint.get("key")
    return t.get("key", "") == taint.get("key") and t.get("value", "") == taint.get("value", "")


def daemon_should_run(ds: dict, node: dict) -> tuple[bool, str]:
    """``NodeShouldRunDaemonPod``'s predicates: the template's node selector and
    required node affinity match the node, and its tolerations (with the
    DaemonSet defaults) cover the node's NoSchedule and NoExecute taints."""
    pspec = copy.deepcopy(((ds.get("spec") or {}).get("template") or {}).get("spec") or {})
    labels = (node.get("metadata") or {}).get("labels") or {}
    name = node["metadata"]["name"]
    for k, v in (pspec.get("nodeSelector") or {}).items():
        if labels.get(k) != v:
            return False, f"node selector {k}={v} does not match"
    terms = (((pspec.get("affinity") or {}).get("nodeAffinity") or {})
             .get("requiredDuringSchedulingIgnoredDuringExecution") or {}).get("nodeSelectorTerms")
    if terms:
        def term_ok(term: Mapping) -> bool:
            exprs, fields = term.get("matchExpressions") or [], term.get("matchFields") or []
            if not exprs and not fields:
                return False
            return (all(_requirement_ok(r, labels.get(r.get("key"))) for r in exprs)
                    and all(_requirement_ok(r, name if r.get("key") == "metadata.name" else None) for r in fields))
        if not any(term_ok(t) for t in terms):
            return False, "required node affinity does not match"
    for t in DAEMONSET_TOLERATIONS:
        add_or_update_toleration(pspec, t)
    for taint in (node.get("spec") or {}).get("taints") or []:
        if taint.get("effect") in ("NoSchedule", "NoExecute") and \
                not any(_tolerates(t, taint) for t in pspec.get("tolerations") or []):
            return False, f"taint {taint.get('key')}={taint.get('value', '')}:{taint.get('effect')} not tolerated"
    return True, ""


# ---------------------------------------------------------------------------
# kubelet's volume layout

def _check_relative(path: str, what: str) -> None:
    """kubelet's ``validatePath`` for payload paths and subPaths."""
    if not path:
        raise PodStartError(f"{what}: the path is empty")
    if path.startswith("/"):
        raise PodStartError(f"{what}: invalid path {path!r}: must not be absolute")
    if ".." in path.split("/"):
        raise PodStartError(f"{what}: invalid path {path!r}: must not contain '..'")


def atomic_write(target: Path, payload: Mapping[str, tuple[bytes, int]]) -> None:
    """kubelet's AtomicWriter: the files in a fresh ``..<timestamp>`` directory,
    ``..data`` switched to it by one rename, a ``name -> ..data/name`` symlink per
    top-level name; old generations and names no longer in the payload removed."""
    target.mkdir(parents=True, exist_ok=True)
    for rel in payload:
        _check_relative(rel, f"volume {target.name}")
    stamp = _dt.datetime.now(_dt.UTC).strftime("..%Y_%m_%d_%H_%M_%S.")
    gen = target / f"{stamp}{random.randrange(10**9):09d}"
    gen.mkdir(mode=0o755)
    os.chmod(gen, 0o755)
    for rel, (data, mode) in payload.items():
        path = gen / rel
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o755)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.chmod(path, mode)
    tmp = target / "..data_tmp"
    with contextlib.suppress(FileNotFoundError):
        tmp.unlink()
    os.symlink(gen.name, tmp)
    os.rename(tmp, target / "..data")
    wanted = {rel.split("/")[0] for rel in payload}
    for name in wanted:
        if not (target / name).is_symlink():
            os.symlink(f"..data/{name}", target / name)
    for entry in target.iterdir():
        if entry.name.startswith(".."):
            if entry.name not in ("..data", gen.name) and entry.is_dir() and not entry.is_symlink():
                shutil.rmtree(entry)
        elif entry.is_symlink() and entry.name not in wanted:
            entry.unlink()


def _format_map(m: Mapping[str, str]) -> str:
    """fieldpath's ``formatMap``: sorted ``key="value"`` lines (Go's %q)."""
    return "\n".join(f"{k}={json.dumps(m[k], ensure_ascii=False)}" for k in sorted(m))


_SUBSCRIPT = re.compile(r"^metadata\.(labels|annotations)\['(.+)'\]$")
ENV_FIELDS = ("metadata.name", "metadata.namespace", "metadata.uid", "metadata.labels['<KEY>']",
              "metadata.annotations['<KEY>']", "spec.nodeName", "spec.serviceAccountName", "status.hostIP",
              "status.hostIPs", "status.podIP", "status.podIPs")
VOLUME_FIELDS = ("metadata.name", "metadata.namespace", "metadata.uid", "metadata.labels", "metadata.annotations",
                 "metadata.labels['<KEY>']", "metadata.annotations['<KEY>']")


def pod_field(pod: dict, path: str, *, pod_ip: str, host_ip: str, for_env: bool = True) -> str:
    """The value of a downward-API ``fieldRef`` (kubelet's ``podFieldSelectorRuntimeValue``
    for env, ``fieldpath.ExtractFieldPathAsString`` for volumes)."""
    meta, spec = pod.get("metadata") or {}, pod.get("spec") or {}
    m = _SUBSCRIPT.match(path)
    if m:
        return str((meta.get(m.group(1)) or {}).get(m.group(2), ""))
    simple = {"metadata.name": meta.get("name", ""), "metadata.namespace": meta.get("namespace", ""),
              "metadata.uid": meta.get("uid", "")}
    if path in simple:
        return simple[path]
    if not for_env and path in ("metadata.labels", "metadata.annotations"):
        return _format_map(meta.get(path.split(".")[1]) or {})
    if for_env:
        env_only = {"spec.nodeName": spec.get("nodeName", ""),
                    "spec.serviceAccountName": spec.get("serviceAccountName", ""),
                    "status.podIP": pod_ip, "status.podIPs": pod_ip, "status.hostIP": host_ip,
                    "status.hostIPs": host_ip}
        if path in env_only:
            return env_only[path]
    accepted = ENV_FIELDS if for_env else VOLUME_FIELDS
    raise PodStartError(f"fieldRef {path!r} is not supported{' in env' if for_env else ' in a volume'}: "
                        f"accepted {', '.join(accepted)}")


def resource_field(pod: dict, container: str, ref: Mapping, node_allocatable: Mapping[str, str]) -> str:
    """A ``resourceFieldRef``'s value (``ExtractContainerResourceValue``): a limit
    the container does not set is the node's allocatable; divided by ``divisor``,
    rounded up (cpu in millis)."""
    from fractions import Fraction
    from math import ceil

    from hamid.request.quantity import quantity
    name = ref.get("containerName") or container
    c = next((c for c in (pod.get("spec") or {}).get("containers") or [] if c.get("name") == name), None)
    if c is None:
        raise PodStartError(f"resourceFieldRef: no container {name!r} in the pod")
    kind, _, res = str(ref.get("resource", "")).partition(".")
    if kind not in ("limits", "requests") or not (res in ("cpu", "memory", "ephemeral-storage")
                                                  or res.startswith("hugepages-")):
        raise PodStartError(f"resourceFieldRef resource {ref.get('resource')!r}: accepted limits.cpu, "
                            f"limits.memory, limits.ephemeral-storage, requests.* of the same, hugepages-*")
    value = ((c.get("resources") or {}).get(kind) or {}).get(res)
    if value is None:
        value = node_allocatable.get(res, "0") if kind == "limits" else "0"
    divisor = quantity(ref.get("divisor") or "1")
    q = quantity(value)
    if res == "cpu":
        return str(ceil(Fraction(ceil(q * 1000), ceil(divisor * 1000))))
    return str(ceil(Fraction(ceil(q), ceil(divisor))))


_ENV_NAME = re.compile(r"^[-._a-zA-Z][-._a-zA-Z0-9]*$")


def _env_var_name(name: str) -> str:
    return name.upper().replace("-", "_")


def service_env(services: Iterable[dict]) -> dict[str, str]:
    """``envvars.FromServices``: ``<NAME>_SERVICE_HOST``/``_PORT``/``_PORT_<PORTNAME>``
    and the docker-link ``<NAME>_PORT*`` variables of every service with a ClusterIP."""
    env: dict[str, str] = {}
    for svc in services:
        spec = svc.get("spec") or {}
        ip, ports = spec.get("clusterIP"), spec.get("ports") or []
        if not ip or ip == "None" or not ports:
            continue
        prefix = _env_var_name(svc["metadata"]["name"])
        env[f"{prefix}_SERVICE_HOST"] = ip
        env[f"{prefix}_SERVICE_PORT"] = str(ports[0]["port"])
        for p in ports:
            if p.get("name"):
                env[f"{prefix}_SERVICE_PORT_{_env_var_name(p['name'])}"] = str(p["port"])
        for i, p in enumerate(ports):
            proto = (p.get("protocol") or "TCP")
            hostport = f"[{ip}]:{p['port']}" if ":" in ip else f"{ip}:{p['port']}"
            url = f"{proto.lower()}://{hostport}"
            if i == 0:
                env[f"{prefix}_PORT"] = url
            pp = f"{prefix}_PORT_{p['port']}_{proto.upper()}"
            env[pp] = url
            env[f"{pp}_PROTO"] = proto.lower()
            env[f"{pp}_PORT"] = str(p["port"])
            env[f"{pp}_ADDR"] = ip
    return env


# ---------------------------------------------------------------------------
# the runner


@dataclass
class Image:
    """What an image name stands for here: ``path`` is put in front of the
    runtime's default PATH (e.g. the repository's ``.venv/bin``, which holds
    ``hamid``); ``env`` is the image's ENV; ``entrypoint``/``cmd`` its ENTRYPOINT
    and CMD (combined with the container's command/args as runtimes do);
    ``working_dir`` its WORKDIR; ``files`` maps paths inside the container to
    files or directories on this machine, bind-mounted read-only (the image's
    own content, e.g. ``/usr/lib/hamid/libvgpu.so``)."""

    path: str = ""
    env: Mapping[str, str] = field(default_factory=dict)
    entrypoint: tuple[str, ...] | list[str] = ()
    cmd: tuple[str, ...] | list[str] = ()
    working_dir: str = ""
    files: Mapping[str, str] = field(default_factory=dict)

    def path_env(self) -> str:
        return f"{self.path}:{_SYS_PATH}" if self.path else _SYS_PATH


@dataclass
class _Volume:
    name: str
    kind: str
    path: Path  # the directory (or file) on this machine
    read_only: bool = False  # configMap, secret, projected, downwardAPI: always


@dataclass
class _Container:
    spec: dict
    init: bool = False
    proc: subprocess.Popen | None = None
    container_id: str = ""
    started_at: str = ""
    started_mono: float = 0.0
    restart_count: int = 0
    ready: bool = False
    started: bool = False
    state: dict = field(default_factory=lambda: {"waiting": {"reason": "ContainerCreating"}})
    last_state: dict = field(default_factory=dict)
    stopped: bool = False  # stopped by the runner: not restarted by restartPolicy
    crashes: int = 0
    next_start: float | None = None
    probes_stop: threading.Event = field(default_factory=threading.Event)
    env: dict = field(default_factory=dict)

    @property
    def name(self) -> str:
        return self.spec["name"]

    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None


@dataclass
class _Pod:
    namespace: str
    name: str
    uid: str
    node: str
    dir: Path
    sandbox: Sandbox | None = None
    obj: dict = field(default_factory=dict)
    volumes: dict[str, _Volume] = field(default_factory=dict)
    containers: list[_Container] = field(default_factory=list)
    start_time: str = ""
    lock: threading.RLock = field(default_factory=threading.RLock)
    conditions: dict[str, tuple[str, str]] = field(default_factory=dict)  # type -> (status, lastTransitionTime)
    gone: bool = False
    terminating: bool = False

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"

    @property
    def ip(self) -> str:
        return self.sandbox.ip if self.sandbox else ""

    def container(self, name: str | None) -> _Container:
        if name is None:
            return self.containers[0]
        for c in self.containers:
            if c.name == name:
                return c
        raise KeyError(f"pod {self.key} has no container {name!r} (it has {[c.name for c in self.containers]})")


NODE_RESOURCES = {"cpu": "16", "memory": "64Gi", "pods": "110", "ephemeral-storage": "100Gi"}
_BOOT_ID = str(__import__("uuid").uuid4())


def _node_info(node: str) -> dict:
    """``status.nodeInfo`` as kubelet fills it (every field: clients' models require them)."""
    import uuid
    os_image = "Linux"
    with contextlib.suppress(OSError):
        for line in Path("/etc/os-release").read_text().splitlines():
            if line.startswith("PRETTY_NAME="):
                os_image = line.split("=", 1)[1].strip('"')
    ident = uuid.uuid5(uuid.NAMESPACE_DNS, f"{node}.podrunner.hamid")
    return {"machineID": ident.hex, "systemUUID": str(ident), "bootID": _BOOT_ID,
            "kernelVersion": os.uname().release, "osImage": os_image, "containerRuntimeVersion": "podrunner://1.0",
            "kubeletVersion": "v1.30.0", "kubeProxyVersion": "v1.30.0", "operatingSystem": "linux",
            "architecture": "amd64"}
_SIGNAL_EXIT = 128


class PodRunner:
    """Kubelet (and a few control-plane steps) for the pods of ``api`` (the
    API-server stand-in) on the nodes of this machine, over ``network``.

    ``root``: where pod directories and logs go. ``images``: image name ->
    :class:`Image` (or a ``PATH`` prefix string); ``"*"`` matches any image, an
    entry without a tag matches every tag. ``host_path(node, path)``: the
    directory on this machine that is ``path`` on ``node`` (``None``: the node's
    own directory ``root/nodes/<node>/<path>``). ``backoff``: kubelet's restart
    back-off (first restart at once, then ``backoff`` seconds doubling to
    ``max_backoff``). ``close_grace``: the most :meth:`close` waits for a
    container after SIGTERM. ``max_probe_period``: a cap on probes'
    ``periodSeconds`` and ``initialDelaySeconds`` (a test's knob, like
    ``backoff``; None: as written). ``status_interval``: how often the API is
    checked for deleted pods."""

    def __init__(self, api, network: PodNetwork, root: Path | str, *, images: Mapping[str, Image | str],
                 host_path: Callable[[str, str], str | Path | None] | None = None, backoff: float = 10.0,
                 max_backoff: float = 300.0, close_grace: float = 5.0, status_interval: float = 0.25,
                 max_probe_period: float | None = None):
        self.api = api
        self.network = network
        self.root = Path(root).resolve()
        self.root.mkdir(parents=True, exist_ok=True)
        self.images = {k: (v if isinstance(v, Image) else Image(path=str(v))) for k, v in images.items()}
        self._host_path = host_path
        self.backoff, self.max_backoff, self.close_grace = backoff, max_backoff, close_grace
        self.status_interval = status_interval
        self.max_probe_period = max_probe_period
        self.pods: dict[str, _Pod] = {}  # uid -> pod
        self._lock = threading.RLock()
        self._ds_nodes: dict[tuple[str, str], list[str]] = {}
        self._host_dirs: list[Path] = []  # top-level directories made on the host for mount points
        self._relay: _Relay | None = None
        self._node_ports: dict[tuple[str, int], _Relay] = {}
        self._closed = threading.Event()
        self._endpoint = self._api_endpoint()
        install_serviceaccount_admission(api)
        self._monitor = threading.Thread(target=self._monitor_loop, name="podrunner-monitor", daemon=True)
        self._monitor.start()

    # -- lifecycle -------------------------------------------------------------

    def __enter__(self) -> "PodRunner":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        """Stop every pod (SIGTERM, SIGKILL after ``close_grace``), remove their
        sandboxes and the directories made on the host. Idempotent."""
        if self._closed.is_set():
            return
        self._closed.set()
        pods = list(self.pods.values())
        threads = [threading.Thread(target=self._stop_pod, args=(p, signal.SIGTERM, self.close_grace, True))
                   for p in pods]
        for t in threads:
            t.start()
        for t in threads:
            t.join(self.close_grace + 15)
        for p in pods:
            self._teardown(p)
        self._monitor.join(5)
        if self._relay is not None:
            self._relay.close()
        for relay in self._node_ports.values():
            relay.close()
        for d in reversed(self._host_dirs):
            with contextlib.suppress(OSError):
                d.rmdir()

    # -- where pods reach the API server -----------------------------------------

    def _api_endpoint(self) -> tuple[str, int]:
        """(host, port) of the API server as pods see it (``KUBERNETES_SERVICE_HOST/PORT``):
        the bridge address; the server's own port when it listens on the bridge or on
        all addresses, else a relay's (kube-proxy's part) on the bridge address."""
        from urllib.parse import urlsplit
        bound = None
        server = getattr(self.api, "_server", None)
        if server is not None:
            bound = server.server_address[:2]
        u = urlsplit(self.api.url)
        host, port = (bound or (u.hostname, u.port))
        if host in (self.network.gateway, "0.0.0.0", "::"):
            return self.network.gateway, port
        self._relay = _Relay((self.network.gateway, 0), (u.hostname, u.port))
        return self.network.gateway, self._relay.address[1]

    @property
    def api_host(self) -> str:
        return self._endpoint[0]

    @property
    def api_port(self) -> int:
        return self._endpoint[1]

    # -- nodes -------------------------------------------------------------------

    def register_node(self, name: str, *, labels: Mapping[str, str] | None = None,
                      taints: list[dict] | None = None, capacity: Mapping[str, str] | None = None) -> dict:
        """The Node object kubelet registers when missing: hostname/os/arch labels
        plus ``labels``, ``taints``, capacity, the host's bridge address as
        InternalIP, Ready, kubelet's nodeInfo; returned once the API server's node
        lifecycle controller has lifted the new Node's not-ready taint. On an existing node, ``labels`` are
        added and ``taints`` replace its taints (``kubectl label``/``taint``)."""
        try:
            node = self.api.get("Node", None, name)
        except Exception as e:
            if not _is_api_error(e, 404) and not isinstance(e, LookupError):
                raise
        else:
            if labels or taints is not None:
                node["metadata"].setdefault("labels", {}).update(labels or {})
                if taints is not None:
                    node.setdefault("spec", {})["taints"] = list(taints)
                node = self.api.update(node)
            return node
        cap = dict(capacity or NODE_RESOURCES)
        node = {"apiVersion": "v1", "kind": "Node",
                "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name, "kubernetes.io/os": "linux",
                                                      "kubernetes.io/arch": "amd64", **(labels or {})}},
                "spec": {"taints": list(taints)} if taints else {},
                "status": {"capacity": cap, "allocatable": dict(cap),
                           "addresses": [{"type": "InternalIP", "address": self.network.gateway},
                                         {"type": "Hostname", "address": name}],
                           "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady",
                                           "message": "kubelet is posting ready status",
                                           "lastHeartbeatTime": _now(), "lastTransitionTime": _now()}],
                           "nodeInfo": _node_info(name),
                           "daemonEndpoints": {"kubeletEndpoint": {"Port": 10250}}}}
        try:
            self.api.create(node)
        except Exception as e:
            if not _is_api_error(e, 409):
                raise
        # a new Node is not-ready tainted until the node lifecycle controller sees it Ready (moments
        # later): kubelet's registration is over once it has, as the DaemonSet's pods wait for that
        deadline = time.monotonic() + 10
        while True:
            got = self.api.get("Node", None, name)
            if not any(t.get("key") == "node.kubernetes.io/not-ready" for t in (got.get("spec") or {}).get("taints")
                       or ()):
                return got
            if time.monotonic() > deadline:
                raise AssertionError(f"node {name}: the not-ready taint was never lifted")
            time.sleep(0.02)

    def host_path(self, node: str, path: str) -> Path:
        """The directory on this machine that is ``path`` on ``node``."""
        mapped = self._host_path(node, path) if self._host_path else None
        if mapped is None:
            return self.root / "nodes" / node / path.lstrip("/")
        return Path(mapped)

    # -- the DaemonSet controller ----------------------------------------------------

    def _object(self, kind: str, ref) -> dict:
        if isinstance(ref, dict):
            meta = ref.get("metadata") or {}
            return self.api.get(kind, meta.get("namespace"), meta["name"])
        ns, _, name = str(ref).rpartition("/")
        return self.api.get(kind, ns or "default", name)

    def pods_for(self, daemonset, nodes: Iterable[str], *, skip_unfit: bool = False) -> list[dict]:
        """The DaemonSet controller's step for ``nodes`` (names; their Node objects
        are registered when missing, see :meth:`register_node` for labels and
        taints): for each node the DaemonSet should run on and has no pod yet,
        create its pod (see :func:`daemonset_pod`), then bind it as the scheduler
        would. Returns the DaemonSet's pods on those nodes, in the nodes' order
        (existing ones included). A node the DaemonSet does not fit (node
        selector, affinity, taints) is an error naming why, unless ``skip_unfit``
        (then it is skipped, as the controller skips it)."""
        ds = self._object("DaemonSet", daemonset)
        meta = ds["metadata"]
        ns, name, uid = meta.get("namespace", "default"), meta["name"], meta["uid"]
        self._publish_namespace_objects(ns)

        def owned() -> list[dict]:
            return [p for p in self.api.list("Pod", ns)
                    if any(r.get("uid") == uid and r.get("controller")
                           for r in p["metadata"].get("ownerReferences") or [])
                    and not p["metadata"].get("deletionTimestamp")]

        existing = owned()
        out, eligible = [], []
        for node in nodes:
            node_obj = self.register_node(node)
            ok, why = daemon_should_run(ds, node_obj)
            if not ok:
                if not skip_unfit:
                    raise ValueError(f"DaemonSet {ns}/{name} does not run on node {node}: {why} (give the node "
                                     f"the labels or taints it needs with register_node(), or pass skip_unfit=True "
                                     f"to skip it as the controller does)")
                log.info("daemonset %s/%s skips node %s: %s", ns, name, node, why)
                continue
            eligible.append(node)
            mine = [p for p in existing if p["spec"].get("nodeName") == node]
            if mine:
                out.append(mine[0])
                continue
            pod = self.api.create(daemonset_pod(ds, node))
            pname = pod["metadata"]["name"]
            self.api.do_bind(ns, pname, {"apiVersion": "v1", "kind": "Binding",
                                         "metadata": {"name": pname, "namespace": ns},
                                         "target": {"apiVersion": "v1", "kind": "Node", "name": node}})
            out.append(self.api.get("Pod", ns, pname))
        known = self._ds_nodes.setdefault((ns, name), [])
        known.extend(n for n in eligible if n not in known)
        self._update_daemonset_status(ns, name)
        return out

    def _update_daemonset_status(self, ns: str, name: str) -> None:
        if not _served(self.api, "DaemonSet"):
            return
        try:
            ds = self.api.get("DaemonSet", ns, name)
        except Exception:
            return
        nodes = self._ds_nodes.get((ns, name), [])
        uid = ds["metadata"]["uid"]
        pods = [p for p in self.api.list("Pod", ns)
                if any(r.get("uid") == uid for r in p["metadata"].get("ownerReferences") or [])
                and not p["metadata"].get("deletionTimestamp")]
        on = [p for p in pods if p["spec"].get("nodeName") in nodes]
        ready = [p for p in on if _condition(p, "Ready") == "True"]
        min_ready = int((ds.get("spec") or {}).get("minReadySeconds") or 0)
        now = _dt.datetime.now(_dt.UTC)

        def available(p: dict) -> bool:  # Ready for minReadySeconds
            since = next((c.get("lastTransitionTime") for c in p["status"].get("conditions") or []
                          if c.get("type") == "Ready"), None)
            if not min_ready or not since:
                return True
            when = _dt.datetime.strptime(since, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=_dt.UTC)
            return (now - when).total_seconds() >= min_ready
        avail = [p for p in ready if available(p)]
        hash_ = revision_hash(ds["spec"].get("template") or {}, (ds.get("status") or {}).get("collisionCount"))
        updated = [p for p in on if (p["metadata"].get("labels") or {}).get("controller-revision-hash") == hash_]
        status = {"desiredNumberScheduled": len(nodes),
                  "currentNumberScheduled": len({p["spec"]["nodeName"] for p in on}),
                  "numberMisscheduled": 0, "numberReady": len(ready), "numberAvailable": len(avail),
                  "numberUnavailable": len(nodes) - len(avail), "updatedNumberScheduled": len(updated),
                  "observedGeneration": ds["metadata"].get("generation", 1)}
        with contextlib.suppress(Exception):
            self.api.set_status("DaemonSet", ns, name, status)

    # -- control-plane objects kubelet relies on ------------------------------------------

    def _publish_namespace_objects(self, ns: str) -> None:
        """``kube-root-ca.crt`` (root-ca-cert-publisher) in ``ns`` when missing."""
        ca = getattr(self.api, "ca_pem", None)
        if isinstance(ca, bytes):
            ca = ca.decode()
        try:
            self.api.get("ConfigMap", ns, "kube-root-ca.crt")
        except Exception as e:
            if not _is_api_error(e, 404):
                raise
            with contextlib.suppress(Exception):
                self.api.create({"apiVersion": "v1", "kind": "ConfigMap",
                                 "metadata": {"name": "kube-root-ca.crt", "namespace": ns,
                                              "annotations": {"kubernetes.io/description": (
                                                  "Contains a CA bundle that can be used to verify the "
                                                  "kube-apiserver when using internal endpoints such as the "
                                                  "internal service IP or kubernetes.default.svc. No other "
                                                  "usage is guaranteed across distributions of Kubernetes "
                                                  "clusters.")}},
                                 "data": {"ca.crt": ca or ""}})

    def _token(self, ns: str, sa: str, audience: str | None, expiration: int, pod: str) -> str:
        """A bound service-account token, as kubelet gets it from the TokenRequest API
        (the stand-in's ``issue_token``; a server without it gets an opaque token
        registered with ``add_token``)."""
        issue = getattr(self.api, "issue_token", None)
        if issue is not None:
            import inspect
            params = inspect.signature(issue).parameters
            kw: dict = {}
            if audience and "audiences" in params:
                kw["audiences"] = [audience]
            if "expiration_seconds" in params:
                kw["expiration_seconds"] = expiration
            if "pod" in params:
                kw["pod"] = pod
            return issue(ns, sa, **kw)
        token = "podrunner-" + secrets.token_urlsafe(24)
        self.api.add_token(token, f"system:serviceaccount:{ns}:{sa}",
                           ["system:serviceaccounts", f"system:serviceaccounts:{ns}"])
        return token

    def _event(self, p: _Pod, type_: str, reason: str, message: str, container: str | None = None) -> None:
        """An Event about the pod, from kubelet (best effort, as kubelet's recorder)."""
        involved = {"apiVersion": "v1", "kind": "Pod", "namespace": p.namespace, "name": p.name, "uid": p.uid}
        if container:
            involved["fieldPath"] = f"spec.containers{{{container}}}"
        with contextlib.suppress(Exception):
            self.api.create({"apiVersion": "v1", "kind": "Event",
                             "metadata": {"name": f"{p.name}.{secrets.token_hex(8)}", "namespace": p.namespace},
                             "involvedObject": involved, "reason": reason, "message": message, "type": type_,
                             "source": {"component": "kubelet", "host": p.node}, "count": 1,
                             "firstTimestamp": _now(), "lastTimestamp": _now(),
                             "reportingComponent": "kubelet", "reportingInstance": p.node})

    # -- reading the API --------------------------------------------------------------

    def _get_optional(self, kind: str, ns: str, name: str) -> dict | None:
        try:
            return self.api.get(kind, ns, name)
        except Exception as e:
            if _is_api_error(e, 404):
                return None
            raise

    def _configmap_data(self, ns: str, name: str, optional: bool, what: str) -> dict[str, bytes] | None:
        cm = self._get_optional("ConfigMap", ns, name)
        if cm is None:
            if optional:
                return None
            raise PodStartError(f'{what}: configmap "{name}" not found')
        data = {k: v.encode() for k, v in (cm.get("data") or {}).items()}
        data.update({k: base64.b64decode(v) for k, v in (cm.get("binaryData") or {}).items()})
        return data

    def _secret_data(self, ns: str, name: str, optional: bool, what: str) -> dict[str, bytes] | None:
        s = self._get_optional("Secret", ns, name)
        if s is None:
            if optional:
                return None
            raise PodStartError(f'{what}: secret "{name}" not found')
        return {k: base64.b64decode(v) for k, v in (s.get("data") or {}).items()}

    # -- volumes ------------------------------------------------------------------------

    def _key_to_paths(self, data: dict[str, bytes] | None, items, default_mode: int, kind: str,
                      optional: bool) -> dict[str, tuple[bytes, int]]:
        if data is None:
            return {}
        if not items:
            return {k: (v, default_mode) for k, v in data.items()}
        out = {}
        for it in items:
            if it["key"] not in data:
                if optional:
                    continue
                raise PodStartError(f"{kind} references non-existent {'config' if kind == 'configmap' else 'secret'}"
                                    f" key: {it['key']}")
            out[it["path"]] = (data[it["key"]], it.get("mode", default_mode))
        return out

    def _downward_items(self, p: _Pod, items, default_mode: int) -> dict[str, tuple[bytes, int]]:
        out = {}
        node_alloc = self._node_allocatable(p.node)
        for it in items or []:
            if it.get("fieldRef"):
                value = pod_field(p.obj, it["fieldRef"]["fieldPath"], pod_ip=p.ip, host_ip=self.network.gateway,
                                  for_env=False)
            elif it.get("resourceFieldRef"):
                ref = it["resourceFieldRef"]
                if not ref.get("containerName"):
                    raise PodStartError(f"downwardAPI item {it.get('path')!r}: resourceFieldRef needs containerName "
                                        f"in a volume")
                value = resource_field(p.obj, ref["containerName"], ref, node_alloc)
            else:
                raise PodStartError(f"downwardAPI item {it.get('path')!r}: needs fieldRef or resourceFieldRef")
            out[it["path"]] = (value.encode(), it.get("mode", default_mode))
        return out

    def _node_allocatable(self, node: str) -> dict[str, str]:
        try:
            return dict((self.api.get("Node", None, node).get("status") or {}).get("allocatable") or {})
        except Exception:
            return dict(NODE_RESOURCES)

    def _projected_payload(self, p: _Pod, vol: dict) -> dict[str, tuple[bytes, int]]:
        kind = next((k for k in ("configMap", "secret", "projected", "downwardAPI") if k in vol), None)
        src = vol[kind]
        mode = src.get("defaultMode", 420)
        ns, what = p.namespace, f'MountVolume.SetUp failed for volume "{vol["name"]}"'
        if kind == "configMap":
            opt = bool(src.get("optional"))
            return self._key_to_paths(self._configmap_data(ns, src.get("name", ""), opt, what), src.get("items"),
                                      mode, "configmap", opt)
        if kind == "secret":
            opt = bool(src.get("optional"))
            return self._key_to_paths(self._secret_data(ns, src.get("secretName", ""), opt, what),
                                      src.get("items"), mode, "secret", opt)
        if kind == "downwardAPI":
            return self._downward_items(p, src.get("items"), mode)
        out: dict[str, tuple[bytes, int]] = {}
        for source in src.get("sources") or []:
            if "configMap" in source:
                s = source["configMap"]
                opt = bool(s.get("optional"))
                part = self._key_to_paths(self._configmap_data(ns, s.get("name", ""), opt, what), s.get("items"),
                                          mode, "configmap", opt)
            elif "secret" in source:
                s = source["secret"]
                opt = bool(s.get("optional"))
                part = self._key_to_paths(self._secret_data(ns, s.get("name", ""), opt, what), s.get("items"),
                                          mode, "secret", opt)
            elif "downwardAPI" in source:
                part = self._downward_items(p, source["downwardAPI"].get("items"), mode)
            elif "serviceAccountToken" in source:
                s = source["serviceAccountToken"]
                sa = (p.obj.get("spec") or {}).get("serviceAccountName") or "default"
                token = self._token(ns, sa, s.get("audience"), int(s.get("expirationSeconds", 3600)), p.name)
                part = {s["path"]: (token.encode(), mode)}
            else:
                raise PodStartError(f"{what}: projected source {sorted(source)} is not supported: accepted "
                                    f"configMap, secret, downwardAPI, serviceAccountToken")
            for k in part:
                if k in out:
                    raise PodStartError(f"{what}: conflicting duplicate paths {k!r} in the projected sources")
            out.update(part)
        return out

    def _setup_volume(self, p: _Pod, vol: dict) -> _Volume:
        name = vol["name"]
        base = p.dir / "volumes"
        if "hostPath" in vol:
            return _Volume(name, "hostPath", self._check_host_path(p, vol))
        if "emptyDir" in vol:
            d = base / "kubernetes.io~empty-dir" / name
            if not d.exists():
                d.mkdir(parents=True)
                os.chmod(d, 0o777)
            return _Volume(name, "emptyDir", d)
        for kind, plugin in (("configMap", "configmap"), ("secret", "secret"), ("projected", "projected"),
                             ("downwardAPI", "downward-api")):
            if kind in vol:
                d = base / f"kubernetes.io~{plugin}" / name
                atomic_write(d, self._projected_payload(p, vol))
                return _Volume(name, kind, d, read_only=True)
        kinds = sorted(k for k in vol if k != "name")
        raise PodStartError(f"volume {name!r}: kind {kinds} is not supported by the pod runner: accepted "
                            f"configMap, secret, projected, downwardAPI, hostPath, emptyDir")

    def _check_host_path(self, p: _Pod, vol: dict) -> Path:
        hp = vol["hostPath"]
        path, typ = hp.get("path", ""), hp.get("type") or ""
        real = self.host_path(p.node, path)
        where = f"{path} (node {p.node}: {real})"

        def fail(what: str) -> PodStartError:
            return PodStartError(f'MountVolume.SetUp failed for volume "{vol["name"]}" : hostPath type check '
                                 f"failed: {where} is not {what}")
        try:
            st = os.stat(real)
        except FileNotFoundError:
            st = None
        if typ in ("", "DirectoryOrCreate") and st is None:
            real.mkdir(parents=True, mode=0o755)
            os.chmod(real, 0o755)
            return real
        if typ == "FileOrCreate" and st is None:
            fd = os.open(real, os.O_WRONLY | os.O_CREAT, 0o644)
            os.close(fd)
            return real
        checks = {"Directory": (stat.S_ISDIR, "a directory"), "DirectoryOrCreate": (stat.S_ISDIR, "a directory"),
                  "File": (stat.S_ISREG, "a file"), "FileOrCreate": (stat.S_ISREG, "a file"),
                  "Socket": (stat.S_ISSOCK, "a socket file"), "CharDevice": (stat.S_ISCHR, "a character device"),
                  "BlockDevice": (stat.S_ISBLK, "a block device")}
        if typ == "":
            return real
        if typ not in checks:
            raise PodStartError(f"volume {vol['name']!r}: hostPath type {typ!r}: accepted \"\", "
                                f"{', '.join(checks)}")
        test, what = checks[typ]
        if st is None or not test(st.st_mode):
            raise fail(what)
        return real

    def refresh(self, pod) -> None:
        """Re-project the pod's configMap, secret, downwardAPI and projected volumes
        from the API (kubelet's periodic sync); subPath mounts keep what they had."""
        p = self._pod(pod)
        p.obj = self.api.get("Pod", p.namespace, p.name)
        for vol in (p.obj.get("spec") or {}).get("volumes") or []:
            v = p.volumes.get(vol["name"])
            if v is not None and v.read_only:
                atomic_write(v.path, self._projected_payload(p, vol))

    # -- environment, command -------------------------------------------------------------

    def _services_for_env(self, p: _Pod) -> list[dict]:
        spec = p.obj.get("spec") or {}
        services = []
        if spec.get("enableServiceLinks", True):
            services = [s for s in self.api.list("Service", p.namespace)
                        if not (p.namespace == "default" and s["metadata"]["name"] == "kubernetes")]
        master = {"metadata": {"name": "kubernetes", "namespace": "default"},
                  "spec": {"clusterIP": self.api_host,
                           "ports": [{"name": "https", "port": self.api_port, "protocol": "TCP"}]}}
        return [s for s in services if s["metadata"]["name"] != "kubernetes"] + [master]

    def _environment(self, p: _Pod, c: dict) -> dict[str, str]:
        """``makeEnvironmentVariables``: what kubelet passes the runtime for ``c``."""
        svc_env = service_env(self._services_for_env(p))
        tmp: dict[str, str] = {}
        ns = p.namespace
        for ef in c.get("envFrom") or []:
            prefix = ef.get("prefix", "")
            if "configMapRef" in ef:
                ref, kind = ef["configMapRef"], "configMap"
                data = self._configmap_data(ns, ref.get("name", ""), bool(ref.get("optional")),
                                            f"container {c['name']}: envFrom")
            elif "secretRef" in ef:
                ref, kind = ef["secretRef"], "secret"
                data = self._secret_data(ns, ref.get("name", ""), bool(ref.get("optional")),
                                         f"container {c['name']}: envFrom")
            else:
                raise PodStartError(f"container {c['name']}: envFrom {sorted(ef)}: accepted configMapRef, secretRef")
            if data is None:
                continue
            invalid = []
            for k, v in data.items():
                k = prefix + k
                if not _ENV_NAME.match(k):
                    invalid.append(k)
                    continue
                tmp[k] = v.decode(errors="replace")
            if invalid:
                self._event(p, "Warning", "InvalidEnvironmentVariableNames",
                            f"Keys [{', '.join(sorted(invalid))}] from the EnvFrom {kind} {ns}/{ref.get('name')} "
                            f"were skipped since they are considered invalid environment variable names.")
        mapping = mapping_for(tmp, svc_env)
        for e in c.get("env") or []:
            name, value = e["name"], e.get("value", "")
            vf = e.get("valueFrom")
            if value:
                value = expand(value, mapping)
            elif vf:
                if "fieldRef" in vf:
                    value = pod_field(p.obj, vf["fieldRef"]["fieldPath"], pod_ip=p.ip, host_ip=self.network.gateway)
                elif "resourceFieldRef" in vf:
                    value = resource_field(p.obj, c["name"], vf["resourceFieldRef"], self._node_allocatable(p.node))
                elif "configMapKeyRef" in vf or "secretKeyRef" in vf:
                    is_cm = "configMapKeyRef" in vf
                    ref = vf["configMapKeyRef" if is_cm else "secretKeyRef"]
                    optional = bool(ref.get("optional"))
                    what = f"container {c['name']}: env {name}"
                    data = (self._configmap_data if is_cm else self._secret_data)(ns, ref.get("name", ""), optional,
                                                                                  what)
                    if data is None:
                        continue
                    if ref.get("key") not in data:
                        if optional:
                            continue
                        raise PodStartError(f"{what}: couldn't find key {ref.get('key')} in "
                                            f"{'ConfigMap' if is_cm else 'Secret'} {ns}/{ref.get('name')}")
                    value = data[ref["key"]].decode(errors="replace")
                else:
                    raise PodStartError(f"container {c['name']}: env {name}: valueFrom {sorted(vf)}: accepted "
                                        f"fieldRef, resourceFieldRef, configMapKeyRef, secretKeyRef")
            tmp[name] = value
        return {**svc_env, **tmp}

    def _image(self, name: str) -> Image:
        if name in self.images:
            return self.images[name]
        repo = name.split("@", 1)[0]
        if ":" in repo.rsplit("/", 1)[-1]:
            repo = repo.rsplit(":", 1)[0]
        if repo in self.images:
            return self.images[repo]
        if "*" in self.images:
            return self.images["*"]
        raise PodStartError(f'image "{name}" is not one the runner knows: known {sorted(self.images)} '
                            f'(an entry "*" matches any image)')

    @staticmethod
    def argv(c: dict, image: Image, env: Mapping[str, str]) -> list[str]:
        """``ExpandContainerCommandAndArgs`` then the runtime's rule: ``command``
        replaces the entrypoint (and drops the image's cmd), ``args`` the cmd."""
        mapping = mapping_for(env)
        command = [expand(x, mapping) for x in c.get("command") or []]
        args = [expand(x, mapping) for x in c.get("args") or []]
        if command:
            argv = command + args
        else:
            argv = list(image.entrypoint) + (args if c.get("args") else list(image.cmd))
        if not argv:
            raise PodStartError(f"container {c['name']}: no command: the container and image {c.get('image')!r} "
                                f"give none")
        return argv

    # -- pods ------------------------------------------------------------------------------

    def _pod(self, pod) -> _Pod:
        if isinstance(pod, _Pod):
            return pod
        if isinstance(pod, dict):
            uid = pod["metadata"].get("uid")
            if uid in self.pods:
                return self.pods[uid]
            key = f"{pod['metadata'].get('namespace', 'default')}/{pod['metadata']['name']}"
        else:
            key = str(pod) if "/" in str(pod) else f"default/{pod}"
        for p in self.pods.values():
            if p.key == key:
                return p
        raise KeyError(f"pod {key} is not one this runner started (started: "
                       f"{sorted(p.key for p in self.pods.values())})")

    def start(self, pod) -> dict:
        """Start the bound pod ``pod`` (a Pod dict or ``"ns/name"``) as kubelet: its
        sandbox, volumes, init containers (to completion), containers; returns the
        pod with the status kubelet wrote. Raises :class:`PodStartError` with the reason."""
        obj = self._object("Pod", pod)
        meta, spec = obj["metadata"], obj.get("spec") or {}
        if not spec.get("nodeName"):
            raise PodStartError(f"pod {meta.get('namespace')}/{meta['name']} is not bound to a node (spec.nodeName "
                                f"is empty): bind it first (pods_for binds the pods it creates)")
        if spec.get("hostNetwork"):
            raise PodStartError(f"pod {meta.get('namespace')}/{meta['name']}: hostNetwork pods are not supported by "
                                f"the pod runner")
        if meta["uid"] in self.pods:
            raise PodStartError(f"pod {meta.get('namespace')}/{meta['name']} is already running here")
        p = _Pod(namespace=meta.get("namespace", "default"), name=meta["name"], uid=meta["uid"],
                 node=spec["nodeName"], dir=self.root / "pods" / meta["uid"], obj=obj)
        p.containers = [_Container(spec=c, init=True) for c in spec.get("initContainers") or []] + \
                       [_Container(spec=c) for c in spec.get("containers") or []]
        p.dir.mkdir(parents=True, mode=0o700)
        self.register_node(p.node)
        with self._lock:
            self.pods[p.uid] = p
        try:
            with p.lock:
                p.sandbox = self.network.add_pod(p.uid)
                p.start_time = _now()
                self._publish_namespace_objects(p.namespace)
                p.obj = self.api.get("Pod", p.namespace, p.name)
                try:
                    for vol in (p.obj.get("spec") or {}).get("volumes") or []:
                        p.volumes[vol["name"]] = self._setup_volume(p, vol)
                except PodStartError as e:
                    self._event(p, "Warning", "FailedMount", str(e))
                    raise
                hostname = p.name[:63]
                (p.dir / "etc-hosts").write_text(
                    "# Kubernetes-managed hosts file.\n127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost "
                    "ip6-loopback\nfe00::0\tip6-localnet\nfe00::0\tip6-mcastprefix\nfe00::1\tip6-allnodes\n"
                    f"fe00::2\tip6-allrouters\n{p.ip}\t{hostname}\n")
                (p.dir / "hostname").write_text(hostname + "\n")
                self._write_status(p)
                for c in p.containers:
                    if c.init and c.spec.get("restartPolicy") != "Always":
                        self._run_init(p, c)
                    else:
                        self._start_container(p, c)
                self._write_status(p)
        except BaseException:
            self._stop_pod(p, signal.SIGKILL, 0, True)
            self._teardown(p)
            raise
        return self.api.get("Pod", p.namespace, p.name)

    def _mounts(self, p: _Pod, c: dict, image: Image, env: Mapping[str, str]) -> list[dict]:
        mounts = []
        user = {m.get("mountPath") for m in c.get("volumeMounts") or []}
        for dst, src in image.files.items():
            mounts.append({"src": str(src), "dst": dst, "ro": True, "file": not os.path.isdir(src)})
        for dst, src in (("/etc/hosts", p.dir / "etc-hosts"), ("/etc/hostname", p.dir / "hostname")):
            if dst not in user:
                mounts.append({"src": str(src), "dst": dst, "ro": False, "file": True})
        for vm in c.get("volumeMounts") or []:
            vol = p.volumes.get(vm.get("name"))
            if vol is None:
                raise PodStartError(f"container {c['name']}: volumeMount {vm.get('name')!r}: the pod has no such "
                                    f"volume (it has {sorted(p.volumes)})")
            src = vol.path
            sub = vm.get("subPath") or ""
            if vm.get("subPathExpr"):
                sub = expand(vm["subPathExpr"], mapping_for(env))
            if sub:
                _check_relative(sub, f"container {c['name']}: volumeMount {vm['name']} subPath")
                src = Path(os.path.realpath(vol.path / sub))
                if not _under(str(src), os.path.realpath(vol.path)):
                    raise PodStartError(f"container {c['name']}: subPath {sub!r} of volume {vm['name']!r} leaves the "
                                        f"volume ({src})")
                if not src.exists():
                    src.mkdir(parents=True, mode=0o755)  # kubelet makes a missing subPath a directory
            mounts.append({"src": str(src), "dst": vm["mountPath"], "ro": bool(vm.get("readOnly")) or vol.read_only,
                           "file": not src.is_dir()})
        return mounts

    def _make_top_dirs(self, paths: Iterable[str]) -> None:
        """A mount point or working directory whose top-level directory does not
        exist (``/data``) cannot be made inside the namespace without covering /:
        that directory is made on the host, and removed by :meth:`close`."""
        for path in paths:
            parts = Path(os.path.realpath(path)).parts
            if len(parts) >= 2:
                top = Path("/", parts[1])
                if not os.path.lexists(top):
                    top.mkdir(mode=0o755)
                    self._host_dirs.append(top)

    def _launch(self, p: _Pod, c: _Container) -> subprocess.Popen:
        spec = c.spec
        image = self._image(spec.get("image", ""))
        env = self._environment(p, spec)
        argv = self.argv(spec, image, env)
        full_env = {"PATH": image.path_env(), **image.env, "HOSTNAME": p.name[:63], **env}
        full_env.setdefault("HOME", "/root")  # runc sets HOME from the user's passwd entry when unset
        mounts = self._mounts(p, spec, image, env)
        cwd = spec.get("workingDir") or image.working_dir or "/"
        self._make_top_dirs([m["dst"] for m in mounts] + [cwd])
        c.env = full_env
        cdir = p.dir / "containers" / spec["name"]
        cdir.mkdir(parents=True, exist_ok=True, mode=0o700)
        spec_path = cdir / "init.json"
        fd = os.open(spec_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            json.dump({"hostname": p.name[:63], "mounts": mounts, "owned": [str(self.root)], "env": full_env,
                       "argv": argv, "cwd": cwd}, f)
        log_path = self.log_path(p, spec["name"])
        log_path.parent.mkdir(parents=True, exist_ok=True)
        r, w = os.pipe()
        try:
            with open(log_path, "ab") as logf:
                proc = subprocess.Popen(
                    ["ip", "netns", "exec", p.sandbox.netns, "unshare", "--mount", "--uts", "--propagation",
                     "private", "--", sys.executable, "-I", os.path.abspath(__file__), "--init", str(spec_path),
                     str(w)],
                    stdin=subprocess.DEVNULL, stdout=logf, stderr=subprocess.STDOUT, pass_fds=(w,),
                    start_new_session=True, env={"PATH": _SYS_PATH, "LC_ALL": "C"}, cwd="/")
            os.close(w)
            w = -1
            err = b""
            deadline = time.monotonic() + 30
            while True:
                left = deadline - time.monotonic()
                if left <= 0:
                    proc.kill()
                    proc.wait()
                    raise PodStartError(f"container {spec['name']} of pod {p.key}: the start took over 30 s")
                ready, _, _ = select.select([r], [], [], left)
                if not ready:
                    continue
                chunk = os.read(r, 65536)
                if not chunk:
                    break
                err += chunk
        finally:
            os.close(r)
            if w >= 0:
                os.close(w)
        if err:
            proc.wait()
            raise PodStartError(f"container {spec['name']} of pod {p.key}: failed to start: "
                                f"{err.decode(errors='replace')}")
        return proc

    def _start_container(self, p: _Pod, c: _Container) -> None:
        with p.lock:
            c.probes_stop.set()
            c.probes_stop = threading.Event()
            c.ready = False
            c.started = not c.spec.get("startupProbe")
            try:
                proc = self._launch(p, c)
            except PodStartError as e:
                c.state = {"waiting": {"reason": "RunContainerError" if "failed to start" in str(e)
                                       else "CreateContainerConfigError", "message": str(e)}}
                self._write_status(p)
                raise
            c.proc = proc
            c.container_id = secrets.token_hex(32)
            c.started_at = _now()
            c.started_mono = time.monotonic()
            c.state = {"running": {"startedAt": c.started_at}}
            c.next_start = None
            self._event(p, "Normal", "Created", f"Created container {c.name}", c.name)
            self._event(p, "Normal", "Started", f"Started container {c.name}", c.name)
            for kind in ("startupProbe", "readinessProbe", "livenessProbe"):
                probe = c.spec.get(kind)
                if probe and not c.init:
                    threading.Thread(target=self._probe_worker, args=(p, c, kind, probe, c.probes_stop),
                                     name=f"probe-{p.name}-{c.name}-{kind}", daemon=True).start()
            self._write_status(p)

    def _run_init(self, p: _Pod, c: _Container) -> None:
        self._start_container(p, c)
        code = c.proc.wait()
        self._record_exit(p, c, code)
        if code != 0:
            raise PodStartError(f"init container {c.name} of pod {p.key} exited {code}: "
                                f"{self.logs(p, c.name)[-1000:]}")
        self._write_status(p)

    # -- status ----------------------------------------------------------------------------

    def _record_exit(self, p: _Pod, c: _Container, code: int) -> None:
        exit_code = _SIGNAL_EXIT - code if code < 0 else code
        c.state = {"terminated": {"exitCode": exit_code, "reason": "Completed" if exit_code == 0 else "Error",
                                  "startedAt": c.started_at, "finishedAt": _now(),
                                  "containerID": f"containerd://{c.container_id}"}}
        c.ready = False
        c.probes_stop.set()

    def _container_status(self, c: _Container) -> dict:
        image = c.spec.get("image", "")
        out = {"name": c.name, "image": image,
               "imageID": f"{image.split(':')[0]}@sha256:{hashlib.sha256(image.encode()).hexdigest()}",
               "ready": c.ready, "restartCount": c.restart_count, "started": c.running() and c.started,
               "state": c.state, "lastState": c.last_state}
        if c.container_id:
            out["containerID"] = f"containerd://{c.container_id}"
        return out

    def _write_status(self, p: _Pod) -> None:
        if p.gone:
            return
        with p.lock:
            inits = [c for c in p.containers if c.init]
            apps = [c for c in p.containers if not c.init]
            init_done = all("terminated" in c.state and c.state["terminated"]["exitCode"] == 0 or c.running()
                            for c in inits)
            ready = bool(apps) and all(c.ready and c.running() for c in apps)
            policy = (p.obj.get("spec") or {}).get("restartPolicy", "Always")
            if any(c.running() for c in apps) or (apps and policy == "Always" and any(c.proc for c in apps)):
                phase = "Running"
            elif apps and all("terminated" in c.state for c in apps) and all(c.next_start is None for c in apps):
                phase = "Succeeded" if all(c.state["terminated"]["exitCode"] == 0 for c in apps) else "Failed"
            else:
                phase = "Pending"
            want = {"PodReadyToStartContainers": "True" if p.sandbox else "False",
                    "Initialized": "True" if init_done else "False",
                    "ContainersReady": "True" if ready else "False", "Ready": "True" if ready else "False"}
            conds = []
            for t, s in want.items():
                old = p.conditions.get(t)
                when = old[1] if old and old[0] == s else _now()
                p.conditions[t] = (s, when)
                cond = {"type": t, "status": s, "lastProbeTime": None, "lastTransitionTime": when}
                if s == "False" and t in ("ContainersReady", "Ready"):
                    cond["reason"] = "ContainersNotReady"
                    cond["message"] = "containers with unready status: [" + " ".join(
                        c.name for c in apps if not c.ready) + "]"
                conds.append(cond)
            current = (p.obj.get("status") or {}).get("conditions") or []
            scheduled = [c for c in current if c.get("type") == "PodScheduled"]
            conds += scheduled or [{"type": "PodScheduled", "status": "True", "lastProbeTime": None,
                                    "lastTransitionTime": p.start_time}]  # kubelet adds it to pods made bound
            status = {"phase": phase, "conditions": conds, "hostIP": self.network.gateway,
                      "hostIPs": [{"ip": self.network.gateway}], "startTime": p.start_time,
                      "containerStatuses": [self._container_status(c) for c in apps]}
            if p.ip:
                status.update({"podIP": p.ip, "podIPs": [{"ip": p.ip}]})
            if inits:
                status["initContainerStatuses"] = [self._container_status(c) for c in inits]
            was_ready = _condition(p.obj, "Ready")
            try:
                p.obj = self.api.set_status("Pod", p.namespace, p.name, status)
            except Exception as e:
                if _is_api_error(e, 404):
                    p.gone = True
                    return
                raise
        if was_ready != want["Ready"]:
            owner = next((r for r in p.obj["metadata"].get("ownerReferences") or []
                          if r.get("kind") == "DaemonSet" and r.get("controller")), None)
            if owner:
                self._update_daemonset_status(p.namespace, owner["name"])

    # -- probes ------------------------------------------------------------------------------

    def _port(self, c: _Container, port) -> int:
        if isinstance(port, int) or str(port).isdigit():
            return int(port)
        for cp in c.spec.get("ports") or []:
            if cp.get("name") == port:
                return int(cp["containerPort"])
        raise PodStartError(f"container {c.name}: named port {port!r} is not among its ports")

    def _probe_once(self, p: _Pod, c: _Container, probe: Mapping) -> tuple[bool, str]:
        """One probe run, from the host (kubelet's netns) to the pod's IP."""
        timeout = float(probe.get("timeoutSeconds", 1))
        try:
            if "tcpSocket" in probe:
                t = probe["tcpSocket"]
                host, port = t.get("host") or p.ip, self._port(c, t["port"])
                with socket.create_connection((host, port), timeout=timeout):
                    return True, ""
            if "httpGet" in probe:
                h = probe["httpGet"]
                host, port = h.get("host") or p.ip, self._port(c, h["port"])
                headers = {"User-Agent": "kube-probe/1.30", "Accept": "*/*"}
                headers.update({x["name"]: x["value"] for x in h.get("httpHeaders") or []})
                if (h.get("scheme") or "HTTP").upper() == "HTTPS":
                    conn = http.client.HTTPSConnection(host, port, timeout=timeout,
                                                       context=ssl._create_unverified_context())
                else:
                    conn = http.client.HTTPConnection(host, port, timeout=timeout)
                try:
                    conn.request("GET", h.get("path") or "/", headers=headers)
                    resp = conn.getresponse()
                    resp.read(10240)
                finally:
                    conn.close()
                if 200 <= resp.status < 400:
                    return True, ""
                return False, f"HTTP probe failed with statuscode: {resp.status}"
            if "exec" in probe:
                out = self.exec(p, probe["exec"]["command"], container=c.name, timeout=timeout)
                return out.returncode == 0, (out.stdout + out.stderr).strip()
            return False, f"probe {sorted(probe)}: the pod runner runs tcpSocket, httpGet and exec probes"
        except (OSError, subprocess.TimeoutExpired, http.client.HTTPException) as e:
            return False, str(e) or type(e).__name__

    def _probe_worker(self, p: _Pod, c: _Container, kind: str, probe: Mapping, stop: threading.Event) -> None:
        period = float(probe.get("periodSeconds", 10))
        delay = float(probe.get("initialDelaySeconds", 0))
        if self.max_probe_period is not None:
            period, delay = min(period, self.max_probe_period), min(delay, self.max_probe_period)
        need_ok = int(probe.get("successThreshold", 1))
        need_fail = int(probe.get("failureThreshold", 3))
        if stop.wait(delay):
            return
        oks = fails = 0
        label = {"startupProbe": "Startup", "readinessProbe": "Readiness", "livenessProbe": "Liveness"}[kind]
        while not stop.is_set() and not self._closed.is_set():
            if kind != "startupProbe" and not c.started:
                stop.wait(min(period, 0.1))
                continue
            ok, msg = self._probe_once(p, c, probe)
            if stop.is_set():
                return
            oks, fails = (oks + 1, 0) if ok else (0, fails + 1)
            if not ok:
                self._event(p, "Warning", "Unhealthy", f"{label} probe failed: {msg}", c.name)
            if kind == "readinessProbe":
                if ok and oks >= need_ok and not c.ready:
                    c.ready = True
                    self._write_status(p)
                elif not ok and fails >= need_fail and c.ready:
                    c.ready = False
                    self._write_status(p)
            elif kind == "startupProbe" and ok and oks >= need_ok:
                c.started = True
                if not c.spec.get("readinessProbe"):
                    c.ready = True
                self._write_status(p)
                return
            elif not ok and fails >= need_fail:  # liveness or startup: the container is killed and restarted
                why = "liveness" if kind == "livenessProbe" else "startup"
                self._event(p, "Normal", "Killing", f"Container {c.name} failed {why} probe, will be restarted",
                            c.name)
                grace = probe.get("terminationGracePeriodSeconds")
                if grace is None:
                    grace = (p.obj.get("spec") or {}).get("terminationGracePeriodSeconds", 30)
                self._signal_container(c, signal.SIGTERM, float(grace))
                return
            stop.wait(period)

    # -- process control ---------------------------------------------------------------------

    @staticmethod
    def _signal_container(c: _Container, sig: int, grace: float) -> None:
        """``sig`` to the container's process group; SIGKILL after ``grace`` seconds."""
        proc = c.proc
        if proc is None or proc.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, sig)
        if sig == signal.SIGKILL:
            proc.wait()
            return
        try:
            proc.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()

    def _stop_pod(self, p: _Pod, sig: int, grace: float | None, quiet: bool = False) -> None:
        if grace is None:
            grace = float((p.obj.get("spec") or {}).get("terminationGracePeriodSeconds", 30))
        with p.lock:
            for c in p.containers:
                c.stopped = True
                c.next_start = None
                c.probes_stop.set()
        threads = []
        for c in p.containers:
            if c.running():
                if not quiet:
                    self._event(p, "Normal", "Killing", f"Stopping container {c.name}", c.name)
                t = threading.Thread(target=self._signal_container, args=(c, sig, grace), daemon=True)
                t.start()
                threads.append(t)
        for t in threads:
            t.join()
        with p.lock:
            for c in p.containers:
                if c.proc is not None and "running" in c.state:
                    self._record_exit(p, c, c.proc.wait())
        if not quiet:
            with contextlib.suppress(Exception):
                self._write_status(p)

    def stop(self, pod, sig: int = signal.SIGTERM, grace: float | None = None) -> None:
        """Stop the pod's containers as kubelet kills a pod: ``sig`` to each
        container's process group, SIGKILL after ``grace`` (default: the pod's
        ``terminationGracePeriodSeconds``). They stay stopped (no restart) until
        :meth:`restart`; the sandbox, IP and volumes stay."""
        self._stop_pod(self._pod(pod), sig, grace)

    def kill(self, pod) -> None:
        """SIGKILL the pod's containers at once (stays stopped until :meth:`restart`)."""
        self._stop_pod(self._pod(pod), signal.SIGKILL, 0)

    def send_signal(self, pod, sig: int, container: str | None = None) -> None:
        """Send ``sig`` to a container's process group and nothing else: if it
        exits, the pod's ``restartPolicy`` (with back-off) decides what follows,
        as for a crash."""
        c = self._pod(pod).container(container)
        if c.running():
            os.killpg(c.proc.pid, sig)

    def restart(self, pod, container: str | None = None) -> dict:
        """Restart the pod's containers (or one) in place, as kubelet restarts a
        container: stopped (SIGTERM, the pod's grace) if running, started again in
        the same sandbox with the same volumes; ``restartCount`` + 1."""
        p = self._pod(pod)
        with p.lock:
            todo = [p.container(container)] if container else [c for c in p.containers if not c.init]
            for c in todo:
                c.stopped = True
                c.probes_stop.set()
            grace = float((p.obj.get("spec") or {}).get("terminationGracePeriodSeconds", 30))
            for c in todo:
                if c.running():
                    self._signal_container(c, signal.SIGTERM, grace)
                if c.proc is not None:
                    if "running" in c.state:
                        self._record_exit(p, c, c.proc.wait())
                    c.last_state = c.state
                    c.restart_count += 1
                c.stopped = False
                self._start_container(p, c)
        return self.api.get("Pod", p.namespace, p.name)

    def remove(self, pod, grace: float | None = None) -> None:
        """Delete the pod as kubelet finishes a deletion: stop its containers, tear
        down its sandbox, delete it from the API (grace 0)."""
        p = self._pod(pod)
        self._stop_pod(p, signal.SIGTERM, grace, quiet=True)
        self._teardown(p)
        with contextlib.suppress(Exception):
            self.api.delete("Pod", p.namespace, p.name, grace_period=0)

    def _teardown(self, p: _Pod) -> None:
        with self._lock:
            self.pods.pop(p.uid, None)
        if p.sandbox is not None:
            self.network.remove_pod(p.uid)

    # -- the monitor: exits, restarts, deletions ----------------------------------------------

    def _monitor_loop(self) -> None:
        last_api = last_ds = 0.0
        while not self._closed.wait(0.05):
            if time.monotonic() - last_ds >= 1.0:  # numberAvailable moves with time (minReadySeconds)
                last_ds = time.monotonic()
                for ns, name in list(self._ds_nodes):
                    with contextlib.suppress(Exception):
                        self._update_daemonset_status(ns, name)
            for p in list(self.pods.values()):
                try:
                    self._tend(p)
                except Exception:
                    log.exception("pod %s: monitor", p.key)
            if time.monotonic() - last_api >= self.status_interval:
                last_api = time.monotonic()
                for p in list(self.pods.values()):
                    with contextlib.suppress(Exception):
                        self._check_deleted(p)

    def _tend(self, p: _Pod) -> None:
        if p.terminating or not p.lock.acquire(blocking=False):
            return
        try:
            policy = (p.obj.get("spec") or {}).get("restartPolicy", "Always")
            changed = False
            for c in p.containers:
                if c.init and c.spec.get("restartPolicy") != "Always":
                    continue
                if c.proc is not None and "running" in c.state and c.proc.poll() is not None:
                    self._record_exit(p, c, c.proc.returncode)
                    changed = True
                    code = c.state["terminated"]["exitCode"]
                    if not c.stopped and (policy == "Always" or (policy == "OnFailure" and code != 0)
                                          or c.spec.get("restartPolicy") == "Always"):
                        if time.monotonic() - c.started_mono > 600:
                            c.crashes = 0
                        delay = 0.0 if c.crashes == 0 else min(self.backoff * 2 ** (c.crashes - 1), self.max_backoff)
                        c.crashes += 1
                        c.next_start = time.monotonic() + delay
                        if delay:
                            msg = (f"back-off {delay:g}s restarting failed container={c.name} "
                                   f"pod={p.name}_{p.namespace}({p.uid})")
                            c.last_state = c.state
                            c.state = {"waiting": {"reason": "CrashLoopBackOff", "message": msg}}
                            self._event(p, "Warning", "BackOff", f"Back-off restarting failed container {c.name} in "
                                                                 f"pod {p.name}_{p.namespace}({p.uid})", c.name)
                if c.next_start is not None and time.monotonic() >= c.next_start and not c.stopped:
                    c.next_start = None
                    if "terminated" in c.state:
                        c.last_state = c.state
                    c.restart_count += 1
                    try:
                        self._start_container(p, c)
                    except PodStartError as e:
                        log.warning("pod %s: restart of %s failed: %s", p.key, c.name, e)
                        c.next_start = time.monotonic() + min(self.backoff * 2 ** c.crashes, self.max_backoff)
                        c.crashes += 1
                    changed = True
            if changed:
                self._write_status(p)
        finally:
            p.lock.release()

    def _check_deleted(self, p: _Pod) -> None:
        if p.terminating:
            return
        try:
            obj = self.api.get("Pod", p.namespace, p.name)
        except Exception as e:
            if not _is_api_error(e, 404):
                return
            obj = None
        if obj is not None and obj["metadata"]["uid"] == p.uid and not obj["metadata"].get("deletionTimestamp"):
            return
        p.terminating = True
        grace = None
        if obj is not None and obj["metadata"]["uid"] == p.uid:
            grace = float(obj["metadata"].get("deletionGracePeriodSeconds", 30))
        else:
            p.gone = True

        def finish() -> None:
            self._stop_pod(p, signal.SIGTERM, grace, quiet=p.gone)
            self._teardown(p)
            if not p.gone:
                with contextlib.suppress(Exception):
                    self.api.delete("Pod", p.namespace, p.name, grace_period=0)
            p.gone = True
        threading.Thread(target=finish, name=f"podrunner-delete-{p.name}", daemon=True).start()

    # -- for tests ---------------------------------------------------------------------------

    def log_path(self, pod, container: str | None = None) -> Path:
        p = self._pod(pod)
        apps = [c for c in p.containers if not c.init] or p.containers
        name = container or apps[0].name
        return self.root / "logs" / f"{p.namespace}_{p.name}_{p.uid}" / f"{name}.log"

    def logs(self, pod, container: str | None = None) -> str:
        """The container's output (stdout and stderr, every start appended; default:
        the first app container)."""
        path = self.log_path(pod, container)
        return path.read_text(errors="replace") if path.exists() else ""

    def ip(self, pod) -> str:
        return self._pod(pod).ip

    def running(self, pod, container: str | None = None) -> bool:
        return self._pod(pod).container(container).running()

    def pid(self, pod, container: str | None = None) -> int | None:
        c = self._pod(pod).container(container)
        return c.proc.pid if c.running() else None

    def exec(self, pod, argv: list[str], container: str | None = None, timeout: float = 30,
             input: str | None = None) -> subprocess.CompletedProcess:
        """Run ``argv`` inside the container (its mount, UTS and network namespaces,
        its environment; ``kubectl exec``). Returns the completed process (text)."""
        p = self._pod(pod)
        c = p.container(container) if container else next(c for c in p.containers if not c.init)
        if not c.running():
            raise RuntimeError(f"container {c.name} of pod {p.key} is not running")
        return subprocess.run(["nsenter", "-t", str(c.proc.pid), "-m", "-u", "-n", "-w", "--", *argv],
                              input=input, capture_output=True, text=True, timeout=timeout, env=c.env)

    def wait_ready(self, pod, timeout: float = 30, ready: bool = True) -> dict:
        """Until the pod's Ready condition in the API is ``ready``; the pod."""
        p = self._pod(pod)
        deadline = time.monotonic() + timeout
        want = "True" if ready else "False"
        while True:
            obj = self.api.get("Pod", p.namespace, p.name)
            if _condition(obj, "Ready") == want:
                return obj
            if time.monotonic() > deadline:
                raise AssertionError(f"pod {p.key} not Ready={want} within {timeout} s: status "
                                     f"{json.dumps(obj.get('status'))[:1500]}\nlogs: {self.logs(p)[-1500:]}")
            time.sleep(0.05)

    def service_resolver(self, namespace: str, name: str, port: int) -> str:
        """Where kube-proxy would send a connection to Service ``namespace/name``
        on ``port``: ``"podIP:targetPort"`` of a Ready pod of this runner the
        Service's selector picks (for ``api.webhooks.service_resolver``)."""
        svc = self.api.get("Service", namespace, name)
        spec = svc.get("spec") or {}
        sp = next((x for x in spec.get("ports") or [] if x.get("port") == port), None)
        if sp is None:
            raise ConnectionError(f"service {namespace}/{name} has no port {port}")
        selector = spec.get("selector") or {}
        for p in list(self.pods.values()):
            if p.namespace != namespace or not p.ip:
                continue
            obj = self.api.get("Pod", p.namespace, p.name)
            labels = obj["metadata"].get("labels") or {}
            if not selector or any(labels.get(k) != v for k, v in selector.items()):
                continue
            if _condition(obj, "Ready") != "True":
                continue
            target = sp.get("targetPort", port)
            if isinstance(target, str) and not target.isdigit():
                found = [cp["containerPort"] for c in p.containers for cp in c.spec.get("ports") or []
                         if cp.get("name") == target]
                if not found:
                    continue
                target = found[0]
            return f"{p.ip}:{int(target)}"
        raise ConnectionError(f"service {namespace}/{name}: no ready endpoint")

    def expose_node_port(self, namespace: str, name: str, port: int | None = None,
                         host: str = "127.0.0.1") -> tuple[str, int]:
        """kube-proxy's NodePort for Service ``namespace/name`` (its ``port``, or its
        first): listen on ``host``:<nodePort> and pass each connection to a Ready pod
        behind the Service, chosen per connection (:meth:`service_resolver`), so a
        selector that follows a label (the leader's) follows it here. Returns the
        address; closed by :meth:`close`."""
        spec = self.api.get("Service", namespace, name).get("spec") or {}
        ports = spec.get("ports") or []
        sp = next((x for x in ports if port is None or x.get("port") == port), None)
        if sp is None or not sp.get("nodePort"):
            raise ValueError(f"service {namespace}/{name}: no port {port if port is not None else ''} with a "
                             f"nodePort (type {spec.get('type')!r}, ports {ports})")
        key = (host, int(sp["nodePort"]))
        if key not in self._node_ports:
            def target() -> tuple[str, int]:
                h, _, p = self.service_resolver(namespace, name, sp["port"]).rpartition(":")
                return h, int(p)
            self._node_ports[key] = _Relay(key, target)
        return self._node_ports[key].address


def _condition(pod: dict, type_: str) -> str | None:
    for c in (pod.get("status") or {}).get("conditions") or []:
        if c.get("type") == type_:
            return c.get("status")
    return None


if __name__ == "__main__" and len(sys.argv) == 4 and sys.argv[1] == "--init":
    _init_main(sys.argv[2], int(sys.argv[3]))
