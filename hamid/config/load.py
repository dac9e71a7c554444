"""Loading the config file: YAML, validation, per-node resolution, flags.

Every rejection names the key, the bad value and what is accepted, and stops
start-up: there is no silent fallback to a default for a bad value.
"""

from __future__ import annotations

import os
import socket
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from ..errors import HamidError
from .schema import Config, NodeOverride, NodeSettings


class ConfigError(HamidError):
    """The configuration is invalid; the message says where and why."""


def _accepted(model: type, key: str) -> str:
    field = model.model_fields.get(key)
    if field is None:
        return ""
    ann = field.annotation
    args = getattr(ann, "__args__", None)
    if args and all(isinstance(a, str) for a in args):
        return f" (accepted: {', '.join(args)})"
    return ""


def _format(err: ValidationError, source: str, data: Any) -> str:
    lines = []
    for e in err.errors():
        loc = e["loc"]
        path = ".".join(str(p) for p in loc)
        if e["type"] == "extra_forbidden":
            model = Config
            if loc and loc[0] == "nodeconfig":
                model = NodeOverride
            elif loc and loc[0] == "filterDevices":
                from .schema import FilterDevices as model  # noqa: N813
            keys = ", ".join(sorted(model.model_fields))
            lines.append(f"{source}: unknown key {path!r}; accepted keys: {keys}")
            continue
        value = e.get("input")
        hint = _accepted(Config, str(loc[-1])) if loc else ""
        lines.append(f"{source}: {path}={value!r}: {e['msg']}{hint}")
    return "\n".join(lines)


def _validate(data: Any, source: str) -> Config:
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: the top level must be a mapping of keys, got {type(data).__name__}")
    try:
        return Config.model_validate(data)
    except ValidationError as e:
        raise ConfigError(_format(e, source, data)) from None


def load_config(path: str | os.PathLike | None = None, overrides: dict[str, Any] | None = None) -> Config:
    """Read the file (if any), then apply command-line ``overrides`` on top."""
    data: dict[str, Any] = {}
    source = "config"
    if path is not None:
        source = str(path)
        try:
            text = Path(path).read_text()
        except OSError as e:
            raise ConfigError(f"cannot read config file {path}: {e.strerror}") from None
        try:
            loaded = yaml.safe_load(text)
        except yaml.YAMLError as e:
            raise ConfigError(f"{path}: not valid YAML: {e}") from None
        if loaded is not None and not isinstance(loaded, dict):
            raise ConfigError(f"{path}: the top level must be a mapping of keys, got {type(loaded).__name__}")
        data = dict(loaded or {})
    for k, v in (overrides or {}).items():
        if v is not None:
            data[k] = v
    return _validate(data, source)


def node_name(config: Config) -> str:
    return config.nodeName or os.environ.get("NODE_NAME") or socket.gethostname()


def resolve_node(config: Config, name: str | None = None) -> NodeSettings:
    """The effective settings for node ``name``: globals with its override merged."""
    name = name or node_name(config)
    base = {k: getattr(config, k) for k in NodeSettings.model_fields}
    for override in config.nodeconfig:
        if override.name == name:
            base.update({k: getattr(override, k) for k in override.model_fields_set if k != "name"})
    return NodeSettings.model_validate(base)
