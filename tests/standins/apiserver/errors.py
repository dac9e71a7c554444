"""The API errors (metav1.Status bodies) the stand-in answers, as the real server words them.

Part of the kube-apiserver stand-in (see the package's docstring); names of its other
parts are linked in by the package at import (``_link``)."""

from __future__ import annotations

# errors


class ApiError(Exception):
    """An API error answered as a ``Status`` object."""

    def __init__(self, code: int, reason: str, message: str, details: dict | None = None):
        super().__init__(message)
        self.code, self.reason, self.message, self.details = code, reason, message, details

    def status(self) -> dict:
        out = {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
               "message": self.message, "reason": self.reason, "code": self.code}
        if self.details is not None:
            out["details"] = self.details
        return out


def _details(rt: ResourceType | None, name: str, resource: str | None = None) -> dict:
    out: dict = {"name": name}
    if rt is not None:
        if rt.group:
            out["group"] = rt.group
        out["kind"] = resource or rt.plural
    elif resource:
        out["kind"] = resource
    return out


def not_found(rt: ResourceType, name: str) -> ApiError:
    return ApiError(404, "NotFound", f'{rt.qualified} "{name}" not found', _details(rt, name))


def already_exists(rt: ResourceType, name: str) -> ApiError:
    return ApiError(409, "AlreadyExists", f'{rt.qualified} "{name}" already exists', _details(rt, name))


def conflict(rt: ResourceType, name: str, why: str, resource: str | None = None) -> ApiError:
    qualified = resource or rt.qualified
    return ApiError(409, "Conflict", f'Operation cannot be fulfilled on {qualified} "{name}": {why}',
                    _details(rt, name, resource))


def stale(rt: ResourceType, name: str) -> ApiError:
    return conflict(rt, name, "the object has been modified; please apply your changes to the latest "
                              "version and try again")


def invalid(rt: ResourceType, name: str, causes: list[tuple[str, str, str]]) -> ApiError:
    """``causes``: (reason, field, message) as Go's field.Error prints them."""
    text = ", ".join(f"{f}: {m}" for _r, f, m in causes)
    details = _details(rt, name)
    details["kind"] = rt.kind
    details["causes"] = [{"reason": r, "message": m, "field": f} for r, f, m in causes]
    msg = f'{rt.kind} "{name}" is invalid: {text}' if len(causes) == 1 else f'{rt.kind} "{name}" is invalid: [{text}]'
    return ApiError(422, "Invalid", msg, details)


def bad_request(message: str) -> ApiError:
    return ApiError(400, "BadRequest", message)


def expired(message: str) -> ApiError:
    return ApiError(410, "Expired", message)


# ---------------------------------------------------------------------------
