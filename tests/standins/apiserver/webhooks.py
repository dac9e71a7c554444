"""Admission webhooks: AdmissionReview calls to the registered configurations.

Part of the kube-apiserver stand-in (see the package's docstring); names of its other
parts are linked in by the package at import (``_link``)."""

from __future__ import annotations

from ._base import Callable, Mapping, base64, copy, httpx, json, jsonpatch, log, ssl, threading, uuid  # noqa: F401

# admission webhooks (admission.k8s.io/v1 AdmissionReview)


def label_selector_matches(selector: Mapping | None, labels: Mapping[str, str]) -> bool:
    """A metav1.LabelSelector (``matchLabels``, ``matchExpressions`` with In,
    NotIn, Exists, DoesNotExist) over labels; empty or missing matches all."""
    if not selector:
        return True
    for k, v in (selector.get("matchLabels") or {}).items():
        if labels.get(k) != v:
            return False
    for expr in selector.get("matchExpressions") or []:
        key, op, values = expr.get("key"), expr.get("operator"), expr.get("values") or []
        if op == "In":
            ok = key in labels and labels[key] in values
        elif op == "NotIn":
            ok = key not in labels or labels[key] not in values
        elif op == "Exists":
            ok = key in labels
        elif op == "DoesNotExist":
            ok = key not in labels
        else:
            raise bad_request(f'"{op}" is not a valid label selector operator: accepted In, NotIn, Exists, '
                              f"DoesNotExist")
        if not ok:
            return False
    return True


_warnings = threading.local()  # the current HTTP request's warnings (Warning: 299 headers)


def _warn(text: str) -> None:
    items = getattr(_warnings, "items", None)
    if items is not None:
        items.append(text)


class _CallError(Exception):
    """webhookutil.ErrCallingWebhook: failurePolicy decides."""


_user = threading.local()  # the current HTTP request's userInfo (from its bearer token)


def _current_user() -> dict:
    return copy.deepcopy(getattr(_user, "info", None) or USER_INFO)


