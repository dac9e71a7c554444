"""The mutating admission webhook (hamid/webhook/face.py) over real HTTPS.

Every review goes through the WebhookFace's hypercorn server with TLS, called
by httpx verifying the test CA; patches are applied with the ``jsonpatch``
library to the pod that was sent, and the result re-parsed.
"""

from __future__ import annotations

import base64
import copy
import json
import os
import ssl
import stat
import uuid

import httpx
import jsonpatch
import pytest
import trio

from hamid.webhook import certs
from hamid.request.kube import GATE
from hamid.webhook.face import (ALLOCATION_ANNOTATIONS, Webhook, WebhookFace, service_account_user)
from hamid.request import parse_pod
from hamid.request.model import Defaults, ResourceNames
from hamid.serving import TLSError, serve_asgi

HAMID_SA = "system:serviceaccount:kube-system:hamid"


@pytest.fixture(scope="module")
def webhook_tls(tmp_path_factory):
    """A CA and a serving certificate for 127.0.0.1/localhost, as files."""
    d = tmp_path_factory.mktemp("webhook-tls")
    ca = certs.make_ca("test webhook CA")
    srv = certs.issue(ca, ["localhost", "127.0.0.1"])
    other_ca = certs.make_ca("someone else")
    client = certs.issue(other_ca, ["a-client"])
    out = {}
    for name, data in (("ca.pem", ca.cert_pem), ("tls.crt", srv.cert_pem), ("tls.key", srv.key_pem),
                       ("other-ca.pem", other_ca.cert_pem), ("client.crt", client.cert_pem),
                       ("client.key", client.key_pem)):
        (d / name).write_bytes(data)
        out[name] = str(d / name)
    return out


class Served:
    def __init__(self, face: WebhookFace, ca: str) -> None:
        self.face = face
        self.port = int(face.bound[0].rsplit(":", 1)[1])
        self.url = f"https://127.0.0.1:{self.port}/mutate"
        self.client = httpx.AsyncClient(verify=ssl.create_default_context(cafile=ca), timeout=10)

    async def review(self, pod: dict | None, *, operation: str = "CREATE", old: dict | None = None,
                     user: str = "alice", raw: dict | None = None) -> dict:
        uid = str(uuid.uuid4())
        body = raw or {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {
            "uid": uid, "kind": {"group": "", "version": "v1", "kind": "Pod"},
            "resource": {"group": "", "version": "v1", "resource": "pods"},
            "requestKind": {"group": "", "version": "v1", "kind": "Pod"},
            "requestResource": {"group": "", "version": "v1", "resource": "pods"},
            "name": (pod or {}).get("metadata", {}).get("name", ""), "namespace": "default",
            "operation": operation, "userInfo": {"username": user, "groups": ["system:authenticated"]},
            "object": pod, "oldObject": old, "dryRun": False}}
        r = await self.client.post(self.url, json=body)
        assert r.status_code == 200, r.text
        out = r.json()
        assert (out["apiVersion"], out["kind"]) == ("admission.k8s.io/v1", "AdmissionReview")
        assert out["response"]["uid"] == uid  # every answer echoes the request's uid
        return out["response"]


@pytest.fixture
def serve(nursery, webhook_tls):
    """Start a webhook face (gate or extender mode) on 127.0.0.1, TLS from webhook_tls."""
    made = []

    async def start(*, gate: bool = True, defaults: Defaults = Defaults(), writers=frozenset({HAMID_SA}),
                    adopt=frozenset({"hami-scheduler"})):
        face = WebhookFace(Webhook(defaults=defaults, gate=gate, writers=writers, adopt=adopt), "127.0.0.1:0",
                           certfile=webhook_tls["tls.crt"], keyfile=webhook_tls["tls.key"])
        await nursery.start(face.run)
        s = Served(face, webhook_tls["ca.pem"])
        made.append(s)
        return s

    yield start


def pod(*containers: dict, annotations: dict | None = None, init: list | None = None, **spec) -> dict:
    p = {"apiVersion": "v1", "kind": "Pod",
         "metadata": {"name": "p", "namespace": "default", "labels": {"app": "x"}},
         "spec": {"containers": list(containers) or [ctr()], **spec}}
    if annotations is not None:
        p["metadata"]["annotations"] = annotations
    if init is not None:
        p["spec"]["initContainers"] = init
    return p


