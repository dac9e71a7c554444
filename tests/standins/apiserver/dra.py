"""resource.k8s.io/v1 for the API server STAND-IN: DeviceClasses, ResourceClaims,
ResourceClaimTemplates and ResourceSlices, with the validation the real server does
on the fields hamid and the tests use.

Written from the API's own field comments and validation rules (kubernetes/api
``resource/v1/types.go``): names, one-of fields, list limits, attribute and
capacity forms, request policies, counters. What it does NOT check: CEL
expressions' compilation and cost (stored as given), the DRA feature gates
(every v1 field is accepted, as on a 1.36+ server with default gates), status
transitions of a claim's allocation (the scheduler stand-in writes it once),
and the ``resource.kubernetes.io/delete-protection`` finalizer.
"""

from __future__ import annotations

import re
from typing import Any

from .kinds import META_MERGE_KEYS, ResourceType, _get, _name_errors

GROUP = "resource.k8s.io"
MAX_REQUESTS = 32
MAX_SUBREQUESTS = 8
MAX_RESULTS = 32
MAX_RESERVED_FOR = 256
MAX_DEVICES = 128
MAX_DEVICES_ADVANCED = 64  # when any device uses taints or counters
MAX_ATTRS_AND_CAPS = 32
MAX_COUNTER_SETS = 8
MAX_COUNTERS = 32
MAX_CONSUMES = 2
MAX_TAINTS = 16
MAX_STRING = 64
MAX_SELECTORS = 32
MAX_CEL = 10 * 1024
MAX_CONFIG = 32

_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_LABEL_VALUE = re.compile(r"(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?")
_KEY_NAME = re.compile(r"^[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$")
_C_IDENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_SEMVER = re.compile(r"^(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)"
                     r"(-[0-9A-Za-z-]+(\.[0-9A-Za-z-]+)*)?(\+[0-9A-Za-z-]+(\.[0-9A-Za-z-]+)*)?$")


def _q(value: Any):
    from hamid.request.quantity import quantity

    return quantity(value)


def _req(causes: list, path: str) -> None:
    causes.append(("FieldValueRequired", path, "Required value"))


def _inv(causes: list, path: str, value: Any, why: str) -> None:
    causes.append(("FieldValueInvalid", path, f"Invalid value: {value!r}: {why}"))


def _too_many(causes: list, path: str, n: int, limit: int) -> None:
    causes.append(("FieldValueTooMany", path, f"Too many: {n}: must have at most {limit} items"))


def _label_errors(causes: list, value: Any, path: str) -> None:
    if not isinstance(value, str) or not value:
        _req(causes, path)
    elif len(value) > 63 or not _LABEL.match(value):
        _inv(causes, path, value, "a lowercase RFC 1123 label must consist of lower case alphanumeric characters "
             "or '-', and must start and end with an alphanumeric character")


def _driver_errors(causes: list, value: Any, path: str) -> None:
    if not isinstance(value, str) or not value:
        _req(causes, path)
        return
    if len(value) > 63:
        _inv(causes, path, value, "must be no more than 63 characters")
    causes.extend(_name_errors(value, "subdomain", path) if len(value) <= 63 else [])


def _qualified_errors(causes: list, name: str, path: str) -> None:
    """An attribute or capacity name: ``<C identifier>`` or ``<domain>/<C identifier>``, the id at most 32."""
    domain, sep, ident = name.rpartition("/")
    if sep:
        _driver_errors(causes, domain, path)
    if not _C_IDENT.match(ident) or len(ident) > 32:
        _inv(causes, path, name, "a C identifier of at most 32 characters, optionally after a DNS domain and '/'")


def _quantity_errors(causes: list, value: Any, path: str, *, minimum: Any = 0):
    try:
        q = _q(value)
    except (ValueError, TypeError):
        _inv(causes, path, value, "quantities must match the regular expression "
             r"'^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$'")
        return None
    if q < minimum:
        _inv(causes, path, value, f"must be greater than or equal to {minimum}")
    return q


