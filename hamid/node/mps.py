"""MPS control daemons: one per GPU, owned by the node.

Owns: each GPU's MPS directories under the state directory
(``mps/<GPU uuid>/pipe`` and ``.../log``), the lock that orders starting
and stopping one GPU's daemon (``mps/<GPU uuid>.lock``, an ``flock`` so the
daemon and a runtime that works without it agree), talking to a control
daemon through NVIDIA's own front-end (``nvidia-cuda-mps-control`` with
``CUDA_MPS_PIPE_DIRECTORY``, one command on its standard input, a deadline on
every run), starting one (``nvidia-cuda-mps-control -d`` with the GPU alone
in ``CUDA_VISIBLE_DEVICES``), stopping one (``quit``), finding its process
(the program's name and our pipe directory in its environment, read from
``/proc``) and judging its health (dead, or wedged: no answer in time).

Must not: change any GPU setting (compute mode, clocks, MIG), kill or
signal an MPS client (a client of a dead server fails on its own; only a
wedged control daemon of ours is killed, by its PID), or start a daemon for
a GPU that no reservation books in MPS mode.

The backend is the program: :class:`MpsControl` runs whatever
``mpsControl`` names, so CPU tests put a stand-in with the same command
protocol on ``PATH`` (``tests/standins/nvidia-cuda-mps-control``) and the
same code drives the real daemon on a GPU host.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from ..errors import HamidError
from ..ledger import Reservation
from ..logs import get_logger
from ..placement.fit import MPS_PROGRAMS_HELP
from . import layout

log = get_logger("mps")

MPS_DIR = layout.MPS_DIR
PIPE_IN_CONTAINER = layout.MPS_PIPE_IN_CONTAINER  # shim/include/hamid_limits.h HAMID_MPS_PIPE_DIR: the shim forces it
PROGRAM = "nvidia-cuda-mps-control"
COMMAND_TIMEOUT_S = 5.0
"""A control command's deadline. The real daemon answers in milliseconds; 5 s
is long enough for a loaded host and short enough that a wedged daemon is
found within one health check."""
START_TIMEOUT_S = 10.0
"""How long a freshly started daemon may take to answer (it forks, then
opens its pipe); 10 s covers a cold driver load."""
STOP_TIMEOUT_S = 10.0
"""How long ``quit`` may take before the daemon's process is killed."""
SUN_PATH_MAX = 107  # bytes of a unix socket's path (sun_path is 108 with the NUL)
LOG_READ_MAX = 1 << 20
"""Bytes of a server log read per health check: a log growing faster than 1 MiB per check is read
over several checks (its lines stay in order, none skipped)."""
FAULT_MARKS = ("encountered a fatal gpu error",)
"""Substrings (lower case) of the line NVIDIA's MPS server writes to server.log for each client that
takes a fatal GPU fault: ``Client {PID: 910, Context: 1} encountered a fatal GPU error.``, then
``Server is handling a fatal GPU error.`` and the clients it tears down (measured on an H200, MPS
13.0, for an illegal address and for a client SIGKILLed mid-kernel:
bench/gpu/results/mps/README.md)."""
MAX_ANSWER = 64 * 1024  # bytes of a command's answer kept; more is refused (a daemon never says that much)


class MpsError(HamidError):
    """A control daemon could not be started, asked or stopped; the message says which GPU and why."""


class MpsWedged(MpsError):
    """A control daemon's process is there but did not answer in time."""


def wanted(res: Reservation) -> list[str]:
    """The GPUs (UUIDs) that ``res`` books as MPS client shares."""
    out: list[str] = []
    for c in res.decision.containers:
        for d in c.devices:
            if d.mps and d.uuid not in out:
                out.append(d.uuid)
    return out


def base_dir(state_dir: str | os.PathLike, root: str | None = None) -> str:
    """Where the GPUs' MPS directories live: ``mpsDir`` when set, else ``<stateDir>/mps``."""
    return root or os.path.join(state_dir, MPS_DIR)