def ctr(name: str = "main", limits: dict | None = None, requests: dict | None = None, **extra) -> dict:
    c = {"name": name, "image": "busybox", **extra}
    res = {}
    if limits is not None:
        res["limits"] = limits
    if requests is not None:
        res["requests"] = requests
    if res:
        c["resources"] = res
    return c


def applied(original: dict, resp: dict) -> dict:
    """The pod after the response's patch, applied with the jsonpatch library."""
    assert resp["allowed"] is True
    if "patch" not in resp:
        return original
    assert resp["patchType"] == "JSONPatch"
    ops = json.loads(base64.b64decode(resp["patch"]))
    return jsonpatch.JsonPatch(ops).apply(copy.deepcopy(original))


def gates(p: dict) -> list[str]:
    return [g["name"] for g in p["spec"].get("schedulingGates") or []]


# --- pass-through ------------------------------------------------------------------


async def test_pod_without_gpus_passes_untouched(serve):
    s = await serve()
    for p in (pod(), pod(ctr(limits={"cpu": "1", "memory": "1Gi"})),
              pod(annotations={"team": "a", "hami.io/webhook": "ignore"})):
        resp = await s.review(p)
        assert resp == {"uid": resp["uid"], "allowed": True}  # no patch, no patchType, no status


async def test_other_objects_and_operations_pass(serve):
    s = await serve()
    # a DELETE review carries the old object only
    resp = await s.review(None, operation="DELETE", old=pod(ctr(limits={"nvidia.com/gpu": "1"})))
    assert resp["allowed"] is True and "patch" not in resp


# --- gate and defaults -------------------------------------------------------------


async def test_gpu_pod_is_gated_in_gate_mode(serve):
    s = await serve(gate=True)
    p = pod(ctr(limits={"nvidia.com/gpu": "1", "nvidia.com/gpumem": "4096", "nvidia.com/gpucores": "30"}))
    out = applied(p, await s.review(p))
    assert gates(out) == [GATE]
    expect = copy.deepcopy(p)
    expect["spec"]["schedulingGates"] = [{"name": GATE}]
    assert out == expect  # nothing else touched

    # idempotent: a pod already carrying the gate gets no second one; another gate is kept
    again = await s.review(out)
    assert "patch" not in again
    other = pod(ctr(limits={"nvidia.com/gpu": "1", "nvidia.com/gpumem": "1000"}),
                schedulingGates=[{"name": "example.com/quota"}])
    assert gates(applied(other, await s.review(other))) == ["example.com/quota", GATE]


async def test_gpu_pod_is_not_gated_in_extender_mode(serve):
    s = await serve(gate=False)
    p = pod(ctr(limits={"nvidia.com/gpu": "1", "nvidia.com/gpumem": "4096", "nvidia.com/gpucores": "30"}))
    resp = await s.review(p)
    assert resp == {"uid": resp["uid"], "allowed": True}


async def test_pod_with_node_name_is_not_gated(serve):
    """The API server refuses gates on a pod that names its node; the node admits it itself."""
    s = await serve(gate=True)
    p = pod(ctr(limits={"nvidia.com/gpu": "1", "nvidia.com/gpumem": "1000"}), nodeName="gpu-1")
    assert "patch" not in await s.review(p)


async def test_defaults_written_as_hamis_webhook_does(serve):
    d = Defaults(gpu_num=2)
    s = await serve(gate=False, defaults=d)
    # memory only: the GPU count is added (kubelet calls the device plugin only for it)
    p = pod(ctr(limits={"nvidia.com/gpumem": "3000"}),
            init=[ctr("init", limits={"nvidia.com/gpucores": "20"}, requests={"nvidia.com/gpucores": "20"})])
    out = applied(p, await s.review(p))
    assert out["spec"]["containers"][0]["resources"]["limits"] == {"nvidia.com/gpumem": "3000", "nvidia.com/gpu": "2"}
    # a container that wrote requests too keeps requests == limits; whole card: exclusive
    init = out["spec"]["initContainers"][0]["resources"]
    assert init["limits"] == init["requests"] == {"nvidia.com/gpucores": "20", "nvidia.com/gpu": "2"}
    # the written defaults are what the parser gives the pod as sent
    assert parse_pod(out, d).containers == parse_pod(p, d).containers

    # a whole card without cores: gpucores 100 (exclusive); no resources map at all is created first
    for limits in ({"nvidia.com/gpu": "1"}, {"nvidia.com/gpu": "1", "nvidia.com/gpumem-percentage": "100"}):
        p = pod(ctr(limits=limits))
        out = applied(p, await s.review(p))
        assert out["spec"]["containers"][0]["resources"]["limits"] == {**limits, "nvidia.com/gpucores": "100"}
        assert parse_pod(out, d).containers == parse_pod(p, d).containers
    p = pod(ctr(limits={"nvidia.com/gpu": "1", "nvidia.com/gpumem": "1000"}), ctr("side"))
    assert "patch" not in await s.review(p)  # a share of a card: nothing to write; side car untouched