def _attribute_errors(causes: list, attr: Any, path: str) -> None:
    if not isinstance(attr, dict):
        _inv(causes, path, attr, "expected an object")
        return
    set_ = [k for k in ("int", "bool", "string", "version") if k in attr]
    if len(set_) != 1:
        causes.append(("FieldValueInvalid", path, "Invalid value: exactly one value must be specified"))
        return
    k = set_[0]
    v = attr[k]
    if k == "int" and (isinstance(v, bool) or not isinstance(v, int)):
        _inv(causes, f"{path}.int", v, "must be an integer")
    if k == "bool" and not isinstance(v, bool):
        _inv(causes, f"{path}.bool", v, "must be a boolean")
    if k == "string":
        if not isinstance(v, str):
            _inv(causes, f"{path}.string", v, "must be a string")
        elif len(v) > MAX_STRING:
            causes.append(("FieldValueTooLong", f"{path}.string", f"Too long: may not be more than {MAX_STRING} "
                                                                   "bytes"))
    if k == "version" and (not isinstance(v, str) or len(v) > MAX_STRING or not _SEMVER.match(v)):
        _inv(causes, f"{path}.version", v, "must be a string compatible with semver.org spec 2.0.0")


def _capacity_errors(causes: list, cap: Any, path: str) -> None:
    if not isinstance(cap, dict) or "value" not in cap:
        _req(causes, f"{path}.value")
        return
    value = _quantity_errors(causes, cap["value"], f"{path}.value")
    policy = cap.get("requestPolicy")
    if policy is None or value is None:
        return
    p = f"{path}.requestPolicy"
    valid_values, rng = policy.get("validValues"), policy.get("validRange")
    if (valid_values is not None) == (rng is not None):
        causes.append(("FieldValueInvalid", p, "Invalid value: exactly one of validValues or validRange must be "
                                               "specified"))
        return
    default = _quantity_errors(causes, policy["default"], f"{p}.default") if "default" in policy else None
    if valid_values is not None:
        qs = [_quantity_errors(causes, v, f"{p}.validValues[{i}]") for i, v in enumerate(valid_values)]
        if any(q is not None and q > value for q in qs):
            _inv(causes, f"{p}.validValues", valid_values, "must be less than or equal to the capacity value")
        if default is not None and default not in qs:
            _inv(causes, f"{p}.default", policy["default"], "must be one of validValues")
        return
    if "min" not in rng:
        _req(causes, f"{p}.validRange.min")
        return
    lo = _quantity_errors(causes, rng["min"], f"{p}.validRange.min")
    hi = _quantity_errors(causes, rng["max"], f"{p}.validRange.max") if "max" in rng else None
    step = _quantity_errors(causes, rng["step"], f"{p}.validRange.step") if "step" in rng else None
    if lo is None:
        return
    if lo > value:
        _inv(causes, f"{p}.validRange.min", rng["min"], "must be less than or equal to the capacity value")
    if hi is not None and (hi > value or hi < lo):
        _inv(causes, f"{p}.validRange.max", rng["max"], "must be between min and the capacity value")
    if step is not None:
        if step <= 0:
            _inv(causes, f"{p}.validRange.step", rng["step"], "must be greater than zero")
        elif lo + step > value:
            _inv(causes, f"{p}.validRange.step", rng["step"], "min + step must be less than or equal to the "
                                                              "capacity value")
        else:
            if hi is not None and (hi - lo) % step:
                _inv(causes, f"{p}.validRange.max", rng["max"], "must be min plus a multiple of step")
            if default is not None and (default - lo) % step:
                _inv(causes, f"{p}.default", policy["default"], "must be min plus a multiple of step")
    if default is not None and (default < lo or (hi is not None and default > hi)):
        _inv(causes, f"{p}.default", policy["default"], "must be within validRange")


def _counters_errors(causes: list, counters: Any, path: str) -> None:
    if not isinstance(counters, dict) or not counters:
        _req(causes, path)
        return
    if len(counters) > MAX_COUNTERS:
        _too_many(causes, path, len(counters), MAX_COUNTERS)
    for name, c in counters.items():
        _label_errors(causes, name, f"{path}[{name}]")
        if not isinstance(c, dict) or "value" not in c:
            _req(causes, f"{path}[{name}].value")
        else:
            _quantity_errors(causes, c["value"], f"{path}[{name}].value")


