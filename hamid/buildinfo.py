"""What build this is: hamid's version, the shim's version, the commit and the build date.

``hamid version`` prints it and ``hami_build_info`` carries it. An install
(``make install``) and the image record the commit, the build time and the
shim's version in ``hamid-build.json`` at the root of their venv
(``sys.prefix``) when they are built; a source checkout (``make run``,
tests) has no such file, and its commit and that commit's date are asked of
git once. Where neither says, the value is ``unknown``, never empty.
"""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from . import __version__

BUILD_FILE = "hamid-build.json"
UNKNOWN = "unknown"
_SOURCE = Path(__file__).resolve().parents[1]  # the checkout's root when run from one


@dataclass(frozen=True)
class BuildInfo:
    version: str
    shim_version: str
    revision: str
    build_date: str  # RFC 3339; from a checkout, the commit's date
    source: str  # where the rest came from: the build file's path, "git checkout", or UNKNOWN


def _git(*args: str) -> str:
    try:
        r = subprocess.run(["git", "-C", str(_SOURCE), *args], capture_output=True, text=True, timeout=5)
    except (OSError, subprocess.TimeoutExpired):
        return ""
    return r.stdout.strip() if r.returncode == 0 else ""


def _from_file(path: Path) -> BuildInfo | None:
    try:
        with open(path, "rb") as f:
            doc = json.loads(f.read(4096))
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as e:
        return BuildInfo(__version__, UNKNOWN, UNKNOWN, UNKNOWN, f"{path} unreadable: {e}")
    if not isinstance(doc, dict):
        return BuildInfo(__version__, UNKNOWN, UNKNOWN, UNKNOWN, f"{path}: not a JSON object")

    def field(k: str) -> str:
        v = doc.get(k)
        return v[:100] if isinstance(v, str) and v else UNKNOWN

    return BuildInfo(__version__, field("shim_version"), field("revision"), field("build_date"), str(path))


@lru_cache(maxsize=1)
def build_info() -> BuildInfo:
    """Read once per process: the build file, else the checkout, else unknown."""
    got = _from_file(Path(sys.prefix) / BUILD_FILE)
    if got is not None:
        return got
    shim = _SOURCE / "shim" / "VERSION"
    shim_version = shim.read_text().strip()[:100] if shim.is_file() else UNKNOWN
    if (_SOURCE / ".git").exists() and (rev := _git("rev-parse", "HEAD")):
        dirty = "-dirty" if _git("status", "--porcelain", "--untracked-files=no") else ""  # as git describe
        return BuildInfo(__version__, shim_version, rev + dirty, _git("log", "-1", "--format=%cI") or UNKNOWN,
                         "git checkout (the date is the commit's)")
    return BuildInfo(__version__, shim_version, UNKNOWN, UNKNOWN, UNKNOWN)
