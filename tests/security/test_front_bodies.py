"""Every malformed request the front's listeners may get is answered 4xx, never 500.

The front's webhook (HTTPS), extender (HTTPS with a client certificate) and
metrics ports, served in this process as ``hamid front`` serves them (its
faces from :func:`hamid.daemon.front.front_faces`), get raw bytes: framing
that contradicts itself (``Content-Length`` beside a chunked encoding that is
malformed, two lengths, a negative one, chunks longer or shorter than they
say, a body cut short), and bodies a review would try (not JSON, JSON of the
wrong shape, nested past any parser's depth, an AdmissionReview whose fields
have the wrong types, a pod whose resources are nonsense). The answer must be
a 4xx naming the problem (or, for framing, at least a 4xx with the
connection closed), the process stays up, and a good call is answered after.
A few hundred random mutations of a good review follow (seeded, so a failure
repeats).
"""

from __future__ import annotations

import json
import os
import random
import ssl
import uuid

import pytest
import trio

from netports import free_port

from hamid.webhook import certs
from hamid.config import load_config, resolve_node
from hamid.daemon import front

pytestmark = pytest.mark.slow  # two bodies cut short wait out the read deadline on each listener

GOOD_POD = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "namespace": "default"},
            "spec": {"containers": [{"name": "main", "image": "x", "resources": {"limits": {
                "nvidia.com/gpu": "1", "nvidia.com/gpumem": "4096"}}}]}}


def review(obj=None, **request) -> dict:
    req = {"uid": str(uuid.uuid4()), "operation": "CREATE", "object": GOOD_POD if obj is None else obj,
           "namespace": "default", "kind": {"group": "", "version": "v1", "kind": "Pod"},
           "resource": {"group": "", "version": "v1", "resource": "pods"}, "userInfo": {"username": "a"}}
    req.update(request)
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": req}


def framed(path: str, body: bytes) -> list[tuple[str, bytes]]:
    """The request line and headers, then each framing a body can be sent with, wrong ones included."""
    head = f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n".encode()
    n = str(len(body)).encode()
    chunk = f"{len(body):x}".encode()
    return [
        ("content-length and a malformed chunked encoding",
         head + b"Content-Length: " + n + b"\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n" + body + b"\r\n0\r\n\r\n"),
        ("content-length and a chunk longer than it says",
         head + b"Content-Length: " + n + b"\r\nTransfer-Encoding: chunked\r\n\r\n1\r\n" + body + b"\r\n0\r\n\r\n"),
        ("a malformed chunked encoding",
         head + b"Transfer-Encoding: chunked\r\n\r\n" + chunk + b"\r\n" + body + b"XX0\r\n\r\n"),
        ("a chunk size past any body", head + b"Transfer-Encoding: chunked\r\n\r\nffffffffffffffffffff\r\n" + body),
        ("two content-lengths", head + b"Content-Length: " + n + b"\r\nContent-Length: 1\r\n\r\n" + body),
        ("a negative content-length", head + b"Content-Length: -1\r\n\r\n" + body),
        ("a content-length that is no number", head + b"Content-Length: 1e3\r\n\r\n" + body),
        ("an unknown transfer coding", head + b"Transfer-Encoding: gzip, chunked\r\n\r\n" + chunk + b"\r\n"
         + body + b"\r\n0\r\n\r\n"),
        ("a body cut short", head + b"Content-Length: " + str(len(body) + 10).encode() + b"\r\n\r\n" + body),
    ]


BAD_BODIES = [
    ("not JSON", b"{\"apiVersion\": "),
    ("not UTF-8", b"\xff\xfe{}"),
    ("a list", b"[1, 2]"),
    ("a string", b"\"AdmissionReview\""),
    ("null", b"null"),
    ("nested past any depth", b"[" * 100_000 + b"]" * 100_000),
    ("an object nested past any depth", b"{\"a\":" * 50_000 + b"1" + b"}" * 50_000),
    ("a number past any float", b"1" + b"0" * 400),
    ("NaN", b"NaN"),
    ("duplicate keys", b"{\"kind\": \"AdmissionReview\", \"kind\": \"Pod\"}"),
    ("a review without a request", json.dumps({"apiVersion": "admission.k8s.io/v1",
                                                "kind": "AdmissionReview"}).encode()),
    ("a review of another version", json.dumps({**review(), "apiVersion": "admission.k8s.io/v1beta1"}).encode()),
    ("a request that is a list", json.dumps({**review(), "request": []}).encode()),
    ("a uid that is a number", json.dumps(review(uid=5)).encode()),
    ("an empty uid", json.dumps(review(uid="")).encode()),
]

# A review a webhook must judge (allowed, or refused with a reason), never fail on: the pod is malformed.
ODD_PODS = [
    {"spec": None}, {"spec": []}, {"spec": {"containers": None}}, {"spec": {"containers": "x"}},
    {"spec": {"containers": [None, 5, "x"]}}, {"spec": {"containers": [{"resources": []}]}},
    {"spec": {"containers": [{"name": "m", "resources": {"limits": {"nvidia.com/gpu": "many"}}}]}},
    {"spec": {"containers": [{"name": "m", "resources": {"limits": {"nvidia.com/gpu": -3}}}]}},
    {"spec": {"containers": [{"name": "m", "resources": {"limits": {"nvidia.com/gpu": "1e400"}}}]}},
    {"spec": {"containers": [{"name": "m", "resources": {"limits": {"nvidia.com/gpumem": {"x": 1}}}}]}},
    {"metadata": "x", "spec": {"containers": [{"name": "m"}]}}, {"metadata": {"annotations": [1]}},
    {"metadata": {"annotations": {"hamid.io/placement": "{not json"}}, "spec": GOOD_POD["spec"]},
    {"spec": {"initContainers": {"a": 1}, "containers": [{"name": "m"}]}},
]