def _device_errors(causes: list, d: Any, path: str) -> None:
    if not isinstance(d, dict):
        _inv(causes, path, d, "expected an object")
        return
    _label_errors(causes, d.get("name"), f"{path}.name")
    attrs, caps = d.get("attributes") or {}, d.get("capacity") or {}
    if len(attrs) + len(caps) > MAX_ATTRS_AND_CAPS:
        _too_many(causes, f"{path}.attributes", len(attrs) + len(caps), MAX_ATTRS_AND_CAPS)
    for k, v in attrs.items():
        _qualified_errors(causes, k, f"{path}.attributes[{k}]")
        _attribute_errors(causes, v, f"{path}.attributes[{k}]")
    for k, v in caps.items():
        _qualified_errors(causes, k, f"{path}.capacity[{k}]")
        _capacity_errors(causes, v, f"{path}.capacity[{k}]")
        if isinstance(v, dict) and v.get("requestPolicy") is not None and d.get("allowMultipleAllocations") is not True:
            causes.append(("FieldValueForbidden", f"{path}.capacity[{k}].requestPolicy",
                           "Forbidden: allowMultipleAllocations must be true to set a requestPolicy"))
    consumes = d.get("consumesCounters") or []
    if len(consumes) > MAX_CONSUMES:
        _too_many(causes, f"{path}.consumesCounters", len(consumes), MAX_CONSUMES)
    for i, c in enumerate(consumes):
        _label_errors(causes, c.get("counterSet"), f"{path}.consumesCounters[{i}].counterSet")
        _counters_errors(causes, c.get("counters"), f"{path}.consumesCounters[{i}].counters")
    taints = d.get("taints") or []
    if len(taints) > MAX_TAINTS:
        _too_many(causes, f"{path}.taints", len(taints), MAX_TAINTS)
    for i, t in enumerate(taints):
        key = t.get("key")
        if not key:
            _req(causes, f"{path}.taints[{i}].key")
        else:
            prefix, sep, name = key.rpartition("/")
            if sep:
                _driver_errors(causes, prefix, f"{path}.taints[{i}].key")
            if not _KEY_NAME.match(name) or len(name) > 63:
                _inv(causes, f"{path}.taints[{i}].key", key, "a qualified name: an optional DNS prefix and '/', "
                     "then at most 63 alphanumeric characters, '-', '_' or '.'")
        value = t.get("value") or ""
        if len(value) > 63 or not _LABEL_VALUE.fullmatch(value):
            _inv(causes, f"{path}.taints[{i}].value", value, "a valid label must be an empty string or consist of "
                 "alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character")
        if t.get("effect") not in ("NoSchedule", "NoExecute"):
            causes.append(("FieldValueNotSupported", f"{path}.taints[{i}].effect",
                           f'Unsupported value: {t.get("effect")!r}: supported values: "NoExecute", "NoSchedule"'))
    amm = d.get("allowMultipleAllocations")
    if amm is not None and not isinstance(amm, bool):
        _inv(causes, f"{path}.allowMultipleAllocations", amm, "must be a boolean")


def _slice_validate(obj: dict) -> list:
    causes: list = []
    spec = obj.get("spec") or {}
    _driver_errors(causes, spec.get("driver"), "spec.driver")
    pool = spec.get("pool") or {}
    if not pool.get("name"):
        _req(causes, "spec.pool.name")
    gen = pool.get("generation", 0)
    if isinstance(gen, bool) or not isinstance(gen, int) or gen < 0:
        _inv(causes, "spec.pool.generation", gen, "must be greater than or equal to 0")
    count = pool.get("resourceSliceCount")
    if isinstance(count, bool) or not isinstance(count, int) or count <= 0:
        _inv(causes, "spec.pool.resourceSliceCount", count, "must be greater than zero")
    scope = [k for k in ("nodeName", "nodeSelector", "allNodes", "perDeviceNodeSelection")
             if spec.get(k) not in (None, "", False)]
    if len(scope) != 1:
        causes.append(("FieldValueInvalid", "spec", "Invalid value: exactly one of `nodeName`, `nodeSelector`, "
                                                    "`allNodes`, `perDeviceNodeSelection` is required"))
    devices, shared = spec.get("devices") or [], spec.get("sharedCounters") or []
    if devices and shared:
        causes.append(("FieldValueInvalid", "spec", "Invalid value: only one of `devices` or `sharedCounters` may "
                                                    "be set"))
    advanced = any(d.get("taints") or d.get("consumesCounters") for d in devices if isinstance(d, dict))
    limit = MAX_DEVICES_ADVANCED if advanced else MAX_DEVICES
    if len(devices) > limit:
        _too_many(causes, "spec.devices", len(devices), limit)
    seen = set()
    for i, d in enumerate(devices):
        _device_errors(causes, d, f"spec.devices[{i}]")
        if isinstance(d, dict) and d.get("name") in seen:
            causes.append(("FieldValueDuplicate", f"spec.devices[{i}].name", f"Duplicate value: {d.get('name')!r}"))
        seen.add(d.get("name") if isinstance(d, dict) else None)
    if len(shared) > MAX_COUNTER_SETS:
        _too_many(causes, "spec.sharedCounters", len(shared), MAX_COUNTER_SETS)
    for i, cs in enumerate(shared):
        _label_errors(causes, cs.get("name"), f"spec.sharedCounters[{i}].name")
        _counters_errors(causes, cs.get("counters"), f"spec.sharedCounters[{i}].counters")
    return causes


