"""runc's command line: our options first, then runc's global flags, the verb.

``hamid-runtime [--state-dir DIR] [--runc PATH] [--] <runc args>``;
the ``--`` is optional: our options stop at the first argument we do not
know, so ``runtimeArgs`` in ``daemon.json`` can carry them.
"""

from __future__ import annotations

DEFAULT_STATE_DIR = "/var/lib/hamid"
DEFAULT_RUNC_ROOT = "/run/runc"

# runc global flags that take a value (runc --help)
_GLOBAL_WITH_VALUE = {"--root", "--log", "--log-format", "--criu", "--rootless"}
_OURS = {"--state-dir": "state_dir", "--runc": "runc"}


class UsageError(Exception):
    pass


class Invocation:
    """What the command line says. A plain class: this module is on the path of
    every container start, and ``dataclasses`` alone costs milliseconds to import."""

    def __init__(self) -> None:
        self.state_dir: str = DEFAULT_STATE_DIR
        self.runc: str | None = None
        self.runc_args: list[str] = []
        self.verb: str | None = None
        self.verb_index: int = -1
        self.root: str = DEFAULT_RUNC_ROOT
        self.log_file: str | None = None
        self.log_format: str = "text"

    def verb_args(self) -> list[str]:
        return self.runc_args[self.verb_index + 1:] if self.verb_index >= 0 else []

    def bundle_and_id(self) -> tuple[str | None, str | None]:
        """For ``create``/``run``: the ``--bundle``/``-b`` value and the container id."""
        args = self.verb_args()
        bundle = None
        positional = []
        i = 0
        while i < len(args):
            a = args[i]
            if a in ("--bundle", "-b"):
                bundle = args[i + 1] if i + 1 < len(args) else None
                i += 2
                continue
            if a.startswith("--bundle="):
                bundle = a.split("=", 1)[1]
            elif a in ("--console-socket", "--pid-file", "--preserve-fds"):
                i += 2
                continue
            elif not a.startswith("-"):
                positional.append(a)
            i += 1
        return bundle, (positional[-1] if positional else None)


def parse(argv: list[str]) -> Invocation:
    inv = Invocation()
    i = 0
    while i < len(argv):
        a = argv[i]
        if a == "--":
            i += 1
            break
        name, eq, val = a.partition("=")
        if name in _OURS:
            if not eq:
                if i + 1 >= len(argv):
                    raise UsageError(f"{name} needs a value")
                val = argv[i + 1]
                i += 1
            setattr(inv, _OURS[name], val)
            i += 1
            continue
        break
    inv.runc_args = argv[i:]
    j = 0
    while j < len(inv.runc_args):
        a = inv.runc_args[j]
        name, eq, val = a.partition("=")
        if name in _GLOBAL_WITH_VALUE:
            if not eq:
                val = inv.runc_args[j + 1] if j + 1 < len(inv.runc_args) else ""
                j += 1
            if name == "--root":
                inv.root = val
            elif name == "--log":
                inv.log_file = val
            elif name == "--log-format":
                inv.log_format = val
        elif not a.startswith("-"):
            inv.verb, inv.verb_index = a, j
            break
        j += 1
    return inv