async def test_renamed_resources_are_the_ones_looked_at(serve):
    names = ResourceNames(count="example.com/vgpu", memory="example.com/vgpu-mem",
                          memory_percentage="example.com/vgpu-pct", cores="example.com/vgpu-cores",
                          priority="example.com/vgpu-prio")
    s = await serve(gate=True, defaults=Defaults(names=names))
    assert "patch" not in await s.review(pod(ctr(limits={"nvidia.com/gpu": "1"})))  # not a configured name
    p = pod(ctr(limits={"example.com/vgpu-mem": "100"}, requests={}))
    out = applied(p, await s.review(p))
    assert out["spec"]["containers"][0]["resources"]["limits"] == {"example.com/vgpu-mem": "100",
                                                                   "example.com/vgpu": "1"}
    assert gates(out) == [GATE]


async def test_generate_name_pod_is_parsed(serve):
    s = await serve()
    p = pod(ctr(limits={"nvidia.com/gpu": "1", "nvidia.com/gpumem": "10"}))
    del p["metadata"]["name"], p["metadata"]["namespace"]
    p["metadata"]["generateName"] = "job-"
    assert gates(applied(p, await s.review(p))) == [GATE]


# --- refusals ----------------------------------------------------------------------

MALFORMED = [
    # (limits, annotations, words the message must hold)
    ({"nvidia.com/gpu": "1", "nvidia.com/gpucores": "-20"}, None,
     ["spec.containers[0] (main) nvidia.com/gpucores", "-20"]),
    ({"nvidia.com/gpu": "1", "nvidia.com/gpumem-percentage": "101"}, None,
     ["nvidia.com/gpumem-percentage", "101", "accepted: 1 to 100"]),
    ({"nvidia.com/gpu": "1", "nvidia.com/gpumem-percentage": "-3"}, None, ["nvidia.com/gpumem-percentage", "-3"]),
    ({"nvidia.com/gpu": "1", "nvidia.com/gpumem": "100", "nvidia.com/gpumem-percentage": "50"}, None,
     ["nvidia.com/gpumem", "nvidia.com/gpumem-percentage", "not both"]),
    ({"nvidia.com/gpu": "0", "nvidia.com/gpumem": "100"}, None, ["nvidia.com/gpu is 0"]),
    ({"nvidia.com/vgpu": "1"}, None, ["nvidia.com/vgpu", "HAMi's first releases", "rename it to nvidia.com/gpu"]),
    ({"nvidia.com/gpu": "lots"}, None, ["nvidia.com/gpu", "lots"]),
    ({"nvidia.com/gpu": "1", "nvidia.com/priority": "7"}, None, ["nvidia.com/priority", "accepted: 0 (high) or 1"]),
    ({"nvidia.com/gpu": "1"}, {"nvidia.com/vgpu-mode": "turbo"},
     ["annotation nvidia.com/vgpu-mode", "turbo", "accepted: hami-core, mig"]),
    ({"nvidia.com/gpu": "1"}, {"nvidia.com/numa-bind": "yes"}, ["annotation nvidia.com/numa-bind", "true, false"]),
    ({"nvidia.com/gpu": "1"}, {"hami.io/node-scheduler-policy": "fast"},
     ["annotation hami.io/node-scheduler-policy", "fast", "binpack, spread"]),
    ({"nvidia.com/gpu": "1"}, {"hami.io/gpu-scheduler-policy": "best"},
     ["annotation hami.io/gpu-scheduler-policy", "best", "accepted"]),
    ({"nvidia.com/gpu": "1"}, {"hami.io/device-scoring-weights": "slot=1"},
     ["annotation hami.io/device-scoring-weights", "missing", "accepted"]),
    ({"nvidia.com/gpu": "1"}, {"nvidia.com/use-gpuuuid": "junk"},
     ["annotation nvidia.com/use-gpuuuid", "'junk' is not a GPU UUID", "accepted: GPU-"]),
    ({"nvidia.com/gpu": "1"}, {"nvidia.com/nouse-gpuuuid": "GPU-0a1b,0a1b"},
     ["annotation nvidia.com/nouse-gpuuuid", "'0a1b'", "accepted: GPU-"]),
    # annotations alone (no GPU resource) are still checked
    (None, {"nvidia.com/use-gpuuuid": "GPU-1,nvidia0"}, ["annotation nvidia.com/use-gpuuuid", "'nvidia0'"]),
    (None, {"nvidia.com/vgpu-mode": "x"}, ["annotation nvidia.com/vgpu-mode"]),
]