def _selectors_errors(causes: list, selectors: Any, path: str) -> None:
    selectors = selectors or []
    if len(selectors) > MAX_SELECTORS:
        _too_many(causes, path, len(selectors), MAX_SELECTORS)
    for i, s in enumerate(selectors):
        expr = ((s or {}).get("cel") or {}).get("expression")
        if not isinstance(expr, str) or not expr.strip():
            _req(causes, f"{path}[{i}].cel.expression")
        elif len(expr) > MAX_CEL:
            causes.append(("FieldValueTooLong", f"{path}[{i}].cel.expression",
                           f"Too long: may not be more than {MAX_CEL} bytes"))


def _exactly_errors(causes: list, ex: dict, path: str) -> None:
    if not ex.get("deviceClassName"):
        _req(causes, f"{path}.deviceClassName")
    else:
        causes.extend(_name_errors(ex["deviceClassName"], "subdomain", f"{path}.deviceClassName"))
    _selectors_errors(causes, ex.get("selectors"), f"{path}.selectors")
    mode = ex.get("allocationMode", "ExactCount")
    if mode not in ("ExactCount", "All"):
        causes.append(("FieldValueNotSupported", f"{path}.allocationMode",
                       f'Unsupported value: {mode!r}: supported values: "All", "ExactCount"'))
    count = ex.get("count")
    if mode == "ExactCount" and (isinstance(count, bool) or not isinstance(count, int) or count <= 0):
        _inv(causes, f"{path}.count", count, "must be greater than zero")
    if mode == "All" and count not in (None, 0):
        _inv(causes, f"{path}.count", count, "must not be specified when allocationMode is All")
    for k, v in ((ex.get("capacity") or {}).get("requests") or {}).items():
        _qualified_errors(causes, k, f"{path}.capacity.requests[{k}]")
        _quantity_errors(causes, v, f"{path}.capacity.requests[{k}]")


def _claim_spec_errors(causes: list, spec: dict, path: str) -> None:
    devices = spec.get("devices") or {}
    reqs = devices.get("requests") or []
    if len(reqs) > MAX_REQUESTS:
        _too_many(causes, f"{path}.devices.requests", len(reqs), MAX_REQUESTS)
    names = set()
    for i, r in enumerate(reqs):
        p = f"{path}.devices.requests[{i}]"
        _label_errors(causes, r.get("name"), f"{p}.name")
        if r.get("name") in names:
            causes.append(("FieldValueDuplicate", f"{p}.name", f"Duplicate value: {r.get('name')!r}"))
        names.add(r.get("name"))
        if ("exactly" in r) == ("firstAvailable" in r):
            causes.append(("FieldValueRequired", p, "Required value: exactly one of `exactly` or `firstAvailable` "
                                                    "is required"))
            continue
        if "exactly" in r:
            _exactly_errors(causes, r["exactly"] or {}, f"{p}.exactly")
        else:
            subs = r["firstAvailable"] or []
            if not subs:
                _req(causes, f"{p}.firstAvailable")
            if len(subs) > MAX_SUBREQUESTS:
                _too_many(causes, f"{p}.firstAvailable", len(subs), MAX_SUBREQUESTS)
            for j, s in enumerate(subs):
                _label_errors(causes, s.get("name"), f"{p}.firstAvailable[{j}].name")
                _exactly_errors(causes, s, f"{p}.firstAvailable[{j}]")
    cfgs = devices.get("config") or []
    if len(cfgs) > MAX_CONFIG:
        _too_many(causes, f"{path}.devices.config", len(cfgs), MAX_CONFIG)
    for i, c in enumerate(cfgs):
        for r in c.get("requests") or []:
            if r.split("/", 1)[0] not in names:
                _inv(causes, f"{path}.devices.config[{i}].requests", r, "must be the name of a request in the claim "
                                                                         "or the name of a request and a subrequest")
        opaque = c.get("opaque")
        if not opaque:
            _req(causes, f"{path}.devices.config[{i}].opaque")
        else:
            _driver_errors(causes, opaque.get("driver"), f"{path}.devices.config[{i}].opaque.driver")


