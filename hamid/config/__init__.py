"""config: the one YAML file, its defaults, and per-node overrides.

Owns the schema (:mod:`.schema`, every key with its default and why) and the
loading rules (:mod:`.load`: file, then per-node override matched by node
name, then command-line flags). Knows nothing of devices or placement; other
parts receive the resolved :class:`NodeSettings`.
"""

from .load import ConfigError, load_config, resolve_node
from .schema import Config, FilterDevices, NodeSettings

__all__ = ["Config", "ConfigError", "FilterDevices", "NodeSettings", "load_config", "resolve_node"]
