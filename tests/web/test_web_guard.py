"""The web listener's rules (hamid/web/guard.py) on a real face over a real node:
token and login, connection cap, body limit, request deadline, headers, config."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import httpx
import pytest
import trio

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from nodeharness import make_node  # noqa: E402

from hamid.config import load_config  # noqa: E402
from hamid.config.load import ConfigError  # noqa: E402
from hamid.web.face import WebFace  # noqa: E402
from hamid.web.guard import TokenError, load_token  # noqa: E402

TOKEN = "s3cret-token-0123456789abcdef"


def _face(tmp_path, **kw):
    d = make_node(tmp_path / "state", simulate="T4", node="w")
    return d, WebFace(d.service, "127.0.0.1:0", settings=d.settings, **kw)


async def _serving(nursery, face) -> str:
    bound = await nursery.start(face.run)
    return bound[0]


async def test_token_bearer_login_cookie_and_headers(tmp_path):
    d, face = _face(tmp_path, token=TOKEN)
    try:
        async with trio.open_nursery() as n:
            url = await _serving(n, face)
            async with httpx.AsyncClient(base_url=url, follow_redirects=False) as c:
                r = await c.get("/api/state")
                assert r.status_code == 401 and "token" in r.json()["error"]
                r = await c.get("/")
                assert r.status_code == 303 and r.headers["location"] == "/login"
                r = await c.get("/api/state", headers={"authorization": "Bearer wrong-token-0123456789"})
                assert r.status_code == 401
                r = await c.get("/api/state", headers={"authorization": f"Bearer {TOKEN}"})
                assert r.status_code == 200 and r.json()["node"] == "w"
                r = await c.get("/login")
                assert r.status_code == 200 and 'role="alert"' not in r.text
                r = await c.post("/login", data={"token": "nope"})
                assert r.status_code == 401
                # the form again, saying why: a wrong token must not look like a page that did nothing
                assert 'role="alert"' in r.text and "Wrong token" in r.text and "webTokenFile" in r.text
                assert "nope" not in r.text  # nothing typed in is echoed
                r = await c.post("/login", data={"token": TOKEN})
                assert r.status_code == 303
                cookie = r.headers["set-cookie"]
                assert "httponly" in cookie.lower() and "samesite=strict" in cookie.lower()
                assert TOKEN not in cookie  # the session value is derived from the token, not the token
                r = await c.get("/")  # the client keeps the cookie
                assert r.status_code == 200 and b"/static/app.js" in r.content
                csp = r.headers["content-security-policy"]
                assert "script-src 'self'" in csp and "default-src 'none'" in csp
                assert r.headers["x-content-type-options"] == "nosniff"
                # the assets need no token (they hold no data) and nothing else is served
                assert (await httpx.AsyncClient(base_url=url).get("/static/app.css")).status_code == 200
                assert (await c.get("/static/index.html")).status_code == 404
                assert (await c.get("/static/../face.py")).status_code == 404
            n.cancel_scope.cancel()
    finally:
        d.close()


async def test_connection_cap_body_limit_and_deadline(tmp_path):
    d, face = _face(tmp_path, max_connections=2, request_timeout=0.5)
    try:
        async with trio.open_nursery() as n:
            url = await _serving(n, face)
            async with httpx.AsyncClient(base_url=url, timeout=10) as c:
                # two live streams hold both places; a third request is turned away at once
                async with c.stream("GET", "/api/events") as s1, c.stream("GET", "/api/events") as s2:
                    assert s1.status_code == 200 and s2.status_code == 200
                    r = await c.get("/api/state")
                    assert r.status_code == 503 and "webMaxConnections=2" in r.text
                assert (await c.get("/api/state")).status_code == 200  # places free again
                r = await c.post("/api/whatif", content=b'{"text": "' + b"x" * 100_000 + b'"}')
                assert r.status_code == 413
                r = await c.post("/api/whatif", content=b'{"text": 5}')
                assert r.status_code == 400 and "text" in r.json()["error"]

                # a sender that never finishes its body gets 503 after webRequestTimeout, not a held task
                host, port = url.removeprefix("http://").rsplit(":", 1)
                sock = await trio.open_tcp_stream(host, int(port))
                await sock.send_all(b"POST /api/whatif HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                                    b"Content-Length: 100\r\n\r\n{\"text\": ")
                got = b""
                with trio.fail_after(3):
                    while b"}" not in got.partition(b"\r\n\r\n")[2]:  # the headers, then the JSON body
                        chunk = await sock.receive_some(4096)
                        if not chunk:
                            break
                        got += chunk
                await sock.aclose()
                assert got.startswith(b"HTTP/1.1 503") and b"webRequestTimeout" in got, got
                r = await c.post("/api/whatif", json={"text": "mem=2g"})
                assert r.status_code == 200 and r.json()["results"][0]["node"] == "w"
            n.cancel_scope.cancel()
    finally:
        d.close()


def test_config_refuses_an_open_view_off_loopback(tmp_path):
    with pytest.raises(ConfigError, match="webTokenFile"):
        load_config(None, {"webListen": "0.0.0.0:7949"})
    assert load_config(None, {"webListen": "0.0.0.0:7949", "webInsecure": True}).webListen == "0.0.0.0:7949"
    assert load_config(None, {"webListen": "127.0.0.1:7949"}).webTokenFile is None
    with pytest.raises(ConfigError, match="webListen"):
        load_config(None, {"webListen": "7949"})


def test_token_file_rules(tmp_path):
    f = tmp_path / "token"
    f.write_text(TOKEN + "\n")
    os.chmod(f, 0o644)
    with pytest.raises(TokenError, match="chmod 600"):
        load_token(str(f))
    os.chmod(f, 0o600)
    assert load_token(str(f)) == TOKEN
    f.write_text("short\n")
    with pytest.raises(TokenError, match="at least 16"):
        load_token(str(f))
    with pytest.raises(TokenError, match="No such file"):
        load_token(str(tmp_path / "missing"))