class WebhookDispatcher:
    """Calls the webhooks of the stored ``MutatingWebhookConfiguration`` and
    ``ValidatingWebhookConfiguration`` objects as kube-apiserver's admission
    does. Mutating: configurations by name, webhooks in order, one after the
    other, each seeing the previous one's patch (reinvocation ``Never``).
    Validating: all matching ones in parallel; any denial refuses.

    ``service_resolver``: there is no cluster network here, so a webhook with
    ``clientConfig.service`` is reached through this callable,
    ``(namespace, name, port) -> "host:port"``, which a test sets; the Service
    object must exist (as for the real server), and the certificate is still
    verified for ``<name>.<namespace>.svc``. Unset, such a call fails (and the
    webhook's failurePolicy decides), as one to an unreachable service does.
    """

    def __init__(self, server: ApiServer) -> None:
        self.server = server
        self.service_resolver: Callable[[str, str, int], str] | None = None
        self._clients: dict[str, httpx.Client] = {}
        self._clients_lock = threading.Lock()
        self.calls = 0  # webhook HTTP calls made (for tests)

    def close(self) -> None:
        with self._clients_lock:
            for c in self._clients.values():
                c.close()
            self._clients.clear()

    def configured(self) -> bool:
        with self.server._cond:
            return any(k[0] in ("mutatingwebhookconfigurations.admissionregistration.k8s.io",
                                "validatingwebhookconfigurations.admissionregistration.k8s.io")
                       for k in self.server._objects)

    # -- matching ------------------------------------------------------------

    def _hooks(self, plural: str) -> list[dict]:
        skey = f"{plural}.admissionregistration.k8s.io"
        with self.server._cond:
            configs = sorted((k[2], v) for k, v in self.server._objects.items() if k[0] == skey)
            return [copy.deepcopy(wh) for _name, cfg in configs for wh in cfg.get("webhooks") or []]

    def _namespace_labels(self, rt: ResourceType, ns: str, obj: dict | None, old: dict | None) -> dict | None:
        """None: the object is cluster-scoped and not a namespace (every
        namespaceSelector matches)."""
        if rt.group == "" and rt.plural == "namespaces":
            return ((obj or old or {}).get("metadata") or {}).get("labels") or {}
        if not rt.namespaced:
            return None
        with self.server._cond:
            nsobj = self.server._objects.get(("namespaces", "", ns))
            if nsobj is None:
                raise ApiError(404, "NotFound", f'namespaces "{ns}" not found', {"name": ns, "kind": "namespaces"})
            return dict(nsobj["metadata"].get("labels") or {})

    @staticmethod
    def _rule_matches(rule: dict, rt: ResourceType, sub: str, operation: str) -> bool:
        if not any(o in ("*", operation) for o in rule.get("operations") or []):
            return False
        if not any(g in ("*", rt.group) for g in rule.get("apiGroups") or []):
            return False
        if not any(v in ("*", rt.version) for v in rule.get("apiVersions") or []):
            return False
        scope = rule.get("scope", "*")
        if scope == "Cluster" and rt.namespaced or scope == "Namespaced" and not rt.namespaced:
            return False
        for res in rule.get("resources") or []:
            r, _, s = res.partition("/")
            if r in ("*", rt.plural) and s in ("*", sub):
                return True
        return False

    def _matching(self, plural: str, rt: ResourceType, sub: str, operation: str, ns: str,
                  obj: dict | None, old: dict | None) -> list[dict]:
        if rt.group == "admissionregistration.k8s.io":
            return []  # never called for webhook configurations (no lock-out)
        hooks = self._hooks(plural)
        if not hooks:
            return []
        ns_labels = None
        out = []
        for wh in hooks:
            if not any(self._rule_matches(r, rt, sub, operation) for r in wh.get("rules") or []):
                continue
            if wh.get("namespaceSelector"):
                if ns_labels is None:
                    ns_labels = self._namespace_labels(rt, ns, obj, old)
                if ns_labels is not None and not label_selector_matches(wh["namespaceSelector"], ns_labels):
                    continue
            sel = wh.get("objectSelector")
            if sel and not any(o is not None and label_selector_matches(
                    sel, (o.get("metadata") or {}).get("labels") or {}) for o in (obj, old)):
                continue
            out.append(wh)
        return out

    # -- the call ------------------------------------------------------------

    def _review(self, rt: ResourceType, sub: str, operation: str, ns: str, obj: dict | None,
                old: dict | None, options: dict) -> dict:
        shown = obj if obj is not None else old
        kind = shown.get("kind") or rt.kind
        group, _, version = (shown.get("apiVersion") or rt.group_version).rpartition("/")
        gvk = {"group": group, "version": version, "kind": kind}
        gvr = {"group": rt.group, "version": rt.version, "resource": rt.plural}
        req = {"uid": str(uuid.uuid4()), "kind": gvk, "resource": gvr, "requestKind": gvk, "requestResource": gvr,
               "name": (shown.get("metadata") or {}).get("name") or "", "operation": operation,
               "userInfo": _current_user(), "object": obj, "oldObject": old, "dryRun": False,
               "options": options or {"kind": f"{operation.capitalize()}Options", "apiVersion": "meta.k8s.io/v1"}}
        if sub:
            req["subResource"] = req["requestSubResource"] = sub
        if ns:
            req["namespace"] = ns
        return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": req}

    def _client(self, ca_bundle: str) -> httpx.Client:
        with self._clients_lock:
            c = self._clients.get(ca_bundle)
            if c is None:
                if ca_bundle:
                    ctx = ssl.create_default_context(cadata=base64.b64decode(ca_bundle).decode())
                else:
                    ctx = ssl.create_default_context()  # the system roots, as the real server
                c = httpx.Client(verify=ctx)
                self._clients[ca_bundle] = c
            return c

    def _call(self, wh: dict, review: dict) -> dict:
        cc = wh.get("clientConfig") or {}
        timeout = int(wh.get("timeoutSeconds") or 10)
        headers = {"Content-Type": "application/json", "Accept": "application/json, */*"}
        extensions: dict = {}
        if cc.get("url"):
            shown = connect = cc["url"]
        else:
            svc = cc["service"]
            host = f"{svc['name']}.{svc['namespace']}.svc"
            port, path = int(svc.get("port") or 443), svc.get("path") or ""
            shown = f"https://{host}:{port}{path}"
            with self.server._cond:
                if ("services", svc["namespace"], svc["name"]) not in self.server._objects:
                    raise _CallError(f'failed to call webhook: service "{svc["name"]}" not found')
            if self.service_resolver is None:
                raise _CallError(f'failed to call webhook: Post "{shown}?timeout={timeout}s": the API-server '
                                 f"stand-in has no cluster network and no service_resolver was set to reach "
                                 f"service {svc['namespace']}/{svc['name']} port {port}")
            connect = f"https://{self.service_resolver(svc['namespace'], svc['name'], port)}{path}"
            headers["Host"] = f"{host}:{port}"
            extensions["sni_hostname"] = host
        sep = "&" if "?" in connect else "?"
        post = f'Post "{shown}?timeout={timeout}s"'
        self.calls += 1
        try:
            r = self._client(cc.get("caBundle") or "").post(
                f"{connect}{sep}timeout={timeout}s", content=json.dumps(review), headers=headers,
                timeout=timeout, extensions=extensions)
        except httpx.TimeoutException:
            raise _CallError(f"failed to call webhook: {post}: context deadline exceeded") from None
        except (httpx.HTTPError, ssl.SSLError, OSError) as e:
            cause: BaseException | None = e
            while cause is not None and not isinstance(cause, ssl.SSLCertVerificationError):
                cause = cause.__cause__ or cause.__context__
            if isinstance(cause, ssl.SSLCertVerificationError):
                why = f"tls: failed to verify certificate: {cause.verify_message}"
            elif "CERTIFICATE_VERIFY_FAILED" in str(e):  # httpcore re-raises without the chain
                why = f"tls: failed to verify certificate: {e}"
            else:
                why = f"{type(e).__name__}: {e}"
            raise _CallError(f"failed to call webhook: {post}: {why}") from None
        if r.status_code != 200:
            raise _CallError(f'failed to call webhook: an error on the server ("{r.text[:200]}") has prevented '
                             f"the request from succeeding (status {r.status_code})")
        try:
            answer = r.json()
        except ValueError as e:
            raise _CallError(f"received invalid webhook response: {e}") from None
        if not isinstance(answer, dict) or answer.get("apiVersion") != "admission.k8s.io/v1" \
                or answer.get("kind") != "AdmissionReview":
            got = answer if not isinstance(answer, dict) else f"{answer.get('apiVersion')}, Kind={answer.get('kind')}"
            raise _CallError(f"received invalid webhook response: expected webhook response of "
                             f"admission.k8s.io/v1, Kind=AdmissionReview, got {got}")
        resp = answer.get("response")
        if not isinstance(resp, dict):
            raise _CallError("received invalid webhook response: webhook response was absent")
        if resp.get("uid") != review["request"]["uid"]:
            raise _CallError(f'received invalid webhook response: expected response.uid="{review["request"]["uid"]}", '
                             f'got "{resp.get("uid")}"')
        if resp.get("patch") and resp.get("patchType") is None:
            raise _CallError("received invalid webhook response: webhook returned response.patch but not "
                             "response.patchType")
        if resp.get("patchType") not in (None, "JSONPatch"):
            raise _CallError(f'received invalid webhook response: webhook returned invalid response.patchType of '
                             f'"{resp["patchType"]}"')
        return resp

    @staticmethod
    def _denied(name: str, status: dict | None) -> ApiError:
        status = dict(status or {})
        code = int(status.get("code") or 0)
        if code < 400:
            code = 400
        denied = f'admission webhook "{name}" denied the request'
        if status.get("message"):
            message = f"{denied}: {status['message']}"
        elif status.get("reason"):
            message = f"{denied}: {status['reason']}"
        else:
            message = f"{denied} without explanation"
        return ApiError(code, status.get("reason") or "", message, status.get("details"))

    @staticmethod
    def _internal(text: str) -> ApiError:
        return ApiError(500, "InternalError", f"Internal error occurred: {text}", {"causes": [{"message": text}]})

    def _ask(self, wh: dict, review: dict) -> dict | None:
        """The webhook's response, or None when it could not be called and its
        failurePolicy is Ignore; raises the real server's errors."""
        name = wh.get("name")
        try:
            return self._call(wh, review)
        except _CallError as e:
            text = f'failed calling webhook "{name}": {e}'
            if wh.get("failurePolicy") == "Ignore":
                log.warning("apiserver_standin_webhook_failing_open", webhook=name, error=text)
                return None
            log.warning("apiserver_standin_webhook_failing_closed", webhook=name, error=text)
            raise self._internal(text) from None

    def mutate(self, rt: ResourceType, sub: str, operation: str, ns: str, obj: dict | None, old: dict | None,
               options: dict) -> dict | None:
        for wh in self._matching("mutatingwebhookconfigurations", rt, sub, operation, ns, obj, old):
            review = self._review(rt, sub, operation, ns, obj, old, options)
            resp = self._ask(wh, review)
            if resp is None:
                continue
            for w in resp.get("warnings") or []:
                _warn(str(w))
            if not resp.get("allowed"):
                raise self._denied(wh["name"], resp.get("status"))
            if not resp.get("patch"):
                continue
            try:
                ops = json.loads(base64.b64decode(resp["patch"], validate=True))
            except (ValueError, TypeError) as e:
                raise self._internal(f"webhook {wh['name']!r} returned a patch that is not base64 JSON: {e}") from None
            if not ops:
                continue
            if obj is None:
                raise self._internal(f'admission webhook "{wh["name"]}" attempted to modify the object, which is '
                                     f"not supported for this operation")
            try:
                obj = jsonpatch.apply_patch(obj, ops)
            except (jsonpatch.JsonPatchException, jsonpatch.JsonPointerException, TypeError) as e:
                raise self._internal(str(e)) from None
            if not isinstance(obj, dict) or not isinstance(obj.get("metadata"), dict):
                raise self._internal(f'admission webhook "{wh["name"]}" patched the object into something that '
                                     f"is not an object with metadata")
            if rt.defaults and not sub:
                rt.defaults(obj)  # the patched object is decoded (and defaulted) again
        return obj

    def validate(self, rt: ResourceType, sub: str, operation: str, ns: str, obj: dict | None, old: dict | None,
                 options: dict) -> None:
        hooks = self._matching("validatingwebhookconfigurations", rt, sub, operation, ns, obj, old)
        if not hooks:
            return
        errors: list[ApiError | None] = [None] * len(hooks)
        warnings: list[list[str]] = [[] for _ in hooks]

        reviews = [self._review(rt, sub, operation, ns, obj, old, options) for _ in hooks]  # this thread's user

        def one(i: int, wh: dict) -> None:
            try:
                resp = self._ask(wh, reviews[i])
                if resp is not None:
                    warnings[i].extend(str(w) for w in resp.get("warnings") or [])
                if resp is not None and resp.get("patch"):
                    raise self._internal(f'failed calling webhook "{wh["name"]}": received invalid webhook '
                                         f"response: validating webhook may not return response.patch")
                if resp is not None and not resp.get("allowed"):
                    raise self._denied(wh["name"], resp.get("status"))
            except ApiError as e:
                errors[i] = e

        threads = [threading.Thread(target=one, args=(i, wh), daemon=True) for i, wh in enumerate(hooks)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        for ws in warnings:
            for w in ws:
                _warn(w)
        for e in errors:
            if e is not None:
                raise e


# ---------------------------------------------------------------------------