@pytest.mark.parametrize("limits,ann,words", MALFORMED, ids=[str(i) for i in range(len(MALFORMED))])
async def test_malformed_requests_refused_naming_the_field(serve, limits, ann, words):
    s = await serve()
    resp = await s.review(pod(ctr(limits=limits), annotations=ann))
    assert resp["allowed"] is False and "patch" not in resp
    assert resp["status"]["code"] == 400
    for w in words:
        assert w in resp["status"]["message"], (w, resp["status"]["message"])


async def test_zero_memory_percentage_is_unset_not_refused(serve):
    """HAMi: gpumem-percentage 0 is ignored (the whole card), not an error."""
    s = await serve()
    p = pod(ctr(limits={"nvidia.com/gpu": "1", "nvidia.com/gpumem-percentage": "0"}))
    assert gates(applied(p, await s.review(p))) == [GATE]


async def test_valid_annotations_pass(serve):
    s = await serve()
    ann = {"nvidia.com/use-gpuuuid": "GPU-0a1b, MIG-3c4d", "nvidia.com/use-gputype": "A100,H100",
           "hami.io/gpu-scheduler-policy": "binpack,numa", "hami.io/device-scoring-weights": "slot=1,core=1,memory=3",
           "nvidia.com/vgpu-mode": "hami-core", "nvidia.com/numa-bind": "true"}
    p = pod(ctr(limits={"nvidia.com/gpu": "2", "nvidia.com/gpumem": "1000"}), annotations=ann)
    assert gates(applied(p, await s.review(p))) == [GATE]
    # annotations on a pod without a GPU resource: checked, allowed, neither patched nor gated
    assert "patch" not in await s.review(pod(annotations=ann))


@pytest.mark.parametrize("key", ALLOCATION_ANNOTATIONS)
async def test_forged_allocation_annotations_refused_at_create(serve, key):
    s = await serve()
    for p in (pod(ctr(limits={"nvidia.com/gpu": "1"}), annotations={key: "GPU-0,NVIDIA,80000,100:;"}),
              pod(annotations={key: "x"})):  # on a pod asking no GPU as well
        resp = await s.review(p)
        assert resp["allowed"] is False and "patch" not in resp
        assert resp["status"]["code"] == 403
        assert f"metadata.annotations[{key}]" in resp["status"]["message"]
        assert "only hamid" in resp["status"]["message"]


async def test_updates_to_allocation_annotations_only_by_the_writers(serve):
    s = await serve(writers=frozenset({HAMID_SA}))
    old = pod(ctr(limits={"nvidia.com/gpu": "1"}), schedulingGates=[{"name": GATE}])
    placed = copy.deepcopy(old)
    placed["metadata"]["annotations"] = {"hami.io/vgpu-node": "gpu-1", "hami.io/bind-phase": "allocating"}
    del placed["spec"]["schedulingGates"]
    # the leader's placement update
    assert (await s.review(placed, operation="UPDATE", old=old, user=HAMID_SA)) ["allowed"] is True
    # anyone else: adding, changing or removing one is refused
    for new, prev in ((placed, old), (pod(ctr(limits={"nvidia.com/gpu": "1"}), annotations={
            "hami.io/vgpu-node": "gpu-2", "hami.io/bind-phase": "allocating"}), placed), (old, placed)):
        resp = await s.review(new, operation="UPDATE", old=prev, user="alice")
        assert resp["allowed"] is False and resp["status"]["code"] == 403
        assert "hami.io/vgpu-node" in resp["status"]["message"] and "alice" in resp["status"]["message"]
    # other changes by anyone: allowed, nothing patched
    relabel = copy.deepcopy(placed)
    relabel["metadata"]["labels"]["more"] = "1"
    resp = await s.review(relabel, operation="UPDATE", old=placed, user="alice")
    assert resp == {"uid": resp["uid"], "allowed": True}
    # a request annotation changed to junk on UPDATE: refused as at CREATE
    junk = copy.deepcopy(placed)
    junk["metadata"]["annotations"]["nvidia.com/use-gpuuuid"] = "junk"
    resp = await s.review(junk, operation="UPDATE", old=placed, user=HAMID_SA)
    assert resp["allowed"] is False and "nvidia.com/use-gpuuuid" in resp["status"]["message"]

    # writers unknown (not in a pod, none configured): updates not checked
    s2 = await serve(writers=None)
    assert (await s2.review(placed, operation="UPDATE", old=old, user="alice"))["allowed"] is True


