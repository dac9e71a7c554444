"""``HOST:PORT`` addresses of the peer API (``[v6]:PORT`` for IPv6)."""

from __future__ import annotations

import ipaddress

from .errors import HamidError


class AddressError(HamidError):
    """An address that is not ``HOST:PORT``."""


def parse_address(text: str, what: str = "address") -> tuple[str, int]:
    """``(host, port)`` of ``HOST:PORT`` or ``[V6]:PORT``; port 0 only means
    "any free port" to a listener."""
    if not isinstance(text, str) or ":" not in text:
        raise AddressError(f"{what}: bad value {text!r}; accepted: HOST:PORT (e.g. 10.0.0.7:7948)")
    host, _, port_s = text.rpartition(":")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    if not host or not port_s.isascii() or not port_s.isdigit() or not 0 <= int(port_s) <= 65535:
        raise AddressError(f"{what}: bad value {text!r}; accepted: HOST:PORT with a port 0-65535")
    return host, int(port_s)


def format_address(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def is_wildcard(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_unspecified
    except ValueError:
        return False
