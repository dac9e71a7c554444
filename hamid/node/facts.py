"""``node.json``: the facts about this node that the runtime hook needs.

The daemon writes it at start-up (atomically, mode 0600) into the state
directory: the device backend, the shim's installed paths, device roots, GPU
minors and request defaults. The runtime reads it on every ``create``; a JSON
file keeps that path free of heavy imports.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from ..errors import HamidError

FACTS_NAME = "node.json"


def write_facts(state_dir: str | Path, facts: dict[str, Any]) -> None:
    path = Path(state_dir) / FACTS_NAME
    tmp = path.with_name(FACTS_NAME + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump(facts, f, indent=1)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def read_facts(state_dir: str | Path) -> dict[str, Any]:
    path = Path(state_dir) / FACTS_NAME
    try:
        with open(path) as f:
            return json.load(f)
    except FileNotFoundError:
        raise HamidError(f"no {path}: start the daemon once (hamid run --state-dir {state_dir}), "
                         "or give this runtime the daemon's --state-dir") from None
    except ValueError as e:
        raise HamidError(f"{path} is not valid JSON: {e}") from None