def gpu_dir(state_dir: str | os.PathLike, uuid: str, root: str | None = None) -> str:
    return os.path.join(base_dir(state_dir, root), layout.component(uuid, "GPU UUID"))


def pipe_dir(state_dir: str | os.PathLike, uuid: str, root: str | None = None) -> str:
    """The GPU's pipe directory, mounted into its MPS containers at PIPE_IN_CONTAINER."""
    return os.path.join(gpu_dir(state_dir, uuid, root), "pipe")


def log_dir(state_dir: str | os.PathLike, uuid: str, root: str | None = None) -> str:
    return os.path.join(gpu_dir(state_dir, uuid, root), "log")


def ensure_dirs(state_dir: str | os.PathLike, uuid: str, root: str | None = None) -> None:
    """GPU ``uuid``'s pipe and log directories (a bind mount's source must exist before its daemon does).
    ``<stateDir>/mps`` is 0700 like the state directory; an ``mpsDir`` of the operator's is made 0711,
    so the MPS server that the control daemon starts as a non-root client's UID can reach the pipe
    directory (the ancestors are the operator's to open)."""
    base = base_dir(state_dir, root)
    os.makedirs(base, mode=0o711 if root else 0o700, exist_ok=True)
    if root:
        os.chmod(base, 0o711)  # whatever the umask
    # 0711 and 0755: container processes of any user reach the pipe directory
    # through its bind mount; nothing above it is listable or writable by them.
    for d, mode in ((gpu_dir(state_dir, uuid, root), 0o711), (pipe_dir(state_dir, uuid, root), 0o755),
                    (log_dir(state_dir, uuid, root), 0o700)):
        try:
            os.mkdir(d, mode)
        except FileExistsError:
            if not os.path.isdir(d) or os.path.islink(d):
                raise MpsError(f"{d} exists and is not a directory; remove it") from None
        os.chmod(d, mode)


def find_program(name: str) -> str | None:
    """``mpsControl`` as an absolute path (an absolute name must exist), or None."""
    if os.path.isabs(name):
        return name if os.access(name, os.X_OK) else None
    return shutil.which(name)


SERVER_PROGRAM = "nvidia-cuda-mps-server"


def find_programs(name: str) -> tuple[str | None, str | None]:
    """(``mpsControl``'s path, None) when NVIDIA's MPS programs are all there, else (None, why not).

    The control daemon starts ``nvidia-cuda-mps-server`` for the first client; without it the daemon
    starts and every client then fails, so both are checked here, before any tenant is admitted:
    the server beside the control program, or on ``PATH``."""
    control = find_program(name)
    if control is None:
        # the PATH itself goes to the daemon's log only: status shows this sentence, and a PATH is long
        where = name if os.path.isabs(name) else f"{name} on hamid's PATH"
        return None, f"{where} not found (mpsControl); {MPS_PROGRAMS_HELP}"
    beside = os.path.join(os.path.dirname(control), SERVER_PROGRAM)
    if not os.access(beside, os.X_OK) and shutil.which(SERVER_PROGRAM) is None:
        return None, f"{SERVER_PROGRAM} not found beside {control} or on PATH; {MPS_PROGRAMS_HELP}"
    return control, None


