"""The HTTP(S) server: REST paths, discovery, kubeconfigs.

Part of the kube-apiserver stand-in (see the package's docstring); names of its other
parts are linked in by the package at import (``_link``)."""

from __future__ import annotations

from ._base import BaseHTTPRequestHandler, Callable, SERVER_VERSION, ThreadingHTTPServer, contextlib, json, jsonpatch, log, parse_qs, socket, ssl, time, urlsplit, yaml  # noqa: F401

# HTTP

# gnostic openapi_v2.Document{swagger: "2.0", info: {title, version}} in protobuf
def _openapi_v2_proto() -> bytes:
    def ld(field_no: int, payload: bytes) -> bytes:
        return bytes([field_no << 3 | 2, len(payload)]) + payload
    info = ld(1, b"Kubernetes (hamid stand-in)") + ld(2, SERVER_VERSION["gitVersion"].encode())
    return ld(1, b"2.0") + ld(2, info)


_OPENAPI_V2_JSON = {"swagger": "2.0", "info": {"title": "Kubernetes (hamid stand-in)",
                                                "version": SERVER_VERSION["gitVersion"]},
                    "paths": {}, "definitions": {}}

_PATCH_TYPES = ("application/json-patch+json", "application/merge-patch+json",
                "application/strategic-merge-patch+json")


class _Server(ThreadingHTTPServer):
    tls_context: Callable[[str], ssl.SSLContext] | None = None  # local address -> context; None: plain HTTP
    # the listen backlog (the kernel caps it at net.core.somaxconn): kube-apiserver (Go) listens with
    # somaxconn's; socketserver's default of 5 dropped the SYNs of a burst of new connections while this
    # process was busy (the gate leader opens 8 update connections at once), which the client resends
    # only after its 1 s initial retransmission timeout: a pod placed ~1 s after the others
    request_queue_size = 4096

    def finish_request(self, request, client_address) -> None:
        """With TLS, the handshake happens here, in the connection's own
        thread, so a slow or failing client never holds up the others."""
        if self.tls_context is None:
            return super().finish_request(request, client_address)
        try:
            request.settimeout(10)
            conn = self.tls_context(request.getsockname()[0]).wrap_socket(request, server_side=True)
            conn.settimeout(None)
        except (ssl.SSLError, OSError) as e:
            log.debug("apiserver_standin_tls_handshake_failed", client=client_address, error=repr(e))
            return
        try:
            super().finish_request(conn, client_address)
        finally:
            with contextlib.suppress(OSError):
                conn.close()

    def handle_error(self, request, client_address) -> None:
        import sys
        exc = sys.exc_info()[1]
        if isinstance(exc, (ConnectionResetError, BrokenPipeError, ssl.SSLError)):
            return  # a client that hung up (or dropped a pooled connection)
        log.error("apiserver_standin_connection_error", client=client_address, error=repr(exc))


