"""The store: objects by kind, resource versions, watches (ApiServer).

Part of the kube-apiserver stand-in (see the package's docstring); names of its other
parts are linked in by the package at import (``_link``)."""

from __future__ import annotations

from ._base import Callable, Iterable, Mapping, ThreadingHTTPServer, _dt, base64, collections, contextlib, copy, dataclass, deque, ipaddress, itertools, json, log, socket, ssl, threading, time, uuid, yaml  # noqa: F401

from .auth import ADMIN_TOKEN, REVIEW_TYPES, SA_ISSUER  # used while this part loads
from .kinds import BUILTIN_TYPES  # used while this part loads

# the store


def _now() -> str:
    return _dt.datetime.now(_dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _at(seconds: int) -> str:
    return (_dt.datetime.now(_dt.UTC) + _dt.timedelta(seconds=seconds)).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass
class _Event:
    rv: int
    type: str
    skey: str  # storage key of the type
    obj: dict
    prev: dict | None


@dataclass
class _Snapshot:
    rv: int
    items: list


_GENERATE_ALPHABET = "bcdfghjklmnpqrstvwxz2456789"


RBAC_SYNC_S = 1.0  # after a restart, how long RBAC answers 403 before its caches sync (the real one: about 1 s)


class ApiServer:
    """The stand-in; ``with ApiServer() as api:`` or :meth:`start`/:meth:`stop`.

    ``url`` is its base address. Test helpers (direct, not over HTTP, but
    through the same admission, webhooks included):
    :meth:`create`, :meth:`get`, :meth:`list`, :meth:`update`, :meth:`delete`,
    :meth:`set_status`, :meth:`finish_deletion`, :meth:`compact`,
    :meth:`write_kubeconfig`, :meth:`add_token`, :meth:`register`, :meth:`close_watches`,
    :meth:`hold_watches`; :meth:`issue_token` (a service-account JWT),
    :attr:`ca_pem` (with ``tls=True``), :attr:`audit` and :meth:`decide` (with
    ``authorize=True``: the decisions made, and one asked for directly).
    Hooks: :attr:`admission_hooks` (in-process mutating admission, ``hook(rt, operation, obj, old) -> obj`` or raise
    :class:`ApiError`), :attr:`pod_update_hooks` (extra pod update checks,
    ``hook(new, old) -> [(reason, field, message)]``), :attr:`webhooks` (the
    :class:`WebhookDispatcher`; set ``webhooks.service_resolver`` for
    webhooks referenced by Service).
    """

    def __init__(self, *, history: int = 10000, bookmark_interval: float = 1.0,
                 types: Iterable[ResourceType] = BUILTIN_TYPES + REVIEW_TYPES, tls: bool = False,
                 host: str = "127.0.0.1", port: int = 0, tls_names: Iterable[str] = (), authorize: bool = False):
        """``tls``: serve HTTPS with a CA of its own (:attr:`ca_pem`); the
        serving certificate names ``kubernetes.default.svc`` and friends,
        10.96.0.1, localhost, 127.0.0.1, ::1, ``host``, ``tls_names``, and the
        local address each connection came in on (so ``host="0.0.0.0"`` is
        verified on every interface, even one made later). ``host``/``port``:
        where to listen. ``authorize``: authenticate every request and
        authorize it with RBAC (see the module docstring); off, every
        request is allowed, as before."""
        self._cond = threading.Condition()
        self._rv = 0
        self._objects: dict[tuple[str, str, str], dict] = {}  # (storage key, ns, name) -> stored object
        self._history: deque[_Event] = deque()
        self._history_max = history
        self._oldest = 0  # the oldest resourceVersion a watch may start from
        self._snapshots: dict[str, _Snapshot] = {}
        self._snapshot_ids = itertools.count(1)
        self._ips = itertools.count(10)
        self.bookmark_interval = bookmark_interval
        self.types: dict[tuple[str, str, str], ResourceType] = {}  # (group, version, plural)
        self.pod_update_hooks: list[Callable[[dict, dict], list]] = []
        # issue 14: called as hook(rt, operation, obj, old) -> obj (mutated) or raises ApiError
        self.admission_hooks: list[Callable[[ResourceType, str, dict, dict | None], dict]] = []
        self.webhooks = WebhookDispatcher(self)  # see its docstring (service_resolver)
        # bearer token -> userInfo, only to tell webhooks who asks (no authentication: an unknown or absent
        # token is system:admin); add_token() adds one, write_kubeconfig(token=...) uses it
        self.tokens: dict[str, dict] = {ADMIN_TOKEN: copy.deepcopy(USER_INFO)}
        self.authorize = authorize
        self.audit: list[dict] = []  # every authorization decision (authorize=True), oldest first
        self.requests: collections.Counter = collections.Counter()  # (method, path without query) -> count
        self._rbac_generation = 0  # bumped by every write of an RBAC object
        self._rbac_index: tuple[int, _RbacIndex] | None = None
        self._sa_key = None  # the service-account token signing key (RSA), made at the first issue_token
        self._sa_key_lock = threading.Lock()
        self.host, self._port = host, port
        self.tls = tls
        self.ca_pem: bytes | None = None
        self._tls_contexts: dict[str, ssl.SSLContext] = {}
        self._tls_lock = threading.Lock()
        if tls:
            from hamid.webhook import certs
            self._ca = certs.make_ca("hamid apiserver stand-in CA")
            self.ca_pem = self._ca.cert_pem
            names = ["kubernetes", "kubernetes.default", "kubernetes.default.svc",
                     "kubernetes.default.svc.cluster.local", "localhost", "127.0.0.1", "::1", "10.96.0.1"]
            if host not in ("0.0.0.0", "::", ""):
                names.append(host)
            self._tls_names = list(dict.fromkeys([*names, *tls_names]))
        self._stopped = False
        self._rbac_synced_at = 0.0  # restart(): until then, RBAC denies all but system:masters
        self._watch_epoch = 0  # close_watches() ends every stream started in an earlier epoch
        self._watches_held = 0  # while > 0, new watch requests wait (hold_watches)
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None
        for rt in types:
            self.register(rt)
        for ns in ("default", "kube-system", "kube-public", "kube-node-lease"):
            self.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}})
        if (RBAC_GROUP, "v1", "clusterroles") in self.types:
            for name, rules, groups in BOOTSTRAP_CLUSTER_ROLES:
                self.create({"apiVersion": f"{RBAC_GROUP}/v1", "kind": "ClusterRole",
                             "metadata": {"name": name, **copy.deepcopy(_BOOTSTRAP_META)}, "rules": rules})
                self.create({"apiVersion": f"{RBAC_GROUP}/v1", "kind": "ClusterRoleBinding",
                             "metadata": {"name": name, **copy.deepcopy(_BOOTSTRAP_META)},
                             "roleRef": {"apiGroup": RBAC_GROUP, "kind": "ClusterRole", "name": name},
                             "subjects": [{"apiGroup": RBAC_GROUP, "kind": "Group", "name": g} for g in groups]})

    # -- lifecycle -----------------------------------------------------------

    def start(self) -> ApiServer:
        handler = type("Handler", (_Handler,), {"api": self})
        server_cls = _Server
        if ":" in self.host:
            server_cls = type("_Server6", (_Server,), {"address_family": socket.AF_INET6})
        self._server = server_cls((self.host, self._port), handler)
        self._server.daemon_threads = True
        self._server.tls_context = self._tls_context if self.tls else None
        self._thread = threading.Thread(target=self._server.serve_forever, name="apiserver-standin",
                                        kwargs={"poll_interval": 0.05}, daemon=True)
        self._thread.start()
        log.info("apiserver_standin_started", url=self.url)
        return self

    def stop(self) -> None:
        with self._cond:
            self._stopped = True
            self._cond.notify_all()
        self.webhooks.close()
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._thread.join(5)
            self._server = None

    def restart(self, rbac_sync_s: float = RBAC_SYNC_S) -> ApiServer:
        """Stop serving and serve again on the same port with the same objects, as a kube-apiserver
        restarted over the same etcd: open connections and watches end; for ``rbac_sync_s`` after,
        until its RBAC informers have synced, the authorizer knows no role and answers 403 to
        everyone outside system:masters (the real one does for about a second). Nothing may take
        that 403 as final."""
        port = self.port
        if self._server is not None:
            # the old server's watches end however late their handler read the epoch (one that read it after
            # close_watches() went on streaming from the old server: a restart that kept a watch open)
            self._server.retired = True
        self.close_watches()
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._thread.join(5)
        self._port = port
        self._rbac_synced_at = time.monotonic() + rbac_sync_s
        return self.start()

    def rbac_synced(self) -> None:
        """Ends a restart's 403s now (its RBAC informers synced): a test that has seen its clients meet them
        need not wait out the window."""
        self._rbac_synced_at = time.monotonic()

    def __enter__(self) -> ApiServer:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    @property
    def port(self) -> int:
        return self._server.server_address[1]

    @property
    def url(self) -> str:
        """``http(s)://host:port``; a wildcard listen address is shown as loopback."""
        host = self._server.server_address[0]
        host = {"0.0.0.0": "127.0.0.1", "": "127.0.0.1", "::": "::1"}.get(host, host)
        if ":" in host:
            host = f"[{host}]"
        return f"{'https' if self.tls else 'http'}://{host}:{self.port}"

    def _tls_context(self, local_ip: str) -> ssl.SSLContext:
        """The TLS context for connections that came in on ``local_ip``: a
        serving certificate from :attr:`ca_pem`'s CA that names it too."""
        import os
        import tempfile

        from hamid.webhook import certs
        if local_ip.startswith("::ffff:"):
            local_ip = local_ip[7:]
        key = "" if local_ip in self._tls_names else local_ip
        with self._tls_lock:
            ctx = self._tls_contexts.get(key)
            if ctx is None:
                issued = certs.issue(self._ca, self._tls_names + ([key] if key else []))
                ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
                ctx.set_alpn_protocols(["http/1.1"])
                with tempfile.TemporaryDirectory(prefix="apiserver-tls-") as d:
                    crt, k = os.path.join(d, "tls.crt"), os.path.join(d, "tls.key")
                    fd = os.open(k, os.O_WRONLY | os.O_CREAT, 0o600)
                    with os.fdopen(fd, "wb") as f:
                        f.write(issued.key_pem)
                    with open(crt, "wb") as f:
                        f.write(issued.cert_pem)
                    ctx.load_cert_chain(crt, k)
                self._tls_contexts[key] = ctx
            return ctx

    @property
    def resource_version(self) -> int:
        with self._cond:
            return self._rv

    def add_token(self, token: str, username: str, groups: Iterable[str] = ()) -> None:
        """Requests bearing ``token`` are made by ``username`` (what a webhook
        sees in ``userInfo``), e.g. ``system:serviceaccount:kube-system:hamid``."""
        if not token or not username:
            raise ValueError(f"add_token: a token and a username are required (got {token!r}, {username!r})")
        self.tokens[token] = {"username": username, "groups": [*groups, "system:authenticated"]}

    # -- authentication and authorization --------------------------------------

    def _signing_key(self):
        from cryptography.hazmat.primitives import hashes, serialization
        from cryptography.hazmat.primitives.asymmetric import rsa
        with self._sa_key_lock:
            if self._sa_key is None:
                key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
                der = key.public_key().public_bytes(serialization.Encoding.DER,
                                                    serialization.PublicFormat.SubjectPublicKeyInfo)
                digest = hashes.Hash(hashes.SHA256())
                digest.update(der)
                kid = base64.urlsafe_b64encode(digest.finalize()).decode().rstrip("=")
                self._sa_key = (key, kid)
            return self._sa_key

    def issue_token(self, namespace: str, service_account: str, *, expiration_seconds: int = 3607,
                    audiences: Iterable[str] = (SA_ISSUER,), pod: str | None = None) -> str:
        """A service-account token as the TokenRequest API (and kubelet's
        projected volume) makes it: a JWT signed RS256 with a key of this
        server, claims ``iss``, ``sub`` (``system:serviceaccount:NS:NAME``),
        ``aud``, ``exp``, ``iat``, ``nbf``, ``jti`` and ``kubernetes.io``
        (namespace, serviceaccount name and uid; with ``pod=``, that pod's
        name and uid and, when it is bound, its node's). The ServiceAccount
        need not exist yet (its uid claim is then empty); the token
        authenticates only while it does (and while the pod does), as the
        real authenticator checks, and only for the audience
        ``https://kubernetes.default.svc.cluster.local`` (the server's own),
        as the real server accepts only its API audiences. Any
        ``expiration_seconds`` is taken (the real TokenRequest refuses less
        than 600), so a test may watch a token expire."""
        import jwt
        if not namespace or not service_account:
            raise ValueError(f"issue_token: a namespace and a service account name are required "
                             f"(got {namespace!r}, {service_account!r})")
        now = int(time.time())
        with self._cond:
            sa = self._objects.get(("serviceaccounts", namespace, service_account))
            k8s: dict = {"namespace": namespace, "serviceaccount": {
                "name": service_account, "uid": sa["metadata"]["uid"] if sa else ""}}
            if pod is not None:
                p = self._objects.get(("pods", namespace, pod))
                if p is None:
                    raise ValueError(f"issue_token: pod {namespace}/{pod} does not exist: a token is bound to an "
                                     f"existing pod")
                k8s["pod"] = {"name": pod, "uid": p["metadata"]["uid"]}
                node = (p.get("spec") or {}).get("nodeName")
                n = self._objects.get(("nodes", "", node)) if node else None
                if n is not None:
                    k8s["node"] = {"name": node, "uid": n["metadata"]["uid"]}
        claims = {"aud": list(audiences), "exp": now + int(expiration_seconds), "iat": now, "nbf": now,
                  "iss": SA_ISSUER, "jti": str(uuid.uuid4()), "kubernetes.io": k8s,
                  "sub": f"{SA_PREFIX}{namespace}:{service_account}"}
        key, kid = self._signing_key()
        return jwt.encode(claims, key, algorithm="RS256", headers={"kid": kid, "typ": None})

    def _token_user(self, token: str) -> dict | None:
        """The user of a service-account JWT this server signed, or None
        (bad signature, expired, wrong audience or issuer, the service account
        or bound pod gone or replaced)."""
        import jwt
        if self._sa_key is None or token.count(".") != 2:
            return None
        key, _kid = self._sa_key
        try:
            claims = jwt.decode(token, key.public_key(), algorithms=["RS256"], audience=SA_ISSUER, issuer=SA_ISSUER,
                                options={"require": ["exp", "iat", "sub"]})
        except jwt.PyJWTError as e:
            log.debug("apiserver_standin_token_refused", error=str(e))
            return None
        k8s = claims.get("kubernetes.io") or {}
        ns, sa = k8s.get("namespace") or "", (k8s.get("serviceaccount") or {}).get("name") or ""
        if claims["sub"] != f"{SA_PREFIX}{ns}:{sa}":
            return None
        with self._cond:
            stored = self._objects.get(("serviceaccounts", ns, sa))
            claimed = (k8s.get("serviceaccount") or {}).get("uid")
            if stored is None or (claimed and stored["metadata"]["uid"] != claimed):
                log.debug("apiserver_standin_token_refused", error=f"service account {ns}/{sa} not found "
                                                                   f"(or not uid {claimed})")
                return None
            extra = {"authentication.kubernetes.io/credential-id": [f"JTI={claims.get('jti')}"]}
            if "pod" in k8s:
                p = self._objects.get(("pods", ns, k8s["pod"].get("name")))
                if p is None or p["metadata"]["uid"] != k8s["pod"].get("uid"):
                    log.debug("apiserver_standin_token_refused", error=f"pod {ns}/{k8s['pod'].get('name')} gone")
                    return None
                extra["authentication.kubernetes.io/pod-name"] = [k8s["pod"]["name"]]
                extra["authentication.kubernetes.io/pod-uid"] = [k8s["pod"]["uid"]]
                if "node" in k8s:
                    extra["authentication.kubernetes.io/node-name"] = [k8s["node"]["name"]]
                    extra["authentication.kubernetes.io/node-uid"] = [k8s["node"]["uid"]]
            return {"username": claims["sub"], "uid": stored["metadata"]["uid"], "groups": service_account_groups(ns),
                    "extra": extra}

    def authenticate(self, authorization: str | None) -> dict:
        """The user of a request's ``Authorization`` header. A bearer token
        of :attr:`tokens` or from :meth:`issue_token` is its user; with
        ``authorize`` on, any other bearer token is 401 and a request without
        one is ``system:anonymous`` (group ``system:unauthenticated``); off,
        both are system:admin, as before."""
        scheme, _, token = (authorization or "").strip().partition(" ")
        token = token.strip()
        if scheme.lower() == "bearer" and token:
            info = self.tokens.get(token) or self._token_user(token)
            if info is not None:
                return copy.deepcopy(info)
            if self.authorize:
                raise unauthorized()
            return copy.deepcopy(USER_INFO)
        return copy.deepcopy(ANONYMOUS if self.authorize else USER_INFO)

    def impersonate(self, user: dict, headers) -> dict:
        """The user a request acts as: ``user`` unless it carries
        ``Impersonate-User`` (and ``Impersonate-Group``s), which ``user`` must
        be allowed to ``impersonate`` (resource ``users``, ``serviceaccounts``
        in the account's namespace, ``groups``), each check authorized and
        audited like a request; a service account impersonated without groups
        gets its own; ``system:authenticated`` is added (``system:unauthenticated``
        for ``system:anonymous``). ``Impersonate-Uid`` and ``-Extra-`` are
        refused (not implemented)."""
        name = headers.get("Impersonate-User")
        groups = headers.get_all("Impersonate-Group") or []
        if any(k.lower().startswith(("impersonate-uid", "impersonate-extra-")) for k in headers.keys()):
            raise bad_request("Impersonate-Uid and Impersonate-Extra-* are not implemented by the API-server "
                              "stand-in: impersonate a user and groups only")
        if not name:
            if groups:
                raise ApiError(500, "InternalError", "Internal error occurred: requested [" + ", ".join(
                    f"{{Group {g}}}" for g in groups) + "] without impersonating a user")
            return user
        if name.startswith(SA_PREFIX) and name.count(":") == 3:
            ns, sa = name[len(SA_PREFIX):].split(":")
            wanted = [RequestAttributes("impersonate", "", True, resource="serviceaccounts", namespace=ns, name=sa)]
        else:
            ns, wanted = "", [RequestAttributes("impersonate", "", True, resource="users", name=name)]
        wanted += [RequestAttributes("impersonate", "", True, resource="groups", name=g) for g in groups]
        for attrs in wanted:
            self.check(user, attrs)
        if ns and not groups:  # a service account's own groups come with it, unchecked
            groups = service_account_groups(ns)[:-1]
        extra = "system:unauthenticated" if name == ANONYMOUS["username"] else "system:authenticated"
        return {"username": name, "groups": [*groups, *([extra] if extra not in groups else [])]}

    def _rbac(self) -> _RbacIndex:
        with self._cond:
            if self._rbac_index is not None and self._rbac_index[0] == self._rbac_generation:
                return self._rbac_index[1]
            index = _RbacIndex({}, {}, [], {})
            for (skey, ns, name), obj in sorted(self._objects.items()):
                if skey == f"clusterroles.{RBAC_GROUP}":
                    index.cluster_roles[name] = obj
                elif skey == f"roles.{RBAC_GROUP}":
                    index.roles[(ns, name)] = obj
                elif skey == f"clusterrolebindings.{RBAC_GROUP}":
                    index.cluster_role_bindings.append(obj)
                elif skey == f"rolebindings.{RBAC_GROUP}":
                    index.role_bindings.setdefault(ns, []).append(obj)
            self._rbac_index = (self._rbac_generation, index)
            return index

    def decide(self, user: Mapping, attrs: RequestAttributes) -> tuple[bool, str]:
        """(allowed, reason) for ``user`` (a userInfo dict) doing ``attrs``:
        ``system:masters`` is allowed everything (the privileged-group
        authorizer before RBAC), else RBAC over the stored roles and bindings."""
        if MASTERS in (user.get("groups") or []):
            return True, ""
        if time.monotonic() < self._rbac_synced_at:  # restarted: RBAC's caches not synced yet, no role known
            return False, ""
        return rbac_decide(self._rbac(), user, attrs)

    def check(self, user: Mapping, attrs: RequestAttributes) -> None:
        """Authorize one request: record the decision in :attr:`audit`; a
        denial raises the real 403. Everything is allowed (and nothing
        recorded) with ``authorize`` off."""
        if not self.authorize:
            return
        allowed, reason = self.decide(user, attrs)
        self.audit.append({"user": user.get("username"), "groups": list(user.get("groups") or []),
                           "verb": attrs.verb, "apiGroup": attrs.api_group, "resource": attrs.resource,
                           "subresource": attrs.subresource, "namespace": attrs.namespace, "name": attrs.name,
                           "path": attrs.path, "allowed": allowed, "reason": reason})
        if not allowed:
            raise forbidden(str(user.get("username")), attrs, reason)


    def write_kubeconfig(self, path, token: str = ADMIN_TOKEN, server: str | None = None) -> str:
        """A kubeconfig for kubectl and the Python client pointing here (mode
        0600; ``server`` instead of :attr:`url` if given), with ``token`` as
        its bearer token: the default is system:admin's (in system:masters);
        pass :meth:`issue_token`'s or :meth:`add_token`'s for another user.
        With TLS it carries the CA (``certificate-authority-data``)."""
        import os
        cluster: dict = {"server": server or self.url}
        if self.ca_pem is not None:
            cluster["certificate-authority-data"] = base64.b64encode(self.ca_pem).decode()
        doc = {"apiVersion": "v1", "kind": "Config", "current-context": "standin",
               "clusters": [{"name": "standin", "cluster": cluster}],
               "users": [{"name": "standin", "user": {"token": token}}],
               "contexts": [{"name": "standin", "context": {"cluster": "standin", "user": "standin",
                                                            "namespace": "default"}}]}
        fd = os.open(str(path), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            yaml.safe_dump(doc, f)
        return str(path)

    # -- types ---------------------------------------------------------------

    def register(self, rt: ResourceType) -> None:
        """Serve one more kind (e.g. admissionregistration.k8s.io/v1
        mutatingwebhookconfigurations)."""
        k = (rt.group, rt.version, rt.plural)
        if k in self.types:
            raise ValueError(f"resource {rt.plural} in {rt.group_version!r} is already registered")
        if rt.storage is not None and (rt.to_storage is None or rt.from_storage is None):
            raise ValueError(f"{rt.key}: storage={rt.storage!r} needs to_storage and from_storage")
        self.types[k] = rt

    def type_for(self, kind: str, api_version: str | None = None) -> ResourceType:
        """The type of a kind (``Pod``), a plural (``pods``) or ``plural.group``."""
        found = [rt for rt in self.types.values()
                 if kind in (rt.kind, rt.plural, rt.key) and (api_version is None or rt.group_version == api_version)
                 and rt.storage is None]
        if api_version is not None and not found:
            found = [rt for rt in self.types.values()
                     if kind in (rt.kind, rt.plural, rt.key) and rt.group_version == api_version]
        if len(found) != 1:
            known = sorted({rt.kind for rt in self.types.values()})
            raise KeyError(f"kind {kind!r} (apiVersion {api_version}) is {'ambiguous' if found else 'unknown'}; "
                           f"known kinds: {', '.join(known)}")
        return found[0]

    # -- helpers for tests (no HTTP) -----------------------------------------

    def create(self, obj: dict) -> dict:
        rt = self.type_for(obj["kind"], obj.get("apiVersion"))
        ns = (obj.get("metadata") or {}).get("namespace", "default") if rt.namespaced else ""
        return self.do_create(rt, ns, copy.deepcopy(obj))

    def get(self, kind: str, namespace: str | None, name: str) -> dict:
        rt = self.type_for(kind)
        return self.do_get(rt, namespace or "", name)

    def list(self, kind: str, namespace: str | None = None) -> list[dict]:
        rt = self.type_for(kind)
        return self.do_list(rt, namespace, {})["items"]

    def update(self, obj: dict) -> dict:
        rt = self.type_for(obj["kind"], obj.get("apiVersion"))
        meta = obj["metadata"]
        return self.do_update(rt, meta.get("namespace", "") if rt.namespaced else "", meta["name"],
                              lambda _old: copy.deepcopy(obj))

    def set_status(self, kind: str, namespace: str | None, name: str, status: dict) -> dict:
        """Merge ``status`` into the object's status (RFC 7386) as a kubelet
        or controller writing the status subresource would."""
        rt = self.type_for(kind)
        return self.do_update(rt, namespace or "", name,
                              lambda old: {**old, "status": merge_patch(old.get("status") or {}, status)},
                              subresource="status")

    def delete(self, kind: str, namespace: str | None, name: str, grace_period: int | None = None) -> dict:
        rt = self.type_for(kind)
        opts = {} if grace_period is None else {"gracePeriodSeconds": grace_period}
        return self.do_delete(rt, namespace or "", name, opts)[0]

    def finish_deletion(self, namespace: str, name: str) -> dict:
        """What kubelet does once a deleting pod's containers stopped: delete
        it with grace 0."""
        pod = self.get("Pod", namespace, name)
        if not pod["metadata"].get("deletionTimestamp"):
            raise ValueError(f"pod {namespace}/{name} is not being deleted; delete it first")
        return self.delete("Pod", namespace, name, grace_period=0)

    def close_watches(self) -> None:
        """End every open watch stream, as a restarting API server (or a proxy's
        idle timeout) does; clients resume from the last resourceVersion they saw."""
        with self._cond:
            self._watch_epoch += 1
            self._cond.notify_all()

    @contextlib.contextmanager
    def hold_watches(self):
        """Close the open watches and make new ones wait until the block ends, so a
        test can move the store on (writes, compact()) while no watch follows it:
        a client resuming from its last resourceVersion then meets the 410."""
        with self._cond:
            self._watches_held += 1
        self.close_watches()
        try:
            yield self
        finally:
            with self._cond:
                self._watches_held -= 1
                self._cond.notify_all()

    def compact(self) -> int:
        """Drop the watch history and list snapshots, like an etcd compaction:
        a watch from an older resourceVersion, or a continue token, is 410."""
        with self._cond:
            self._history.clear()
            self._snapshots.clear()
            self._oldest = self._rv
            self._cond.notify_all()
            return self._rv

    # -- the store -----------------------------------------------------------

    def _view(self, rt: ResourceType, stored: dict) -> dict:
        obj = rt.from_storage(stored) if rt.from_storage else copy.deepcopy(stored)
        return obj

    def _bump(self) -> int:
        self._rv += 1
        return self._rv

    def _record(self, type_: str, skey: str, obj: dict, prev: dict | None) -> None:
        if skey.endswith(f".{RBAC_GROUP}"):
            self._rbac_generation += 1
        self._history.append(_Event(self._rv, type_, skey, copy.deepcopy(obj), prev))
        while len(self._history) > self._history_max:
            dropped = self._history.popleft()
            self._oldest = dropped.rv
        self._cond.notify_all()

    def _allocate_cluster_ip(self) -> str:
        return str(ipaddress.ip_address("10.96.0.0") + next(self._ips))

    def _check_namespace(self, rt: ResourceType, ns: str) -> None:
        if rt.namespaced and ("namespaces", "", ns) not in self._objects:
            raise ApiError(404, "NotFound", f'namespaces "{ns}" not found', {"name": ns, "kind": "namespaces"})

    def do_create(self, rt: ResourceType, ns: str, body: dict) -> dict:
        """Create as the real server orders it: defaults, the in-process
        :attr:`admission_hooks`, mutating webhooks, then names, validation,
        validating webhooks, store. No lock is held while a webhook is called
        (a webhook may call this server)."""
        if not isinstance(body, dict):
            raise bad_request(f"the body of a create must be a JSON object, not {type(body).__name__}")
        self._check_kind(rt, body)
        meta = body.setdefault("metadata", {})
        if not isinstance(meta, dict):
            raise bad_request("metadata must be an object")
        if rt.namespaced:
            if meta.get("namespace") not in (None, "", ns):
                raise bad_request("the namespace of the provided object does not match the namespace sent "
                                  "on the request")
            meta["namespace"] = ns
        else:
            meta.pop("namespace", None)
        if meta.get("resourceVersion"):
            raise ApiError(500, "InternalError", "resourceVersion should not be set on objects to be created",
                           {"causes": [{"message": "resourceVersion should not be set on objects to be created"}]})
        with self._cond:
            self._check_namespace(rt, ns)
        for k in ("uid", "creationTimestamp", "deletionTimestamp", "deletionGracePeriodSeconds",
                  "generation", "managedFields", "selfLink"):
            meta.pop(k, None)
        if rt.defaults:
            rt.defaults(body)
        for hook in self.admission_hooks:
            body = hook(rt, "CREATE", body, None)
        body = self.webhooks.mutate(rt, "", "CREATE", ns, body, None, {})
        meta = body["metadata"]
        if rt.status_reset_on_create:
            body.pop("status", None)
        if rt.prepare_create:
            rt.prepare_create(self, body)
        with self._cond:
            if not meta.get("name") and meta.get("generateName"):
                while True:
                    suffix = "".join(_GENERATE_ALPHABET[b % len(_GENERATE_ALPHABET)] for b in uuid.uuid4().bytes[:5])
                    candidate = meta["generateName"] + suffix
                    if (rt.storage_key, ns, candidate) not in self._objects:
                        meta["name"] = candidate
                        break
        name = meta.get("name") or ""
        if not name:
            raise invalid(rt, "", [("FieldValueRequired", "metadata.name",
                                    "Required value: name or generateName is required")])
        causes = _name_errors(name, rt.name_rule)
        if causes:
            raise invalid(rt, name, causes)
        if rt.validate:
            causes = rt.validate(body)
            if causes:
                raise invalid(rt, name, causes)
        self.webhooks.validate(rt, "", "CREATE", ns, body, None, {})
        with self._cond:
            self._check_namespace(rt, ns)
            stored = rt.to_storage(body) if rt.to_storage else body
            key = (rt.storage_key, ns, name)
            if key in self._objects:
                raise already_exists(rt, name)
            smeta = stored["metadata"]
            smeta["uid"] = str(uuid.uuid4())
            smeta["creationTimestamp"] = _now()
            if rt.generation:
                smeta["generation"] = 1
            smeta["resourceVersion"] = str(self._bump())
            self._objects[key] = stored
            self._record("ADDED", rt.storage_key, stored, None)
            view = self._view(rt, stored)
        if rt.controller:
            rt.controller(self, view)
        return view

    def _check_kind(self, rt: ResourceType, body: dict) -> None:
        api_version, kind = body.get("apiVersion"), body.get("kind")
        if api_version not in (None, "", rt.group_version):
            raise bad_request(f"the API version in the data ({api_version}) does not match the expected API "
                              f"version ({rt.group_version})")
        if kind not in (None, "", rt.kind):
            raise bad_request(f"the kind in the data ({kind}) does not match the expected kind ({rt.kind})")
        body["apiVersion"], body["kind"] = rt.group_version, rt.kind

    def do_get(self, rt: ResourceType, ns: str, name: str) -> dict:
        with self._cond:
            stored = self._objects.get((rt.storage_key, ns, name))
            if stored is None:
                raise not_found(rt, name)
            return self._view(rt, stored)

    def do_update(self, rt: ResourceType, ns: str, name: str, mutate: Callable[[dict], dict],
                  subresource: str | None = None) -> dict:
        """Read, ``mutate(view) -> new view``, check, admit, store: the one
        write path of PUT, PATCH, status and binding. Optimistic, as etcd's
        GuaranteedUpdate: nothing is locked while ``mutate`` and the webhooks
        run; if the object changed meanwhile, all of it runs again on the new
        one (so a request that carried the old resourceVersion gets its 409)."""
        key = (rt.storage_key, ns, name)
        while True:
            with self._cond:
                stored = self._objects.get(key)
                if stored is None:
                    raise not_found(rt, name)
                old = self._view(rt, stored)
            new = self._updated(rt, ns, name, mutate, subresource, old)
            with self._cond:
                if self._objects.get(key) is not stored:
                    continue  # written meanwhile: again, on the new object
                if new == old:
                    return old  # nothing changed: no write, no event
                meta, ometa = new["metadata"], old["metadata"]
                if rt.generation and _spec_of(new) != _spec_of(old):
                    meta["generation"] = int(ometa.get("generation", 0)) + 1
                stored_new = rt.to_storage(new) if rt.to_storage else new
                meta_s = stored_new["metadata"]
                if (meta_s.get("deletionTimestamp") and not meta_s.get("finalizers")
                        and meta_s.get("deletionGracePeriodSeconds", 0) == 0):
                    return self._remove(rt, key, stored_new)
                meta_s["resourceVersion"] = str(self._bump())
                self._objects[key] = stored_new
                self._record("MODIFIED", rt.storage_key, stored_new, stored)
                view = self._view(rt, stored_new)
            if rt.controller:
                rt.controller(self, view)
            return view

    def _updated(self, rt: ResourceType, ns: str, name: str, mutate: Callable[[dict], dict],
                 subresource: str | None, old: dict) -> dict:
        new = mutate(copy.deepcopy(old))
        if not isinstance(new, dict):
            raise bad_request(f"the updated object must be a JSON object, not {type(new).__name__}")
        self._check_kind(rt, new)
        meta = new.get("metadata")
        if not isinstance(meta, dict):
            raise bad_request("metadata must be an object")
        if meta.get("name") != name:
            raise bad_request(f"the name of the object ({meta.get('name')}) does not match the name on "
                              f"the URL ({name})")
        if rt.namespaced and meta.get("namespace") not in (None, "", ns):
            raise bad_request("the namespace of the provided object does not match the namespace sent on "
                              "the request")
        sent_rv = meta.get("resourceVersion")
        if sent_rv not in (None, "") and sent_rv != old["metadata"]["resourceVersion"]:
            raise stale(rt, name)
        ometa = old["metadata"]
        for k in ("uid", "creationTimestamp", "deletionTimestamp", "deletionGracePeriodSeconds",
                  "generation", "resourceVersion"):
            if k in ometa:
                meta[k] = ometa[k]
            else:
                meta.pop(k, None)
        if rt.namespaced:
            meta["namespace"] = ns
        if "status" in rt.subresources:
            if subresource == "status":
                for k in set(new) | set(old):
                    if k not in ("metadata", "status", "apiVersion", "kind"):
                        if k in old:
                            new[k] = old[k]
                        else:
                            new.pop(k, None)
                if "ownerReferences" in ometa:
                    meta["ownerReferences"] = ometa["ownerReferences"]
                else:
                    meta.pop("ownerReferences", None)
            elif subresource is None:
                if "status" in old:
                    new["status"] = old["status"]
                else:
                    new.pop("status", None)
        if rt.kind == "Secret" and rt.group == "":
            _fold_string_data(new)
        if subresource is None:
            if rt.defaults:
                rt.defaults(new)  # every decoded object is defaulted, an update's too
            for hook in self.admission_hooks:
                new = hook(rt, "UPDATE", new, old)
        if subresource in (None, "status"):  # binding: admitted as a CREATE of the Binding (do_bind)
            new = self.webhooks.mutate(rt, subresource or "", "UPDATE", ns, new, old, {})
            meta = new["metadata"]
        if rt.prepare_update and subresource is None:
            rt.prepare_update(self, new, old)
        if rt.validate_update and subresource is None:
            causes = rt.validate_update(self, new, old)
            if causes:
                raise invalid(rt, name, causes)
        if rt.validate:
            causes = rt.validate(new)
            if causes:
                raise invalid(rt, name, causes)
        if ometa.get("deletionTimestamp") and len(meta.get("finalizers") or []) > len(ometa.get("finalizers") or []):
            raise invalid(rt, name, [("FieldValueForbidden", "metadata.finalizers",
                                      "Forbidden: no new finalizers can be added if the object is being deleted")])
        if subresource in (None, "status") and new != old:
            self.webhooks.validate(rt, subresource or "", "UPDATE", ns, new, old, {})
        return new

    def _remove(self, rt: ResourceType, key, last: dict) -> dict:
        prev = self._objects.pop(key)
        last = copy.deepcopy(last)
        last["metadata"]["resourceVersion"] = str(self._bump())
        self._record("DELETED", rt.storage_key, last, prev)
        return self._view(rt, last)

    def do_delete(self, rt: ResourceType, ns: str, name: str, options: dict) -> tuple[dict, bool]:
        """Returns (the object as it now is or was last, whether it is gone)."""
        if self.webhooks.configured():
            current = self.do_get(rt, ns, name)
            opts = {"kind": "DeleteOptions", "apiVersion": "meta.k8s.io/v1", **options}
            self.webhooks.mutate(rt, "", "DELETE", ns, None, current, opts)
            self.webhooks.validate(rt, "", "DELETE", ns, None, current, opts)
        with self._cond:
            key = (rt.storage_key, ns, name)
            stored = self._objects.get(key)
            if stored is None:
                raise not_found(rt, name)
            meta = stored["metadata"]
            pre = options.get("preconditions") or {}
            if pre.get("uid") and pre["uid"] != meta["uid"]:
                raise conflict(rt, name, f"Precondition failed: UID in precondition: {pre['uid']}, UID in object "
                                         f"meta: {meta['uid']}")
            if pre.get("resourceVersion") and pre["resourceVersion"] != meta["resourceVersion"]:
                raise conflict(rt, name, f"Precondition failed: ResourceVersion in precondition: "
                                         f"{pre['resourceVersion']}, ResourceVersion in object meta: "
                                         f"{meta['resourceVersion']}")
            if rt.key == "namespaces":
                for k in [k for k in self._objects if k[1] == name and k[0] != "namespaces"]:
                    self._remove(self._storage_type(k[0]), k, self._objects[k])
            grace = 0
            if rt.graceful:
                grace = options.get("gracePeriodSeconds")
                if grace is None:
                    grace = (stored.get("spec") or {}).get("terminationGracePeriodSeconds") or 0
                if not (stored.get("spec") or {}).get("nodeName"):
                    grace = 0
                if (stored.get("status") or {}).get("phase") in ("Succeeded", "Failed"):
                    grace = 0
                grace = 1 if grace < 0 else int(grace)
                current = meta.get("deletionGracePeriodSeconds")
                if current is not None and grace >= current and grace != 0:
                    return self._view(rt, stored), False  # already deleting with a shorter or equal grace
            if grace == 0 and not meta.get("finalizers"):
                return self._remove(rt, key, stored), True
            new = copy.deepcopy(stored)
            nmeta = new["metadata"]
            if not nmeta.get("deletionTimestamp") or grace < (nmeta.get("deletionGracePeriodSeconds") or 0):
                nmeta["deletionTimestamp"] = _at(grace)
            nmeta["deletionGracePeriodSeconds"] = grace
            if new == stored:
                return self._view(rt, stored), False
            nmeta["resourceVersion"] = str(self._bump())
            self._objects[key] = new
            self._record("MODIFIED", rt.storage_key, new, stored)
            return self._view(rt, new), False

    def _storage_type(self, skey: str) -> ResourceType:
        return next(rt for rt in self.types.values() if rt.key == skey)

    def do_bind(self, ns: str, name: str, binding: dict) -> None:
        rt = self.types[("", "v1", "pods")]
        bmeta = binding.get("metadata") or {}
        if bmeta.get("name", name) != name:
            raise bad_request("name in URL does not match name in Binding object")
        target = binding.get("target") or {}
        if target.get("kind") not in (None, "", "Node"):
            raise bad_request(f"a pod can only be bound to a Node, not a {target.get('kind')!r}")
        node = target.get("name") or ""
        if not node:
            raise invalid(self.types[("", "v1", "pods")], name,
                          [("FieldValueRequired", "target.name", "Required value")])
        if self.webhooks.configured():  # pods/binding is admitted as the CREATE of a Binding
            obj = {**copy.deepcopy(binding), "apiVersion": "v1", "kind": "Binding"}
            obj["metadata"] = {**copy.deepcopy(bmeta), "name": name, "namespace": ns}
            obj = self.webhooks.mutate(rt, "binding", "CREATE", ns, obj, None, {})
            self.webhooks.validate(rt, "binding", "CREATE", ns, obj, None, {})
            binding, bmeta = obj, obj.get("metadata") or {}
            target = binding.get("target") or {}
            node = target.get("name") or ""

        def bind(pod: dict) -> dict:
            if pod["metadata"].get("deletionTimestamp"):
                raise conflict(rt, name, f"pod {name} is being deleted, cannot be assigned to a host", "pods/binding")
            spec = pod.setdefault("spec", {})
            if spec.get("nodeName"):
                raise conflict(rt, name, f'pod {name} is already assigned to node "{spec["nodeName"]}"',
                               "pods/binding")
            if spec.get("schedulingGates"):
                raise conflict(rt, name, f"pod {name} has non-empty .spec.schedulingGates", "pods/binding")
            if bmeta.get("uid") and bmeta["uid"] != pod["metadata"]["uid"]:
                raise conflict(rt, name, f"Precondition failed: UID in precondition: {bmeta['uid']}, UID in "
                                         f"object meta: {pod['metadata']['uid']}", "pods/binding")
            spec["nodeName"] = node
            for k in ("annotations", "labels"):
                if bmeta.get(k):
                    pod["metadata"].setdefault(k, {}).update(bmeta[k])
            status = pod.setdefault("status", {})
            status.pop("nominatedNodeName", None)
            conds = [c for c in status.get("conditions") or [] if c.get("type") != "PodScheduled"]
            conds.append({"type": "PodScheduled", "status": "True", "lastProbeTime": None,
                          "lastTransitionTime": _now()})
            status["conditions"] = conds
            return pod

        self.do_update(rt, ns, name, bind, subresource="binding")

    def do_list(self, rt: ResourceType, ns: str | None, query: Mapping[str, str]) -> dict:
        match = self._matcher(rt, query)
        limit = int(query.get("limit") or 0)
        token = query.get("continue")
        with self._cond:
            want_rv = query.get("resourceVersion")
            if want_rv not in (None, "", "0") and not token:
                self._wait_for_rv(_parse_rv(want_rv))
            if token:
                snap_id, _, start = _decode_continue(token)
                snap = self._snapshots.get(snap_id)
                if snap is None:
                    raise expired("The provided continue parameter is too old to display a consistent list "
                                  "result. You can start a new list without the continue parameter, or use the "
                                  "continue token in this response to retrieve the remainder of the results. "
                                  "Continuing with the provided token results in an inconsistent list - objects "
                                  "that were created, modified, or deleted between the time the first chunk was "
                                  "returned and now may show up in the list.")
                items = snap.items[start:]
                rv = snap.rv
            else:
                items = [self._view(rt, o) for (sk, ons, _n), o in sorted(self._objects.items())
                         if sk == rt.storage_key and (ns is None or ons == ns) and match(self._view(rt, o))]
                rv = self._rv
                start = 0
            meta: dict = {"resourceVersion": str(rv)}
            if limit and len(items) > limit:
                if not token:
                    snap_id = str(next(self._snapshot_ids))
                    self._snapshots[snap_id] = _Snapshot(rv, items)
                    while len(self._snapshots) > 100:
                        self._snapshots.pop(next(iter(self._snapshots)))
                meta["continue"] = _encode_continue(snap_id, rv, start + limit)
                meta["remainingItemCount"] = len(items) - limit
                items = items[:limit]
        for it in items:
            it.pop("kind", None)
            it.pop("apiVersion", None)
        return {"kind": f"{rt.kind}List", "apiVersion": rt.group_version, "metadata": meta, "items": items}

    def _wait_for_rv(self, rv: int) -> None:
        deadline = time.monotonic() + 3
        while self._rv < rv:
            left = deadline - time.monotonic()
            if left <= 0:
                raise ApiError(504, "Timeout", f"Too large resource version: {rv}, current: {self._rv}",
                               {"causes": [{"reason": "ResourceVersionTooLarge",
                                            "message": "Too large resource version"}], "retryAfterSeconds": 1})
            self._cond.wait(left)

    def _matcher(self, rt: ResourceType, query: Mapping[str, str]) -> Callable[[dict], bool]:
        labels = parse_label_selector(query["labelSelector"]) if query.get("labelSelector") else None
        fields = parse_field_selector(rt, query["fieldSelector"]) if query.get("fieldSelector") else None

        def match(obj: dict) -> bool:
            if labels is not None and not labels((obj.get("metadata") or {}).get("labels") or {}):
                return False
            return fields is None or fields(obj)

        return match

    # -- watch ---------------------------------------------------------------

    def watch(self, rt: ResourceType, ns: str | None, query: Mapping[str, str], emit: Callable[[dict], None],
              serving: Callable[[], bool] = lambda: True) -> None:
        """Stream events to ``emit`` until the timeout, the server stops, the
        server that accepted the request is retired (``serving`` says no:
        restart) or ``emit`` raises (the client went away)."""
        match = self._matcher(rt, query)
        timeout = query.get("timeoutSeconds")
        deadline = time.monotonic() + (float(timeout) if timeout else 1800.0)
        bookmarks = query.get("allowWatchBookmarks") in ("true", "1")
        initial = query.get("sendInitialEvents") in ("true", "1")
        want = query.get("resourceVersion") or ""

        def mine(ev: _Event) -> bool:
            m = ev.obj["metadata"]
            return ev.skey == rt.storage_key and (ns is None or m.get("namespace", "") == ns)

        def bookmark(rv: int, end_initial: bool = False) -> dict:
            meta: dict = {"resourceVersion": str(rv)}
            if end_initial:
                meta["annotations"] = {"k8s.io/initial-events-end": "true"}
            return {"type": "BOOKMARK", "object": {"kind": rt.kind, "apiVersion": rt.group_version, "metadata": meta}}

        out: list[dict] = []
        with self._cond:
            while self._watches_held and not self._stopped:
                self._cond.wait(0.05)
            epoch = self._watch_epoch
            if want in ("", "0") or initial:
                for (sk, ons, _n), o in sorted(self._objects.items()):
                    if sk == rt.storage_key and (ns is None or ons == ns):
                        view = self._view(rt, o)
                        if match(view):
                            out.append({"type": "ADDED", "object": view})
                position = self._rv
                if initial and bookmarks:
                    out.append(bookmark(position, end_initial=True))
            else:
                position = _parse_rv(want)
                if position < self._oldest:
                    out.append({"type": "ERROR", "object": expired(
                        f"too old resource version: {position} ({self._oldest})").status()})
                    position = None
        for ev in out:
            emit(ev)
        if position is None:
            return
        next_bookmark = time.monotonic() + self.bookmark_interval
        while True:
            out = []
            with self._cond:
                while True:
                    if self._stopped or self._watch_epoch != epoch or not serving():
                        return
                    now = time.monotonic()
                    if now >= deadline:
                        return
                    if position < self._oldest:
                        out.append({"type": "ERROR", "object": expired(
                            f"too old resource version: {position} ({self._oldest})").status()})
                        break
                    events = [ev for ev in self._history if ev.rv > position]
                    if events:
                        for ev in events:
                            position = ev.rv
                            if not mine(ev):
                                continue
                            new_view = self._view(rt, ev.obj)
                            if ev.type == "ADDED":
                                if match(new_view):
                                    out.append({"type": "ADDED", "object": new_view})
                            elif ev.type == "DELETED":
                                old_view = self._view(rt, ev.prev) if ev.prev else new_view
                                if match(old_view):
                                    out.append({"type": "DELETED", "object": new_view})
                            else:
                                was, now_m = match(self._view(rt, ev.prev)), match(new_view)
                                if was and now_m:
                                    out.append({"type": "MODIFIED", "object": new_view})
                                elif now_m:
                                    out.append({"type": "ADDED", "object": new_view})
                                elif was:
                                    out.append({"type": "DELETED", "object": new_view})
                        if out:
                            break
                        continue
                    if bookmarks and now >= next_bookmark:
                        position = max(position, self._rv)
                        out.append(bookmark(self._rv))
                        next_bookmark = now + self.bookmark_interval
                        break
                    wait = deadline - now
                    if bookmarks:
                        wait = min(wait, next_bookmark - now)
                    self._cond.wait(max(wait, 0.001))
            for ev in out:
                emit(ev)
            if out and out[-1]["type"] == "ERROR":
                return


def _spec_of(obj: dict) -> dict:
    return {k: v for k, v in obj.items() if k not in ("metadata", "status", "apiVersion", "kind")}


def _parse_rv(text: str) -> int:
    try:
        rv = int(text)
    except ValueError:
        raise bad_request(f'invalid resource version "{text}": a decimal integer is accepted') from None
    if rv < 0:
        raise bad_request(f'invalid resource version "{text}": must not be negative')
    return rv


def _encode_continue(snap_id: str, rv: int, start: int) -> str:
    raw = json.dumps({"v": "meta.k8s.io/v1", "rv": rv, "snapshot": snap_id, "start": start}).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def _decode_continue(token: str) -> tuple[str, int, int]:
    try:
        raw = json.loads(base64.urlsafe_b64decode(token + "=" * (-len(token) % 4)))
        return str(raw["snapshot"]), int(raw["rv"]), int(raw["start"])
    except (ValueError, KeyError, TypeError):
        raise bad_request(f"invalid continue token {token!r}: pass the metadata.continue of a previous "
                          f"list response") from None


# ---------------------------------------------------------------------------