def _claim_defaults(obj: dict) -> None:
    for r in ((obj.get("spec") or {}).get("devices") or {}).get("requests") or []:
        for ex in ([r["exactly"]] if isinstance(r.get("exactly"), dict) else []) + \
                [s for s in r.get("firstAvailable") or [] if isinstance(s, dict)]:
            ex.setdefault("allocationMode", "ExactCount")
            if ex["allocationMode"] == "ExactCount":
                ex.setdefault("count", 1)


def _template_defaults(obj: dict) -> None:
    _claim_defaults({"spec": ((obj.get("spec") or {}).get("spec") or {})})


def _claim_validate(obj: dict) -> list:
    causes: list = []
    _claim_spec_errors(causes, obj.get("spec") or {}, "spec")
    status = obj.get("status") or {}
    results = (((status.get("allocation") or {}).get("devices") or {}).get("results")) or []
    if len(results) > MAX_RESULTS:
        _too_many(causes, "status.allocation.devices.results", len(results), MAX_RESULTS)
    for i, r in enumerate(results):
        for k in ("request", "driver", "pool", "device"):
            if not r.get(k):
                _req(causes, f"status.allocation.devices.results[{i}].{k}")
    reserved = status.get("reservedFor") or []
    if len(reserved) > MAX_RESERVED_FOR:
        _too_many(causes, "status.reservedFor", len(reserved), MAX_RESERVED_FOR)
    if reserved and not status.get("allocation"):
        causes.append(("FieldValueForbidden", "status.reservedFor", "Forbidden: may not be specified when "
                                                                    "`allocated` is not set"))
    return causes


def _immutable_spec(kind: str):
    def check(server, new: dict, old: dict) -> list:
        if new.get("spec") != old.get("spec"):
            return [("FieldValueInvalid", "spec", "Invalid value: field is immutable")]
        return []
    return check


def _template_validate(obj: dict) -> list:
    causes: list = []
    _claim_spec_errors(causes, (obj.get("spec") or {}).get("spec") or {}, "spec.spec")
    return causes


def _class_validate(obj: dict) -> list:
    causes: list = []
    spec = obj.get("spec") or {}
    _selectors_errors(causes, spec.get("selectors"), "spec.selectors")
    for i, c in enumerate(spec.get("config") or []):
        _driver_errors(causes, ((c or {}).get("opaque") or {}).get("driver"), f"spec.config[{i}].opaque.driver")
    ext = spec.get("extendedResourceName")
    if ext is not None:
        domain, sep, _ = ext.partition("/")
        if not sep or domain.endswith("kubernetes.io") or ext.startswith("requests."):
            _inv(causes, "spec.extendedResourceName", ext, "must be an extended resource name: a domain not in "
                                                           "kubernetes.io, '/', a name")
    return causes


DRA_TYPES: tuple[ResourceType, ...] = (
    ResourceType(GROUP, "v1", "DeviceClass", "deviceclasses", False, (), (), (), {}, META_MERGE_KEYS,
                 generation=True, validate=_class_validate),
    ResourceType(GROUP, "v1", "ResourceClaim", "resourceclaims", True, (), (), ("status",), {}, META_MERGE_KEYS,
                 status_reset_on_create=True, defaults=_claim_defaults, validate=_claim_validate,
                 validate_update=_immutable_spec("ResourceClaim")),
    ResourceType(GROUP, "v1", "ResourceClaimTemplate", "resourceclaimtemplates", True, (), (), (), {},
                 META_MERGE_KEYS, defaults=_template_defaults, validate=_template_validate,
                 validate_update=_immutable_spec("ResourceClaimTemplate")),
    ResourceType(GROUP, "v1", "ResourceSlice", "resourceslices", False, (), (), (),
                 {"spec.nodeName": "spec.nodeName", "spec.driver": "spec.driver",
                  "spec.pool.name": lambda o: _get(o, "spec.pool.name")}, META_MERGE_KEYS,
                 generation=True, validate=_slice_validate),
)
