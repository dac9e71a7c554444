"""Label and field selectors, parsed as the real server parses them.

Part of the kube-apiserver stand-in (see the package's docstring); names of its other
parts are linked in by the package at import (``_link``)."""

from __future__ import annotations

from ._base import Callable, Mapping, re  # noqa: F401

# selectors

_LABEL_REQ = re.compile(
    r"^\s*(?P<neg>!)?\s*(?P<key>[A-Za-z0-9_./-]+)\s*"
    r"(?:(?P<op>==|=|!=|>|<)\s*(?P<value>[A-Za-z0-9_.-]*)"
    r"|\s+(?P<setop>in|notin)\s*\((?P<values>[^)]*)\))?\s*$")


def _split_top(text: str) -> list[str]:
    parts, depth, cur = [], 0, ""
    for ch in text:
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
        if ch == "," and depth == 0:
            parts.append(cur)
            cur = ""
        else:
            cur += ch
    parts.append(cur)
    return [p for p in (p.strip() for p in parts) if p]


def parse_label_selector(text: str) -> Callable[[Mapping[str, str]], bool]:
    """A ``labelSelector`` query parameter as a predicate over labels."""
    reqs = []
    for part in _split_top(text):
        m = _LABEL_REQ.match(part)
        if not m or (m.group("neg") and (m.group("op") or m.group("setop"))):
            raise bad_request(f"unable to parse requirement: invalid label selector: {part!r}")
        key = m.group("key")
        if m.group("neg"):
            reqs.append(lambda lb, k=key: k not in lb)
        elif m.group("setop"):
            values = {v.strip() for v in m.group("values").split(",") if v.strip()}
            if m.group("setop") == "in":
                reqs.append(lambda lb, k=key, vs=values: lb.get(k) in vs)
            else:
                reqs.append(lambda lb, k=key, vs=values: lb.get(k) not in vs)
        elif m.group("op"):
            op, value = m.group("op"), m.group("value")
            if op in ("=", "=="):
                reqs.append(lambda lb, k=key, v=value: lb.get(k) == v)
            elif op == "!=":
                reqs.append(lambda lb, k=key, v=value: lb.get(k) != v)
            else:
                try:
                    bound = int(value)
                except ValueError:
                    raise bad_request(f"unable to parse requirement: for 'Gt', 'Lt' operators, the value must "
                                      f"be an integer: {value!r}") from None
                def cmp(lb, k=key, b=bound, gt=(op == ">")):
                    try:
                        n = int(lb[k])
                    except (KeyError, ValueError):
                        return False
                    return n > b if gt else n < b
                reqs.append(cmp)
        else:
            reqs.append(lambda lb, k=key: k in lb)
    return lambda labels: all(r(labels) for r in reqs)


def parse_field_selector(rt: ResourceType, text: str) -> Callable[[dict], bool]:
    """A ``fieldSelector`` query parameter as a predicate over objects; an
    unknown label is the real server's 400."""
    reqs = []
    for part in _split_top(text):
        m = re.match(r"^([^=!]+?)\s*(==|=|!=)\s*(.*)$", part)
        if not m:
            raise bad_request(f"invalid selector: '{text}'; can't understand '{part}'")
        label, op, value = m.group(1).strip(), m.group(2), m.group(3).strip()
        if label not in ("metadata.name", "metadata.namespace") and label not in rt.field_labels:
            raise bad_request(f'field label not supported: {label}')
        reqs.append((label, op == "!=", value))

    def match(obj: dict) -> bool:
        for label, negate, value in reqs:
            have = rt.field_value(obj, label)
            if (have == value) == negate:
                return False
        return True

    return match


# ---------------------------------------------------------------------------