def _live(pid: str) -> bool:
    """Not a zombie or a process on its way out (a killed daemon that nobody has reaped yet)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except (OSError, IndexError):
        return False


@dataclass
class MpsControl:
    """The control daemons of one node's GPUs, driven through ``program``."""

    program: str
    state_dir: str
    timeout: float = COMMAND_TIMEOUT_S
    root: str | None = None  # mpsDir; None: <state_dir>/mps

    # --- directories and the lock ----------------------------------------------

    def _ensure_dirs(self, uuid: str) -> None:
        ensure_dirs(self.state_dir, uuid, self.root)

    def pipe(self, uuid: str) -> str:
        return pipe_dir(self.state_dir, uuid, self.root)

    def logs(self, uuid: str) -> str:
        return log_dir(self.state_dir, uuid, self.root)

    @contextlib.contextmanager
    def locked(self, uuid: str) -> Iterator[None]:
        """Hold GPU ``uuid``'s start/stop lock (across processes)."""
        base = base_dir(self.state_dir, self.root)
        os.makedirs(base, mode=0o711 if self.root else 0o700, exist_ok=True)
        gpu_dir(self.state_dir, uuid)  # checks the name
        fd = os.open(os.path.join(base, uuid + ".lock"), os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)

    def gpus(self) -> list[str]:
        """GPUs that have MPS directories (a daemon may run for them)."""
        base = Path(base_dir(self.state_dir, self.root))
        if not base.is_dir():
            return []
        return sorted(p.name for p in base.iterdir() if p.is_dir() and not p.is_symlink())

    # --- the command protocol ---------------------------------------------------

    def _env(self, uuid: str) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("CUDA_MPS_")}
        env["CUDA_MPS_PIPE_DIRECTORY"] = self.pipe(uuid)
        env["CUDA_MPS_LOG_DIRECTORY"] = self.logs(uuid)
        return env

    def command(self, uuid: str, text: str, timeout: float | None = None) -> str:
        """Send one command line to GPU ``uuid``'s daemon; its answer (stripped).

        Raises MpsWedged when the daemon's process is there but the answer
        does not come in time, MpsError when no daemon answers at all."""
        if "\n" in text or not text.strip():
            raise MpsError(f"one command line expected, got {text!r}")
        t = self.timeout if timeout is None else timeout
        try:
            p = subprocess.run([self.program], input=(text + "\n").encode(), env=self._env(uuid),
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=t, close_fds=True)
        except subprocess.TimeoutExpired:
            raise MpsWedged(f"GPU {uuid}: MPS control daemon gave no answer to {text.split()[0]!r} in {t:g} s") \
                from None
        except OSError as e:
            raise MpsError(f"cannot run {self.program}: {e}") from None
        out = p.stdout[:MAX_ANSWER].decode(errors="replace").strip()
        if p.returncode != 0:
            why = (p.stderr.decode(errors="replace").strip() or out or f"exit status {p.returncode}")[:300]
            raise MpsError(f"GPU {uuid}: {text.split()[0]!r} failed: {why}")
        return out

    def server_status(self, uuid: str, pid: int) -> str:
        """``get_server_status``: ``ACTIVE``, or ``FAULT`` while the server handles a client's fatal
        fault (measured: under a second). A server that does not answer raises MpsWedged: the
        control daemon asks the server, and a stopped server leaves the question unanswered while
        the daemon still answers everything else."""
        return self.command(uuid, f"get_server_status {int(pid)}")

    def server_list(self, uuid: str) -> list[int]:
        """PIDs of the GPU's MPS servers (none until a client connects)."""
        out = self.command(uuid, "get_server_list")
        pids = []
        for line in out.splitlines():
            line = line.strip()
            if not line.isdigit():
                raise MpsError(f"GPU {uuid}: get_server_list answered {line[:80]!r}, expected PIDs one per line")
            pids.append(int(line))
        return pids

    # --- processes --------------------------------------------------------------

    def daemon_pids(self, uuid: str) -> list[int]:
        """The control daemon processes serving GPU ``uuid``'s pipe directory
        (found in /proc: our program's name on the command line, our pipe
        directory in the environment). Root reads every environment."""
        want = ("CUDA_MPS_PIPE_DIRECTORY=" + self.pipe(uuid)).encode()
        name = os.path.basename(self.program).encode()
        out = []
        for entry in os.scandir("/proc"):
            if not entry.name.isdigit():
                continue
            try:
                with open(f"/proc/{entry.name}/cmdline", "rb") as f:
                    argv = f.read(4096).split(b"\0")
                if not any(os.path.basename(a) == name for a in argv[:2]) or b"-d" not in argv[1:3]:
                    continue
                with open(f"/proc/{entry.name}/environ", "rb") as f:
                    env = f.read(1 << 20).split(b"\0")
            except OSError:
                continue
            if want in env and _live(entry.name):
                out.append(int(entry.name))
        return out

    # --- lifecycle --------------------------------------------------------------

    def running(self, uuid: str) -> bool:
        """Does GPU ``uuid``'s daemon answer? (A wedged one raises MpsWedged.) The answer
        decides, not the process table: where /proc cannot be read, a daemon still counts."""
        if not os.path.exists(os.path.join(self.pipe(uuid), "control")):
            return False
        try:
            self.server_list(uuid)
        except MpsWedged:
            raise
        except MpsError:
            return False
        return True

    def start(self, uuid: str) -> None:
        """Start GPU ``uuid``'s control daemon (the caller holds the lock and knows none runs)."""
        sock = os.path.join(self.pipe(uuid), "control")
        if len(os.fsencode(sock)) > SUN_PATH_MAX:
            raise MpsError(f"GPU {uuid}: the control socket {sock} is {len(os.fsencode(sock))} bytes, a unix socket "
                           f"path holds {SUN_PATH_MAX}: use a shorter stateDir")
        self._ensure_dirs(uuid)
        env = self._env(uuid)
        env["CUDA_VISIBLE_DEVICES"] = uuid  # its servers see this GPU alone
        try:
            p = subprocess.run([self.program, "-d"], env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, timeout=START_TIMEOUT_S, close_fds=True,
                               cwd=gpu_dir(self.state_dir, uuid, self.root))
        except subprocess.TimeoutExpired:
            raise MpsError(f"GPU {uuid}: {self.program} -d did not return in {START_TIMEOUT_S:g} s") from None
        except OSError as e:
            raise MpsError(f"cannot run {self.program}: {e}") from None
        if p.returncode != 0:
            why = (p.stderr or p.stdout).decode(errors="replace").strip()[:300] or f"exit status {p.returncode}"
            raise MpsError(f"GPU {uuid}: {self.program} -d failed: {why}")
        deadline = time.monotonic() + START_TIMEOUT_S
        last: Exception | None = None
        while time.monotonic() < deadline:
            try:
                self.server_list(uuid)
                self.mark_log(uuid)
                log.info("MPS control daemon started", gpu=uuid, pipe=self.pipe(uuid),
                         pids=self.daemon_pids(uuid))
                return
            except MpsError as e:
                last = e
                time.sleep(0.05)
        raise MpsError(f"GPU {uuid}: the MPS control daemon started but did not answer in "
                       f"{START_TIMEOUT_S:g} s ({last})")

    def stop(self, uuid: str) -> None:
        """Stop GPU ``uuid``'s daemon: ``quit``, then (a wedged one) SIGKILL to
        the daemon's own PIDs. Returns once none is left."""
        pids = self.daemon_pids(uuid)
        if not pids and not os.path.exists(os.path.join(self.pipe(uuid), "control")):
            return
        quit_ok = False
        try:
            self.command(uuid, "quit")
            quit_ok = True
        except MpsError as e:  # wedged or broken: it will not go by itself
            if pids:
                log.warning("MPS quit failed; killing the control daemon", gpu=uuid, error=str(e), pids=pids)
        if quit_ok:
            deadline = time.monotonic() + STOP_TIMEOUT_S
            while time.monotonic() < deadline and (self.daemon_pids(uuid) or self._answers(uuid)):
                time.sleep(0.05)
        left = self.daemon_pids(uuid)
        for pid in left:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        if left:
            end = time.monotonic() + 5
            while time.monotonic() < end and self.daemon_pids(uuid):
                time.sleep(0.05)
        log.info("MPS control daemon stopped", gpu=uuid, killed=left)

    # --- client faults the server saw ---------------------------------------------

    def _server_log(self, uuid: str) -> str:
        return os.path.join(self.logs(uuid), "server.log")

    def _log_mark(self, uuid: str) -> str:
        """Where the health check has read the server log up to: ``<inode> <offset>`` (root's, 0600)."""
        return os.path.join(gpu_dir(self.state_dir, uuid, self.root), "server-log.read")

    def _read_mark(self, uuid: str) -> tuple[int, int] | None:
        try:
            with open(self._log_mark(uuid)) as f:
                ino, off = f.read(64).split()
            return int(ino), int(off)
        except (OSError, ValueError):
            return None

    def _write_mark(self, uuid: str, ino: int, off: int) -> None:
        tmp = self._log_mark(uuid) + ".tmp"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(f"{ino} {off}\n")
        os.replace(tmp, self._log_mark(uuid))

    def mark_log(self, uuid: str) -> None:
        """What the server log holds now is history: a daemon started now reports only what follows."""
        try:
            st = os.stat(self._server_log(uuid))
        except FileNotFoundError:
            self._write_mark(uuid, 0, 0)
            return
        self._write_mark(uuid, st.st_ino, st.st_size)

    def client_faults(self, uuid: str) -> list[str]:
        """The server log's new lines that tell of a client's fatal GPU fault (read once each: the
        place read up to is kept beside the GPU's directories, so a restarted hamid reads on)."""
        path = self._server_log(uuid)
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except FileNotFoundError:
            return []
        with os.fdopen(fd, "rb") as f:
            st = os.fstat(f.fileno())
            mark = self._read_mark(uuid)
            if mark is None:  # never read (a daemon started by an older hamid): what is there is history
                self._write_mark(uuid, st.st_ino, st.st_size)
                return []
            # another file (rotated, a daemon's new log) or one cut shorter: read it from its start
            off = mark[1] if mark[0] in (st.st_ino, 0) and mark[1] <= st.st_size else 0
            f.seek(off)
            data = f.read(LOG_READ_MAX)
        end = data.rfind(b"\n") + 1  # whole lines only; a line being written is read next time
        if end == 0 and len(data) == LOG_READ_MAX:  # no line end in a whole read: not a log line, skip it
            end = len(data)
        self._write_mark(uuid, st.st_ino, off + end)
        return [ln for ln in data[:end].decode(errors="replace").splitlines()
                if any(m in ln.lower() for m in FAULT_MARKS)]

    def wedged_servers(self, uuid: str, servers: list[int]) -> list[int]:
        """Of ``servers``, those whose status query gets no answer in time."""
        out = []
        for pid in servers:
            try:
                self.server_status(uuid, pid)
            except MpsWedged:
                out.append(pid)
            except MpsError:  # gone since it was listed: the next check sees the list without it
                continue
        return out

    def kill_server(self, uuid: str, pid: int) -> bool:
        """SIGKILL a wedged MPS server of this GPU's daemon (never a client): only a process that the
        daemon still lists and that runs NVIDIA's server program. The daemon starts a new one for the
        next client. False when it is not (or no longer) such a process."""
        try:
            if pid not in self.server_list(uuid):
                return False
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                argv = f.read(4096).split(b"\0")
        except (OSError, MpsError):
            return False
        if not any(os.path.basename(a) == SERVER_PROGRAM.encode() for a in argv[:2]):
            return False
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
        log.warning("killed a wedged MPS server", gpu=uuid, pid=pid)
        return True

    def _answers(self, uuid: str) -> bool:
        try:
            self.server_list(uuid)
            return True
        except MpsError:
            return False

    def health(self, uuid: str) -> str | None:
        """None when GPU ``uuid``'s daemon answers and its servers live; else why not."""
        try:
            servers = self.server_list(uuid)
        except MpsWedged as e:
            return f"the MPS control daemon is wedged ({e})"
        except MpsError as e:
            if not self.daemon_pids(uuid):
                return "the MPS control daemon is not running"
            return f"the MPS control daemon does not answer ({e})"
        for pid in servers:
            try:
                with open(f"/proc/{pid}/stat") as f:
                    state = f.read().rsplit(")", 1)[1].split()[0]
            except FileNotFoundError:
                return f"MPS server {pid} is gone but still listed"
            except (OSError, IndexError):
                continue
            if state in ("Z", "X"):
                return f"MPS server {pid} is dead (process state {state})"
        return None