class _Handler(BaseHTTPRequestHandler):
    api: ApiServer
    protocol_version = "HTTP/1.1"
    server_version = "hamid-apiserver-standin"

    def setup(self) -> None:
        super().setup()
        # headers and body go out in separate writes: without this, delayed ACKs stall each answer ~40 ms
        self.request.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def log_message(self, fmt, *args):  # quiet: structlog below
        pass

    # -- plumbing ------------------------------------------------------------

    def _drain(self) -> None:
        """Read a request body nobody read (the request was refused before its
        handler ran), so the next request on this keep-alive connection
        starts where it should."""
        if getattr(self, "_body_read", True):
            return
        self._body_read = True
        length = int(self.headers.get("Content-Length") or 0)
        if length > 64 << 20 or (self.headers.get("Transfer-Encoding") or "").lower() == "chunked":
            self.close_connection = True
        elif length:
            self.rfile.read(length)

    def _send(self, code: int, body, content_type: str = "application/json") -> None:
        self._drain()
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(data)))
        self.send_header("Cache-Control", "no-cache, private")
        for w in getattr(_warnings, "items", None) or []:  # admission warnings, as RFC 7234 warn-code 299
            self.send_header("Warning", '299 - "%s"' % w.replace("\\", "\\\\").replace('"', '\\"'))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(data)

    def _body(self):
        self._body_read = True
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        if not raw:
            return None
        ctype = (self.headers.get("Content-Type") or "application/json").split(";")[0].strip()
        try:
            if ctype in ("application/yaml", "application/apply-patch+yaml"):
                return yaml.safe_load(raw)
            return json.loads(raw)
        except (ValueError, yaml.YAMLError) as e:
            raise bad_request(f"the body of the request is not valid {ctype}: {e}") from None

    def _query(self) -> dict[str, str]:
        q = parse_qs(urlsplit(self.path).query, keep_blank_values=True)
        return {k: v[-1] for k, v in q.items()}

    def _handle(self) -> None:
        started = time.monotonic()
        code = 200
        _warnings.items = []
        _user.info = None
        self._body_read = False
        try:
            _user.info = self.api.impersonate(self.api.authenticate(self.headers.get("Authorization")),
                                              self.headers)
            raw_path = urlsplit(self.path).path or "/"
            if self.api.authorize:
                self.api.check(_user.info, request_attributes(self.command, raw_path, self._query()))
            accept = self.headers.get("Accept") or "*/*"
            path = raw_path.rstrip("/") or "/"
            if path.startswith("/openapi/v2"):
                if "protobuf" in accept:
                    self._send(200, _openapi_v2_proto(), "application/octet-stream")
                else:
                    self._send(200, _OPENAPI_V2_JSON)
                return
            if not any(t in accept for t in ("json", "*/*", "application/*")):
                raise ApiError(406, "NotAcceptable", f"only the following media types are accepted: "
                                                     f"application/json, application/yaml (asked: {accept})")
            code = self._route(path)
        except ApiError as e:
            code = e.code
            self._send(e.code, e.status())
        except (BrokenPipeError, ConnectionResetError, ssl.SSLEOFError):  # the client went away (a killed watcher)
            code = 499
        except Exception as e:  # a bug in the stand-in: say so loudly
            code = 500
            log.exception("apiserver_standin_bug", method=self.command, path=self.path)
            self._send(500, ApiError(500, "InternalError", f"stand-in bug: {e!r}").status())
        finally:
            self.api.requests[(self.command, urlsplit(self.path).path)] += 1
            log.debug("apiserver_standin_request", method=self.command, path=self.path, code=code,
                      ms=round((time.monotonic() - started) * 1000, 2))

    do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = do_HEAD = _handle

    # -- routing -------------------------------------------------------------

    def _route(self, path: str) -> int:
        api = self.api
        parts = [p for p in path.split("/") if p]
        if path in ("/healthz", "/livez", "/readyz"):
            self._send(200, b"ok", "text/plain; charset=utf-8")
            return 200
        if path == "/version":
            self._send(200, SERVER_VERSION)
            return 200
        if path == "/api":
            self._send(200, {"kind": "APIVersions", "versions": ["v1"], "serverAddressByClientCIDRs": [
                {"clientCIDR": "0.0.0.0/0", "serverAddress": "%s:%d" % self.server.server_address[:2]}]})
            return 200
        if path == "/apis":
            self._send(200, {"kind": "APIGroupList", "apiVersion": "v1", "groups": self._groups()})
            return 200
        if parts[:1] == ["api"] and len(parts) >= 2:
            group, version, rest = "", parts[1], parts[2:]
        elif parts[:1] == ["apis"] and len(parts) >= 2:
            group = parts[1]
            if len(parts) == 2:
                found = [g for g in self._groups() if g["name"] == group]
                if not found:
                    raise ApiError(404, "NotFound", "the server could not find the requested resource")
                self._send(200, {"kind": "APIGroup", "apiVersion": "v1", **found[0]})
                return 200
            version, rest = parts[2], parts[3:]
        else:
            raise ApiError(404, "NotFound", "the server could not find the requested resource")
        served = [rt for rt in api.types.values() if rt.group == group and rt.version == version]
        if not served:
            raise ApiError(404, "NotFound", "the server could not find the requested resource")
        if not rest:
            self._send(200, self._resource_list(group, version, served))
            return 200
        watch_path = rest[0] == "watch"
        if watch_path:
            rest = rest[1:]
        ns: str | None = None
        if rest[0] == "namespaces" and len(rest) >= 3 and any(rt.plural == rest[2] and rt.namespaced for rt in served):
            ns, rest = rest[1], rest[2:]
        plural, name, sub = rest[0], (rest[1] if len(rest) > 1 else None), (rest[2] if len(rest) > 2 else None)
        if len(rest) > 3:
            raise ApiError(404, "NotFound", "the server could not find the requested resource")
        rt = api.types.get((group, version, plural))
        if rt is None:
            raise ApiError(404, "NotFound", "the server could not find the requested resource")
        if rt.namespaced and ns is None and name is not None:
            raise ApiError(404, "NotFound", "the server could not find the requested resource")
        if sub is not None and sub not in rt.subresources:
            raise ApiError(404, "NotFound", "the server could not find the requested resource")
        query = self._query()
        method = self.command
        if query.get("dryRun"):
            # refused rather than ignored: an ignored dryRun would write
            raise bad_request(f"dryRun={query['dryRun']!r}: the API-server stand-in does not implement dry runs")
        if watch_path or query.get("watch") in ("1", "true"):
            if method != "GET":
                raise ApiError(405, "MethodNotAllowed", f"the server does not allow this method on the requested "
                                                        f"resource: {method} on a watch")
            if name is not None:  # /watch/.../name: a watch on one object
                query["fieldSelector"] = ",".join(filter(None, [query.get("fieldSelector"), f"metadata.name={name}"]))
            self._watch(rt, ns, query)
            return 200
        ns_key = ns if rt.namespaced else ""
        if rt.review is not None:
            if method != "POST" or name is not None:
                raise ApiError(405, "MethodNotAllowed", f"the server does not allow this method on the requested "
                                                        f"resource: {rt.plural} accepts POST (create) only")
            body = self._body() or {}
            if not isinstance(body, dict):
                raise bad_request(f"the body of a {rt.kind} must be a JSON object")
            self._check_review_kind(rt, body)
            self._send(201, rt.review(api, body, _current_user()))
            return 201
        if name is None:
            if method == "GET":
                self._send(200, api.do_list(rt, ns if rt.namespaced else None, query))
                return 200
            if method == "POST":
                if rt.namespaced and ns is None:
                    raise ApiError(405, "MethodNotAllowed", f"POST to the cluster-wide {rt.plural} is not allowed: "
                                                            f"create in /namespaces/<ns>/{rt.plural}")
                self._send(201, api.do_create(rt, ns_key, self._body() or {}))
                return 201
            raise ApiError(405, "MethodNotAllowed", f"the server does not allow this method on the requested "
                                                    f"resource: {method} on a {rt.plural} collection (the stand-in "
                                                    f"has no deletecollection)")
        if sub == "binding":
            if method != "POST":
                raise ApiError(405, "MethodNotAllowed", "pods/binding accepts POST only")
            api.do_bind(ns_key, name, self._body() or {})
            self._send(201, {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "code": 201})
            return 201
        if method in ("GET", "HEAD"):
            self._send(200, api.do_get(rt, ns_key, name))
            return 200
        if method == "PUT":
            body = self._body()
            self._send(200, api.do_update(rt, ns_key, name, lambda _old: body, subresource=sub))
            return 200
        if method == "PATCH":
            ctype = (self.headers.get("Content-Type") or "").split(";")[0].strip()
            if ctype not in _PATCH_TYPES:
                raise ApiError(415, "UnsupportedMediaType",
                               f"the body of the request was in an unknown format ({ctype or 'none'}) - accepted "
                               f"media types include: {', '.join(_PATCH_TYPES)} (the stand-in has no server-side "
                               f"apply)")
            patch = self._body()
            self._send(200, api.do_update(rt, ns_key, name, lambda old: _apply_patch(rt, ctype, old, patch),
                                          subresource=sub))
            return 200
        if method == "DELETE":
            if sub is not None:
                raise ApiError(405, "MethodNotAllowed", f"DELETE is not allowed on {rt.plural}/{sub}")
            opts = self._body() or {}
            if "gracePeriodSeconds" in query:
                opts["gracePeriodSeconds"] = int(query["gracePeriodSeconds"])
            obj, gone = api.do_delete(rt, ns_key, name, opts)
            if rt.return_deleted_object or not gone:
                self._send(200, obj)
            else:
                details = {"name": name, "kind": rt.plural, "uid": obj["metadata"]["uid"]}
                if rt.group:
                    details["group"] = rt.group
                self._send(200, {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success",
                                 "details": details})
            return 200
        raise ApiError(405, "MethodNotAllowed", f"the server does not allow this method on the requested "
                                                f"resource: {method}")

    def _check_review_kind(self, rt: ResourceType, body: dict) -> None:
        api_version, kind = body.get("apiVersion"), body.get("kind")
        if api_version not in (None, "", rt.group_version) or kind not in (None, "", rt.kind):
            raise bad_request(f"the body is a {api_version}, Kind={kind}: expected {rt.group_version}, "
                              f"Kind={rt.kind}")

    def _groups(self) -> list[dict]:
        groups: dict[str, list[str]] = {}
        for rt in self.api.types.values():
            if rt.group:
                versions = groups.setdefault(rt.group, [])
                if rt.version not in versions:
                    versions.append(rt.version)
        out = []
        for g, versions in groups.items():
            vs = [{"groupVersion": f"{g}/{v}", "version": v} for v in versions]
            out.append({"name": g, "versions": vs, "preferredVersion": vs[0]})
        return out

    def _resource_list(self, group: str, version: str, served: list[ResourceType]) -> dict:
        resources = []
        for rt in served:
            verbs = ["create"] if rt.review else list(_ALL_VERBS)
            resources.append({"name": rt.plural, "singularName": rt.kind.lower(), "namespaced": rt.namespaced,
                              "kind": rt.kind, "verbs": verbs,
                              **({"shortNames": list(rt.short_names)} if rt.short_names else {}),
                              **({"categories": list(rt.categories)} if rt.categories else {})})
            for sub in rt.subresources:
                if sub == "binding":
                    resources.append({"name": f"{rt.plural}/binding", "singularName": "", "namespaced": True,
                                      "kind": "Binding", "verbs": ["create"]})
                else:
                    resources.append({"name": f"{rt.plural}/{sub}", "singularName": "", "namespaced": rt.namespaced,
                                      "kind": rt.kind, "verbs": ["get", "patch", "update"]})
        gv = f"{group}/{version}" if group else version
        return {"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": gv, "resources": resources}

    def _watch(self, rt: ResourceType, ns: str | None, query: dict[str, str]) -> None:
        # validate before the 200: a bad selector is a 400, not a stream
        self.api._matcher(rt, query)
        if query.get("resourceVersion") not in (None, ""):
            _parse_rv(query["resourceVersion"])
        self._drain()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Transfer-Encoding", "chunked")
        self.send_header("Cache-Control", "no-cache, private")
        self.end_headers()

        def emit(ev: dict) -> None:
            data = json.dumps(ev).encode() + b"\n"
            self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
            self.wfile.flush()

        try:
            self.api.watch(rt, ns, query, emit, serving=lambda: not getattr(self.server, "retired", False))
            self.wfile.write(b"0\r\n\r\n")
            self.wfile.flush()
        except (BrokenPipeError, ConnectionResetError):
            pass
        self.close_connection = True


def _apply_patch(rt: ResourceType, ctype: str, old: dict, patch) -> dict:
    if ctype == "application/merge-patch+json":
        if not isinstance(patch, dict):
            raise bad_request("a merge patch must be a JSON object")
        return merge_patch(old, patch)
    if ctype == "application/strategic-merge-patch+json":
        if not isinstance(patch, dict):
            raise bad_request("a strategic merge patch must be a JSON object")
        return strategic_merge_patch(old, patch, rt.merge_keys)
    if not isinstance(patch, list):
        raise bad_request("a JSON patch must be a JSON array of operations")
    try:
        return jsonpatch.apply_patch(old, patch)
    except (jsonpatch.JsonPatchException, jsonpatch.JsonPointerException) as e:
        # the real server's NewGenericServerResponse(422): the reason is in details.causes
        raise ApiError(422, "Invalid", "the server rejected our request due to an error in our request",
                       {"causes": [{"message": f"{type(e).__name__}: {e}"}]}) from None