# --- the HTTP side -----------------------------------------------------------------


async def test_bad_reviews_are_400(serve, monkeypatch):
    s = await serve()
    for body in ({"apiVersion": "admission.k8s.io/v1beta1", "kind": "AdmissionReview", "request": {"uid": "u"}},
                 {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {}},
                 {"kind": "Pod"}):
        r = await s.client.post(s.url, json=body)
        assert r.status_code == 400
    r = await s.client.post(s.url, content=b"{not json")
    assert r.status_code == 400 and "not JSON" in r.text

    import hamid.webhook.face as wh

    monkeypatch.setattr(wh, "MAX_BODY", 1000)  # small, so that the whole body is sent before the answer
    r = await s.client.post(s.url, content=b"x" * 1001)
    assert r.status_code == 413

    async def chunks():  # no content-length: counted while read
        for _ in range(3):
            yield b"x" * 400

    r = await s.client.post(s.url, content=chunks())
    assert r.status_code == 413


async def test_https_only_and_client_certificates_irrelevant(serve, webhook_tls):
    s = await serve()
    p = pod(ctr(limits={"nvidia.com/gpu": "1", "nvidia.com/gpumem": "1"}))
    # plain HTTP to the TLS port: no answer
    async with httpx.AsyncClient(timeout=5) as plain:
        with pytest.raises(httpx.HTTPError):
            await plain.post(f"http://127.0.0.1:{s.port}/mutate", json={})
    # a client that does not trust our CA refuses the server
    async with httpx.AsyncClient(verify=ssl.create_default_context(cafile=webhook_tls["other-ca.pem"])) as c:
        with pytest.raises(httpx.ConnectError):
            await c.post(s.url, json={})
    # a client certificate the server does not know changes nothing (no mTLS)
    ctx = ssl.create_default_context(cafile=webhook_tls["ca.pem"])
    ctx.load_cert_chain(webhook_tls["client.crt"], webhook_tls["client.key"])
    async with httpx.AsyncClient(verify=ctx, timeout=10) as c:
        r = await c.post(s.url, json={"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
                                      "request": {"uid": "u1", "operation": "CREATE", "object": p,
                                                  "resource": {"group": "", "resource": "pods"}}})
        assert r.status_code == 200 and r.json()["response"]["uid"] == "u1"
        assert r.json()["response"]["patchType"] == "JSONPatch"


async def test_unloadable_certificate_is_an_error_naming_the_files(webhook_tls, tmp_path):
    bad = tmp_path / "bad.pem"
    bad.write_text("not a certificate")
    with pytest.raises(TLSError, match=f"webhookListen: cannot load the TLS certificate {bad}"):
        await serve_asgi(None, "127.0.0.1:0", what="webhookListen", certfile=str(bad),
                         keyfile=webhook_tls["tls.key"])
    with pytest.raises(TLSError, match="cannot load the TLS certificate .*No such file"):
        await serve_asgi(None, "127.0.0.1:0", certfile=str(tmp_path / "missing"), keyfile=webhook_tls["tls.key"])
    with pytest.raises(TLSError, match="both a certificate and a key"):
        await serve_asgi(None, "127.0.0.1:0", certfile=webhook_tls["tls.crt"])


# --- TLS material of its own -------------------------------------------------------


