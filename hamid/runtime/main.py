"""``hamid-runtime``: the entry point Docker calls instead of runc.

Fast path first: any verb but ``create``/``run``, and any container that asks
for nothing of ours, is handed to runc with ``exec`` before anything heavy is
imported. Errors before the exec are rolled back and reported both on stderr
and in runc's ``--log`` file as a JSON line, which is how they reach
``docker run``'s own output.
"""

from __future__ import annotations

import json
import os
import sys
import time

from .argv import Invocation, UsageError, parse


def _report(inv: Invocation | None, message: str) -> None:
    print(f"hamid-runtime: {message}", file=sys.stderr)
    if inv is not None and inv.log_file:
        line: dict[str, str] | None = {"level": "error", "msg": f"hamid: {message}",
                "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
        if inv.log_format != "json":
            line = None
        try:
            with open(inv.log_file, "a") as f:
                f.write(json.dumps(line) + "\n" if line else f"hamid: {message}\n")
        except OSError:
            pass


def _runc(inv: Invocation) -> str:
    path = inv.runc or _which("runc") or _which("docker-runc")
    if not path or not os.access(path, os.X_OK):
        raise FileNotFoundError(f"runc not found (looked for {inv.runc or 'runc on PATH'}); pass --runc PATH")
    return path


def _which(name: str) -> str | None:
    """``shutil.which`` without importing shutil (this is every container start's path)."""
    for d in os.environ.get("PATH", os.defpath).split(os.pathsep):
        p = os.path.join(d or ".", name)
        if os.path.isfile(p) and os.access(p, os.X_OK):
            return p
    return None


def _exec_runc(inv: Invocation, runc: str) -> None:
    os.execv(runc, [runc, *inv.runc_args])


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    inv = None
    try:
        inv = parse(argv)
        if inv.verb == "hook":
            from .hooks import run_hook

            return run_hook(inv)
        runc = _runc(inv)
        if inv.verb not in ("create", "run"):
            _exec_runc(inv, runc)
        from .create import prepare

        prepare(inv)  # edits config.json, or leaves it untouched if not ours
        _exec_runc(inv, runc)
    except UsageError as e:
        _report(inv, f"usage: {e}")
        return 2
    except FileNotFoundError as e:
        _report(inv, str(e))
        return 1
    except Exception as e:  # noqa: BLE001 - every failure must reach docker's output
        from ..errors import HamidError

        _report(inv, str(e) if isinstance(e, HamidError) else f"internal error: {e!r}")
        return 1
    return 0
