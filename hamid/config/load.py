"""Loading the config file: YAML, validation, per-node resolution, flags.

Every rejection names the key, the bad value and what is accepted, and stops
start-up: there is no silent fallback to a default for a bad value. A file
that cannot be a config (over MAX_CONFIG_BYTES, not UTF-8, not YAML, nested
deeper than MAX_DEPTH, not a mapping) is refused in one line naming the file
and the problem.
"""

from __future__ import annotations

import os
import socket
from typing import Any

import yaml
from pydantic import ValidationError

from ..errors import HamidError
from .schema import Config, NodeOverride, NodeSettings


MAX_CONFIG_BYTES = 1 << 20  # a config is a few KiB; a node list for thousands of nodes still fits
MAX_DEPTH = 32  # the schema nests 4 deep; the YAML composer recurses once per level


class ConfigError(HamidError):
    """The configuration is invalid; the message says where and why."""


class _TooDeep(Exception):
    def __init__(self, mark) -> None:
        super().__init__()
        self.mark = mark


class _DepthLimitedLoader(yaml.SafeLoader):
    """SafeLoader that stops at MAX_DEPTH nested collections (deeper input ran
    the composer into Python's recursion limit)."""

    _depth = 0

    def compose_node(self, parent, index):
        self._depth += 1
        try:
            if self._depth > MAX_DEPTH:
                raise _TooDeep(self.peek_event().start_mark)
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1


def _read_text(path: str | os.PathLike) -> str:
    try:
        with open(path, "rb") as f:
            data = f.read(MAX_CONFIG_BYTES + 1)
    except OSError as e:
        raise ConfigError(f"cannot read config file {path}: {e.strerror}") from None
    if len(data) > MAX_CONFIG_BYTES:
        raise ConfigError(f"{path}: config file is larger than {MAX_CONFIG_BYTES} bytes (the limit)")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        line = data.count(b"\n", 0, e.start) + 1
        raise ConfigError(f"{path}: not UTF-8 text: byte {data[e.start]:#04x} at offset {e.start} "
                          f"(line {line}); save the file as UTF-8") from None


def _parse_yaml(text: str, path: str | os.PathLike) -> Any:
    loader = _DepthLimitedLoader(text)
    try:
        return loader.get_single_data()
    except _TooDeep as e:
        raise ConfigError(f"{path}: nested deeper than {MAX_DEPTH} levels at line {e.mark.line + 1}, "
                          f"column {e.mark.column + 1}") from None
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark or e.context_mark
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        what = "; ".join(x for x in (e.context, e.problem) if x)
        raise ConfigError(f"{path}: not valid YAML{where}: {what}") from None
    except yaml.YAMLError as e:
        raise ConfigError(f"{path}: not valid YAML: {' '.join(str(e).split())}") from None
    finally:
        loader.dispose()


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
        if not loc:  # a rule across keys: its message names them
            lines.append(f"{source}: {e['msg']}")
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
        loaded = _parse_yaml(_read_text(path), path)
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