def _an_object(body: bytes) -> bool:
    try:
        return isinstance(json.loads(body), dict)
    except (ValueError, RecursionError):
        return False


@pytest.fixture
def front_ports(tmp_path):
    """The front's webhook, extender and metrics faces serving on loopback in this process."""
    ca = certs.make_ca("test CA")
    srv = certs.issue(ca, ["127.0.0.1"])
    sched = certs.issue(ca, ["kube-scheduler"], client=True)
    for name, data in (("ca.pem", ca.cert_pem), ("tls.crt", srv.cert_pem), ("tls.key", srv.key_pem),
                       ("s.crt", sched.cert_pem), ("s.key", sched.key_pem)):
        (tmp_path / name).write_bytes(data)
    cfg = tmp_path / "config.yaml"
    cfg.write_text(f"controlMode: extender\nwebhookListen: 127.0.0.1:0\nwebhookCertFile: {tmp_path}/tls.crt\n"
                   f"webhookKeyFile: {tmp_path}/tls.key\nwebhookAllocationWriters: [x]\n"
                   f"extenderListen: 127.0.0.1:0\nextenderClientCAFile: {tmp_path}/ca.pem\n"
                   f"frontDir: {tmp_path}/front\nfrontGroup: {os.getgid() + 1}\nmetricsPort: 1\n"
                   f"metricsAddress: 127.0.0.1\nnodeName: n1\n")
    config = load_config(cfg)
    faces = front.front_faces(config, resolve_node(config, "n1"))
    for f in faces:
        f.listen = f"127.0.0.1:{free_port()}"
    client = ssl.create_default_context(cafile=str(tmp_path / "ca.pem"))
    client.load_cert_chain(str(tmp_path / "s.crt"), str(tmp_path / "s.key"))
    return faces, client


async def send_raw(port: int, raw: bytes, tls: ssl.SSLContext | None) -> bytes:
    """What the server answers ``raw`` with, up to the end of its headers (b"" if it closed first)."""
    stream = await trio.open_tcp_stream("127.0.0.1", port)
    if tls is not None:
        stream = trio.SSLStream(stream, tls, server_hostname="127.0.0.1")
    got = b""
    with trio.fail_after(30):
        try:
            await stream.send_all(raw)
            while b"\r\n\r\n" not in got:
                data = await stream.receive_some(65536)
                if not data:
                    break
                got += data
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass
    with trio.move_on_after(5):  # closed as a client does (TLS close_notify): the server lets it go at once
        try:
            await stream.aclose()
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass
    await trio.aclose_forcefully(stream)
    return got


def status(answer: bytes) -> int:
    return int(answer.split(b" ", 2)[1]) if answer.startswith(b"HTTP/1.1 ") else 0


async def test_the_fronts_listeners_answer_every_malformed_request_with_a_4xx(front_ports):
    faces, tls = front_ports
    bad: list[str] = []
    async with trio.open_nursery() as nursery:
        ports = {}
        for face in faces:
            await nursery.start(face.run)
            ports[face.name] = int(face.listen.rsplit(":", 1)[1])
        targets = [("webhook", "/mutate", tls), ("extender", "/filter", tls)]
        good = json.dumps(review()).encode()
        for name, path, ctx in targets:
            for what, raw in framed(path, good):
                got = status(await send_raw(ports[name], raw, ctx))
                if not 400 <= got < 500 and got != 501:
                    bad.append(f"{name}: {what}: {got or 'no answer'}")
            for what, body in BAD_BODIES:
                # the extender forwards a JSON object to the daemon (503 here: no daemon), the rest it refuses
                want = 503 if name == "extender" and _an_object(body) else 400
                raw = f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Length: {len(body)}\r\n\r\n".encode() + body
                got = status(await send_raw(ports[name], raw, ctx))
                if got != want:
                    bad.append(f"{name}: {what}: {got or 'no answer'}")
        for pod in ODD_PODS:
            body = json.dumps(review(obj=pod)).encode()
            raw = f"POST /mutate HTTP/1.1\r\nHost: x\r\nContent-Length: {len(body)}\r\n\r\n".encode() + body
            answer = await send_raw(ports["webhook"], raw, tls)
            if status(answer) not in (200, 400):
                bad.append(f"webhook: pod {pod}: {status(answer) or 'no answer'}")
        rng = random.Random(38)
        for i in range(200):  # a good review with bytes flipped, cut, or repeated
            body = bytearray(good)
            for _ in range(rng.randint(1, 4)):
                at = rng.randrange(len(body))
                op = rng.randrange(3)
                if op == 0:
                    body[at] = rng.randrange(256)
                elif op == 1:
                    del body[at:at + rng.randint(1, 20)]
                else:
                    body[at:at] = body[at:at + rng.randint(1, 20)]
            raw = f"POST /mutate HTTP/1.1\r\nHost: x\r\nContent-Length: {len(body)}\r\n\r\n".encode() + bytes(body)
            got = status(await send_raw(ports["webhook"], raw, tls))
            if got not in (200, 400):
                bad.append(f"webhook: mutation {i} ({bytes(body)[:80]!r}...): {got or 'no answer'}")
        raw = f"POST /mutate HTTP/1.1\r\nHost: x\r\nContent-Length: {len(good)}\r\n\r\n".encode() + good
        assert status(await send_raw(ports["webhook"], raw, tls)) == 200  # still serving
        nursery.cancel_scope.cancel()
    assert not bad, "\n".join(bad)
