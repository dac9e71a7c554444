"""The async Kubernetes client (hamid/kube/rest.py) the leader's and the faces' hot paths use.

What callers rely on: answers as plain dicts from the kubeconfig's server; a refusal raised with the API server's code and message; a
request sent on a kept-alive connection the server had just closed is asked
again when that is safe (GET, PUT: as the official client does), a POST never
(it could be applied twice); an answer larger than the limit is refused, not
buffered.
"""

from __future__ import annotations

import json
from functools import partial

import pytest
import trio

from hamid.kube.client import api_client
from hamid.kube.rest import AsyncKube, KubeApiError


def _pod(name: str) -> dict:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": "default"},
            "spec": {"containers": [{"name": "c", "image": "x"}]}}


async def test_requests_answer_dicts_and_refusals_carry_the_servers_code(api_server, kubeconfig):
    await trio.to_thread.run_sync(api_server.create, _pod("a"))
    kube = AsyncKube.of(api_client(kubeconfig))
    try:
        got = await kube.request("GET", "/api/v1/namespaces/default/pods/a")
        assert got["metadata"]["name"] == "a" and isinstance(got, dict)
        got["metadata"]["annotations"] = {"x": "1"}
        put = await kube.request("PUT", "/api/v1/namespaces/default/pods/a", got)
        assert put["metadata"]["annotations"] == {"x": "1"}
        with pytest.raises(KubeApiError) as e:  # the resourceVersion read before the update: a conflict
            await kube.request("PUT", "/api/v1/namespaces/default/pods/a", got)
        assert e.value.status == 409
        with pytest.raises(KubeApiError) as e:
            await kube.request("GET", "/api/v1/namespaces/default/pods/nope")
        assert e.value.status == 404 and "nope" in str(e.value)
    finally:
        await kube.aclose()


class _Flaky:
    """An HTTP server that closes the first ``drops`` connections after reading a request, unanswered
    (a kept-alive connection the server closed just then), and answers later ones with a JSON body."""

    def __init__(self, drops: int, body: bytes = b'{"ok": true}') -> None:
        self.drops = drops
        self.body = body
        self.requests = 0
        self.heads: list[bytes] = []

    async def serve(self, stream: trio.SocketStream) -> None:
        buf = b""
        while b"\r\n\r\n" not in buf:
            chunk = await stream.receive_some(65536)
            if not chunk:
                return
            buf += chunk
        self.requests += 1
        self.heads.append(buf.split(b"\r\n\r\n")[0])
        if self.drops > 0:
            self.drops -= 1
            await stream.aclose()
            return
        await stream.send_all(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nConnection: close\r\n"
                              b"Content-Length: " + str(len(self.body)).encode() + b"\r\n\r\n" + self.body)
        await stream.aclose()


async def _with_server(server: _Flaky, body, cfg=None):
    async with trio.open_nursery() as nursery:
        (listener,) = await nursery.start(partial(trio.serve_tcp, server.serve, 0, host="127.0.0.1"))
        port = listener.socket.getsockname()[1]
        from kubernetes import client

        cfg = cfg or client.Configuration()
        cfg.host = f"http://127.0.0.1:{port}"
        kube = AsyncKube(cfg)
        try:
            await body(kube)
        finally:
            await kube.aclose()
            nursery.cancel_scope.cancel()


async def test_a_dropped_connection_is_asked_again_for_get_and_put_never_for_post():
    server = _Flaky(drops=1)

    async def idempotent(kube):
        assert await kube.request("GET", "/x") == {"ok": True}
        server.drops = 1
        assert await kube.request("PUT", "/x", {"a": 1}) == {"ok": True}

    await _with_server(server, idempotent)
    assert server.requests == 4

    server = _Flaky(drops=1)

    async def post(kube):
        with pytest.raises(KubeApiError) as e:
            await kube.request("POST", "/x", {"a": 1})
        assert e.value.status == 0 and "did not answer" in str(e.value)

    await _with_server(server, post)
    assert server.requests == 1


async def test_an_answer_over_the_limit_is_refused():
    server = _Flaky(drops=0, body=json.dumps({"items": ["x" * 1000] * 200}).encode())

    async def big(kube):
        kube.max_answer_bytes = 10_000
        with pytest.raises(KubeApiError) as e:
            await kube.request("GET", "/x")
        assert "over 10000 bytes" in str(e.value)

    await _with_server(server, big)


async def test_the_token_goes_with_every_request_and_its_refresh_hook_is_asked_once_a_minute():
    """The kubeconfig loader's refresh hook rebuilds the whole configuration (over a millisecond): asked
    per request, it cost more than the request itself."""
    from kubernetes import client

    cfg = client.Configuration()
    cfg.api_key = {"authorization": "sekret"}
    cfg.api_key_prefix = {"authorization": "Bearer"}
    asked = []
    cfg.refresh_api_key_hook = lambda c: asked.append(1)
    server = _Flaky(drops=0)

    async def five(kube):
        for _ in range(5):
            await kube.request("GET", "/x")

    await _with_server(server, five, cfg)
    assert len(server.heads) == 5 and all(b"authorization: bearer sekret" in h.lower() for h in server.heads)
    assert len(asked) == 1
