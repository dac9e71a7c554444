"""JSON, merge and strategic-merge patches, and the delete options.

Part of the kube-apiserver stand-in (see the package's docstring); names of its other
parts are linked in by the package at import (``_link``)."""

from __future__ import annotations

from ._base import Mapping, copy  # noqa: F401

# patches


class _Delete:
    pass


_DELETE = _Delete()


def merge_patch(target, patch):
    """RFC 7386 JSON merge patch."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    out = dict(target) if isinstance(target, dict) else {}
    for k, v in patch.items():
        if v is None:
            out.pop(k, None)
        else:
            out[k] = merge_patch(out.get(k), v)
    return out


def _strip_directives(value):
    if isinstance(value, dict):
        return {k: _strip_directives(v) for k, v in value.items()
                if not k.startswith("$") and v is not None}
    if isinstance(value, list):
        return [_strip_directives(v) for v in value]
    return value


def strategic_merge_patch(original: dict, patch: dict, keys: Mapping[str, str]) -> dict:
    """Kubernetes' strategic merge patch on ``original`` (not changed); see the
    module docstring for the directives and keys supported."""
    out = _smp_map(copy.deepcopy(original), patch, "", keys)
    if out is _DELETE:
        raise bad_request("a strategic merge patch may not delete the whole object")
    return out


def _join(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


def _smp_map(original, patch: dict, path: str, keys: Mapping[str, str]):
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    directive = patch.get("$patch")
    if directive == "delete":
        return _DELETE
    if directive == "replace":
        return _strip_directives(patch)
    if directive not in (None, "merge"):
        raise bad_request(f"Unknown patch type: {directive!r}, accepted: merge, replace, delete")
    out = dict(original) if isinstance(original, dict) else {}
    orders = {}
    for k, v in patch.items():
        if k in ("$patch", "$retainKeys"):
            continue
        if k.startswith("$setElementOrder/"):
            orders[k.split("/", 1)[1]] = v
            continue
        if k.startswith("$deleteFromPrimitiveList/"):
            name = k.split("/", 1)[1]
            out[name] = [x for x in out.get(name) or [] if x not in (v or [])]
            continue
        if k.startswith("$"):
            raise bad_request(f"unknown strategic merge patch directive {k!r}")
        sub = _join(path, k)
        if v is None:
            out.pop(k, None)
        elif isinstance(v, dict):
            merged = _smp_map(out.get(k), v, sub, keys)
            if merged is _DELETE:
                out.pop(k, None)
            else:
                out[k] = merged
        elif isinstance(v, list):
            out[k] = _smp_list(out.get(k), v, sub, keys)
        else:
            out[k] = v
    for name, order in orders.items():
        if isinstance(out.get(name), list):
            out[name] = _apply_order(out[name], order, keys.get(_join(path, name)))
    retain = patch.get("$retainKeys")
    if retain is not None:
        out = {k: v for k, v in out.items() if k in retain}
    return out


def _apply_order(items: list, order: list, key: str | None) -> list:
    def ident(x):
        return x.get(key) if key and isinstance(x, dict) else x
    wanted = [ident(o) for o in order]
    listed = sorted((x for x in items if ident(x) in wanted), key=lambda x: wanted.index(ident(x)))
    return listed + [x for x in items if ident(x) not in wanted]


def _smp_list(original, patch: list, path: str, keys: Mapping[str, str]) -> list:
    key = keys.get(path)
    if key is None:
        return _strip_directives(patch)
    items = list(original) if isinstance(original, list) else []
    if key == "":  # a set of scalars
        return items + [x for x in patch if x not in items]
    if any(isinstance(p, dict) and p.get("$patch") == "replace" for p in patch):
        return [_strip_directives(p) for p in patch if not (isinstance(p, dict) and "$patch" in p)]
    for p in patch:
        if not isinstance(p, dict) or key not in p:
            raise bad_request(f"map: {p!r} does not contain declared merge key: {key}")
        idx = next((i for i, x in enumerate(items) if isinstance(x, dict) and x.get(key) == p[key]), None)
        if p.get("$patch") == "delete":
            if idx is not None:
                del items[idx]
            continue
        if idx is None:
            items.append(_strip_directives(p))
        else:
            items[idx] = _smp_map(items[idx], p, path + "[]", keys)
    return items


# ---------------------------------------------------------------------------
