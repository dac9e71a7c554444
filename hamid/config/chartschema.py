"""The config file's JSON Schema, for the Helm chart's ``values.schema.json``.

The chart's ``config:`` value becomes the daemon's config file; validating it
with the daemon's own schema (generated from :class:`hamid.config.schema.Config`)
makes ``helm install`` fail on a typo (``devicesplitcount: 3``) or a bad
value, naming the key, instead of every daemon refusing to start.

``python -m hamid.config.chartschema [PATH]`` rewrites the ``config`` property
of ``charts/hamid/values.schema.json`` (and its ``config_*`` definitions);
``tests/chart`` checks the file is current. Pydantic's ``$defs`` move to the
root's ``definitions`` (a ``$ref`` is resolved against the whole document)
under a ``config_`` prefix. Checks a validator makes in code (say, gossip
without a key off loopback) stay the daemon's: the schema covers names, types,
ranges and choices.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

CHART_SCHEMA = Path(__file__).resolve().parents[2] / "charts" / "hamid" / "values.schema.json"
PREFIX = "config_"


def config_schema() -> tuple[dict[str, Any], dict[str, Any]]:
    """(the ``config`` property's schema, the definitions it refers to)."""
    from .schema import Config

    schema = Config.model_json_schema()
    defs = schema.pop("$defs", {})

    def fix(node: Any) -> Any:
        if isinstance(node, dict):
            out = {}
            for k, v in node.items():
                if k == "$ref" and isinstance(v, str) and v.startswith("#/$defs/"):
                    out[k] = "#/definitions/" + PREFIX + v.removeprefix("#/$defs/")
                else:
                    out[k] = fix(v)
            return out
        if isinstance(node, list):
            return [fix(x) for x in node]
        return node

    schema.pop("title", None)
    schema["description"] = ("hamid's config file (hamid/config/schema.py), checked with the daemon's own schema: "
                             "an unknown key or a bad value fails helm install")
    return fix(schema), {PREFIX + k: fix(v) for k, v in defs.items()}


def updated(doc: dict[str, Any]) -> dict[str, Any]:
    """``doc`` (values.schema.json) with its config schema regenerated."""
    prop, defs = config_schema()
    doc = dict(doc)
    doc["properties"] = dict(doc["properties"], config=prop)
    old = {k: v for k, v in (doc.get("definitions") or {}).items() if not k.startswith(PREFIX)}
    doc["definitions"] = {**old, **defs}
    return doc


def main(argv: list[str] | None = None) -> int:
    path = Path((argv or sys.argv[1:] or [str(CHART_SCHEMA)])[0])
    doc = json.loads(path.read_text())
    path.write_text(json.dumps(updated(doc), indent=2) + "\n")
    print(f"wrote the config schema into {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