def test_ensure_keeps_the_ca_and_reissues_for_new_names(tmp_path):
    d = tmp_path / "tls"
    a = certs.ensure(d, ["hamid-webhook.kube-system.svc", "127.0.0.1"])
    assert a.issued
    assert stat.S_IMODE(os.stat(d).st_mode) == 0o700
    assert stat.S_IMODE(os.stat(a.key).st_mode) == 0o600 and stat.S_IMODE(os.stat(d / "ca.key").st_mode) == 0o600
    ca1, crt1 = a.ca.read_bytes(), a.cert.read_bytes()
    b = certs.ensure(d, ["127.0.0.1", "hamid-webhook.kube-system.svc"])  # same names: kept as is
    assert not b.issued and b.cert.read_bytes() == crt1
    c = certs.ensure(d, ["other.example", "127.0.0.1"])  # new names: re-issued, same CA
    assert c.issued and c.ca.read_bytes() == ca1 and c.cert.read_bytes() != crt1
    cert = certs.Issued(c.key.read_bytes(), c.cert.read_bytes()).cert
    assert certs.covers(cert, ["other.example", "127.0.0.1"]) and not certs.covers(cert, ["x.example"])
    cert.verify_directly_issued_by(certs.Issued(b"", ca1).cert)
    with pytest.raises(certs.CertError, match="bad certificate name"):
        certs.issue(certs.make_ca(), ["bad name"])


async def test_face_without_certificate_serves_its_own_ca(nursery, tmp_path):
    face = WebhookFace(Webhook(gate=True), "127.0.0.1:0", tls_dir=str(tmp_path / "webhook-tls"),
                       names=("hamid-webhook.kube-system.svc",))
    await nursery.start(face.run)
    assert face.ca_file == str(tmp_path / "webhook-tls" / "ca.pem")
    s = Served(face, face.ca_file)
    p = pod(ctr(limits={"nvidia.com/gpu": "1", "nvidia.com/gpumem": "1"}))
    assert gates(applied(p, await s.review(p))) == [GATE]
    # the name the API server checks for a service reference is in the certificate
    ctx = ssl.create_default_context(cafile=face.ca_file)
    cert = certs.Issued(b"", (tmp_path / "webhook-tls" / "tls.crt").read_bytes()).cert
    assert certs.covers(cert, ["hamid-webhook.kube-system.svc", "localhost", "127.0.0.1"])
    async with httpx.AsyncClient(verify=ctx) as c:
        assert (await c.get(f"https://localhost:{s.port}/healthz")).text == "ok"


def test_from_config_and_service_account(tmp_path, monkeypatch):
    from hamid.config.schema import Config

    c = Config(stateDir=str(tmp_path), controlMode="extender", extenderInsecure=True, webhookListen="127.0.0.1:0",
               webhookAllocationWriters=("system:serviceaccount:x:y",), webhookNames=("a.b.svc",))
    face = WebhookFace.from_config(c, defaults=Defaults())
    assert face.name == "webhook" and face.webhook.gate is False
    assert face.webhook.writers == {"system:serviceaccount:x:y"}
    assert face.tls_dir == str(tmp_path / "webhook-tls") and face.cert_names() == ["a.b.svc", "127.0.0.1",
                                                                                     "localhost"]
    with pytest.raises(Exception, match="set both webhookCertFile and webhookKeyFile"):
        Config(webhookCertFile="/x.crt")

    claims = base64.urlsafe_b64encode(json.dumps({"sub": "system:serviceaccount:kube-system:hamid"}).encode())
    tok = tmp_path / "token"
    tok.write_bytes(b"e30." + claims.rstrip(b"=") + b".sig")
    assert service_account_user(str(tok)) == "system:serviceaccount:kube-system:hamid"
    assert service_account_user(str(tmp_path / "none")) is None
    tok.write_bytes(b"garbage")
    with pytest.raises(Exception, match="not a JWT"):
        service_account_user(str(tok))
    import hamid.webhook.face as wh

    monkeypatch.setattr(wh, "SA_TOKEN", str(tmp_path / "none"))
    monkeypatch.setattr(wh.service_account_user, "__defaults__", (str(tmp_path / "none"),))
    face = WebhookFace.from_config(Config(stateDir=str(tmp_path)), defaults=Defaults())
    assert face.webhook.gate is True and face.webhook.writers is None


# --- through the API-server stand-in -----------------------------------------------


async def test_through_the_api_server_standin(api_server, serve, webhook_tls):
    """The stand-in calls the webhook as kube-apiserver does (HTTPS, caBundle):
    kubectl's view of a refusal, a gated GPU pod, an untouched plain pod."""
    s = await serve(gate=True)
    ca = base64.b64encode(open(webhook_tls["ca.pem"], "rb").read()).decode()
    mwc = {"apiVersion": "admissionregistration.k8s.io/v1", "kind": "MutatingWebhookConfiguration",
           "metadata": {"name": "hamid"},
           "webhooks": [{"name": "pods.hamid.io", "clientConfig": {"url": s.url, "caBundle": ca},
                         "rules": [{"operations": ["CREATE", "UPDATE"], "apiGroups": [""], "apiVersions": ["v1"],
                                    "resources": ["pods"]}],
                         "failurePolicy": "Fail", "sideEffects": "None", "admissionReviewVersions": ["v1"]}]}

    def call():
        with httpx.Client(base_url=api_server.url, timeout=20) as c:
            r = c.post("/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations", json=mwc)
            assert r.status_code == 201, r.text
            out = {}
            for name, limits in (("plain", {"cpu": "1"}), ("gpu", {"nvidia.com/gpu": "1"}),
                                 ("bad", {"nvidia.com/gpu": "1", "nvidia.com/gpumem-percentage": "120"})):
                p = pod(ctr(limits=limits))
                p["metadata"]["name"] = name
                out[name] = c.post("/api/v1/namespaces/default/pods", json=p)
            return out

    got = await trio.to_thread.run_sync(call)
    assert got["plain"].status_code == 201 and "schedulingGates" not in got["plain"].json()["spec"]
    assert got["gpu"].status_code == 201
    g = got["gpu"].json()
    assert gates(g) == [GATE]
    assert g["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpucores"] == "100"
    bad = got["bad"].json()
    assert got["bad"].status_code == 400 and bad["kind"] == "Status"
    assert "denied the request" in bad["message"] and "nvidia.com/gpumem-percentage: bad value 120" in bad["message"]


async def test_gpucores_over_100_is_taken_as_100_with_a_warning(serve):
    s = await serve()
    p = pod(ctr(limits={"nvidia.com/gpu": "1", "nvidia.com/gpucores": "120"},
                requests={"nvidia.com/gpucores": "150"}))
    resp = await s.review(p)
    assert resp["allowed"]
    (warning,) = resp["warnings"]
    assert warning.startswith("spec.containers[0] (main) nvidia.com/gpucores: 120 is more than a whole GPU; taken "
                              "as 100") and "as HAMi does" in warning
    out = applied(p, resp)
    res = out["spec"]["containers"][0]["resources"]
    assert res["limits"]["nvidia.com/gpucores"] == res["requests"]["nvidia.com/gpucores"] == "100"
    assert out["metadata"]["annotations"]["hamid.io/gpucores-clamped"] == warning
    assert parse_pod(out).containers[0].gpu.cores == 100
    ok = pod(ctr(limits={"nvidia.com/gpu": "1", "nvidia.com/gpucores": "100"}))
    assert "warnings" not in await s.review(ok)


async def test_hami_scheduler_name_is_reset_and_said(serve):
    s = await serve()
    p = pod(ctr(limits={"nvidia.com/gpu": "1", "nvidia.com/gpucores": "120"}), schedulerName="hami-scheduler")
    resp = await s.review(p)
    out = applied(p, resp)
    assert out["spec"]["schedulerName"] == "default-scheduler"
    ann = out["metadata"]["annotations"]
    assert ann["hamid.io/scheduler-name"] == "hami-scheduler" and "taken as 100" in ann["hamid.io/gpucores-clamped"]
    assert any("schedulerName hami-scheduler reset to default-scheduler" in w for w in resp["warnings"])
    assert gates(out) == [GATE]
    other = pod(ctr(limits={"nvidia.com/gpu": "1"}), schedulerName="my-scheduler")
    assert applied(other, await s.review(other))["spec"]["schedulerName"] == "my-scheduler"  # not HAMi's: kept
    keep = await serve(adopt=frozenset())  # HAMi's scheduler still runs beside hamid
    assert applied(p, await keep.review(p))["spec"]["schedulerName"] == "hami-scheduler"
