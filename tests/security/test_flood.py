"""No caller can exhaust or stop the daemon.

Found by an attack: ~20,000 slow connections exhausted the daemon's file
descriptors, ``os.listdir`` in the Docker face's drain loop raised EMFILE and
the whole daemon exited (one face's error tore down the root nursery).

Here a real daemon (gossip, peer API, metrics, local API and Docker sockets)
runs with 1,024 file descriptors, and thousands of idle and slow connections
are opened on each TCP port (loopback only, bounded in count and time). The
daemon must keep answering its local and Docker sockets within normal
latency, stay up, keep its memory bounded, and serve again once the flood
ends. Then the pieces one at a time: a request that trickles its body is cut
at the request deadline (408), a listener's connection cap, a face that fails
after start is restarted without the others noticing.
"""

from __future__ import annotations

import base64
import os
import resource
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
import trio

from hamid.localapi.client import LocalClient

HAMID = [sys.executable, "-m", "hamid.cli.main"]


from netports import free_port as _port  # noqa: E402 - ports outside the ephemeral range


def _rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def _limit_fds():
    resource.setrlimit(resource.RLIMIT_NOFILE, (1024, 1024))


def _docker_face_answers(state: Path) -> float:
    """Seconds for a malformed create on the Docker face's socket to be refused with its reason."""
    t0 = time.monotonic()
    with httpx.Client(transport=httpx.HTTPTransport(uds=str(state / "docker.sock")), timeout=10) as c:
        r = c.post("http://docker/v1/create", json={"id": "x"})
    assert r.status_code == 400 and "bundle" in r.json()["error"], r.text
    return time.monotonic() - t0


@pytest.mark.slow
def test_thousands_of_idle_and_slow_connections_do_not_stop_the_daemon(tmp_path):
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < 8192:
        pytest.skip(f"this test opens ~6,000 sockets; the hard file limit here is {hard}")
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard if hard != resource.RLIM_INFINITY else 65536, hard))
    state = tmp_path / "state"
    key = tmp_path / "gossip.key"
    key.write_text(base64.b64encode(os.urandom(32)).decode() + "\n")
    os.chmod(key, 0o600)
    gossip, peer, metrics = _port(), _port(), _port()
    p = subprocess.Popen([*HAMID, "run", "--state-dir", str(state), "--metrics-port", str(metrics),
                          "--simulate", "H100:2", "--node-name", "n1", "--log-format", "json",
                          "--gossip-listen", f"127.0.0.1:{gossip}", "--gossip-key-file", str(key),
                          "--peer-listen", f"127.0.0.1:{peer}"],
                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, preexec_fn=_limit_fds)
    held: list[socket.socket] = []
    try:
        deadline = time.time() + 30
        while True:
            assert p.poll() is None, p.stderr.read()
            try:
                with LocalClient(state) as c:
                    c.status()
                break
            except Exception:
                assert time.time() < deadline, "daemon did not come up"
                time.sleep(0.1)
        base_latency = max(_docker_face_answers(state) for _ in range(3))
        rss0 = _rss_kib(p.pid)

        worst = 0.0
        t_end = time.time() + 12
        rounds = 0
        while time.time() < t_end and rounds < 4:  # bounded: 4 rounds of 1,500 connections
            rounds += 1
            for i in range(1500):
                port = (gossip, peer, metrics)[i % 3]
                s = socket.socket()
                s.setblocking(False)
                try:
                    s.connect_ex(("127.0.0.1", port))
                except OSError:
                    s.close()
                    continue
                held.append(s)
                if i % 5 == 0:  # a slow request: headers that promise a body never sent
                    try:
                        s.send(b"POST /v1/peer HTTP/1.1\r\nHost: x\r\nContent-Length: 100000\r\n\r\nab")
                    except OSError:
                        pass
            for _ in range(3):
                t0 = time.monotonic()
                with LocalClient(state) as c:
                    c.status()
                worst = max(worst, time.monotonic() - t0, _docker_face_answers(state))
            assert p.poll() is None, f"the daemon died under the flood: {p.stderr.read()[-3000:]}"
        assert worst < max(1.0, 20 * base_latency), (worst, base_latency)
        rss = _rss_kib(p.pid)
        assert rss - rss0 < 150 * 1024, f"RSS grew {(rss - rss0) // 1024} MiB under the flood"
    finally:
        for s in held:
            s.close()
    try:
        # the flood is gone: every listener serves again, every face up, nothing restarted for good
        deadline = time.time() + 20
        while True:
            try:
                text = httpx.get(f"http://127.0.0.1:{metrics}/metrics", timeout=5).text
                break
            except httpx.HTTPError:
                assert time.time() < deadline, "metrics never answered again"
                time.sleep(0.5)
        ups = [line for line in text.splitlines() if line.startswith("hamid_face_up{")]
        assert ups and all(line.endswith(" 1.0") for line in ups), ups
        assert p.poll() is None
    finally:
        p.terminate()
        p.wait(timeout=15)


async def test_a_request_that_trickles_its_body_is_cut_at_its_deadline_and_the_cap_holds():
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import PlainTextResponse
    from starlette.routing import Route

    from hamid.serving import ConnectionCount, serve_asgi

    async def echo(req: Request):
        return PlainTextResponse(str(len(await req.body())))

    counts = ConnectionCount()
    async with trio.open_nursery() as nursery:
        (bound,) = await nursery.start(lambda task_status: serve_asgi(
            Starlette(routes=[Route("/", echo, methods=["POST"])]), "127.0.0.1:0", deadline_s=1.0,
            max_connections=5, counts=counts, task_status=task_status))
        host, port = bound.split("://")[1].rsplit(":", 1)
        stream = await trio.open_tcp_stream(host, int(port))
        await stream.send_all(b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n")
        t0 = trio.current_time()
        got = b""
        with trio.fail_after(5):
            while b"\r\n\r\n" not in got:
                with trio.move_on_after(0.2):
                    got += await stream.receive_some(4096)
                if b"\r\n\r\n" not in got:
                    await stream.send_all(b"x")  # one byte at a time: never idle, never done
        assert got.startswith(b"HTTP/1.1 408"), got
        assert 0.9 <= trio.current_time() - t0 < 3
        await stream.aclose()

        held = [await trio.open_tcp_stream(host, int(port)) for _ in range(5)]
        await trio.sleep(0.2)
        extra = await trio.open_tcp_stream(host, int(port))
        with trio.fail_after(3):  # over the cap: accepted and closed at once
            assert await extra.receive_some(10) == b""
        assert counts.refused >= 2 and counts.open == 4  # one source: the cap's last slot is kept for another
        for s in held:
            await s.aclose()
        nursery.cancel_scope.cancel()


async def test_a_face_that_fails_after_start_is_restarted_and_the_others_keep_serving(autojump_clock):
    from hamid.daemon.supervise import FaceHealth, supervised

    class Flaky:
        name = "flaky"
        runs = 0

        async def run(self, *, task_status=trio.TASK_STATUS_IGNORED):
            Flaky.runs += 1
            task_status.started()
            await trio.sleep(1)
            if Flaky.runs <= 3:
                raise OSError(24, "Too many open files")
            await trio.sleep_forever()

    class Steady:
        name = "steady"
        ticks = 0

        async def run(self, *, task_status=trio.TASK_STATUS_IGNORED):
            task_status.started()
            while True:
                await trio.sleep(0.5)
                Steady.ticks += 1

    class BadStart:
        name = "bad"

        async def run(self, *, task_status=trio.TASK_STATUS_IGNORED):
            raise OSError(98, "Address already in use")

    health = FaceHealth()
    with pytest.raises(OSError, match="in use"):  # a face that cannot start still stops the daemon at once
        await supervised(BadStart(), health)
    async with trio.open_nursery() as nursery:
        await nursery.start(supervised, Flaky(), health)
        await nursery.start(supervised, Steady(), health)
        await trio.sleep(30)
        assert Flaky.runs == 4 and health.restarts == {"flaky": 3}
        assert health.up == {"flaky": True, "steady": True}
        assert Steady.ticks >= 55  # never interrupted
        nursery.cancel_scope.cancel()


async def test_one_source_keeps_to_its_share_until_authenticated_and_the_reserve_is_kept_for_new_sources():
    """Sources are addresses (loopback has a whole /8 of them): one source holds at most its
    share, an authenticated connection no longer counts against it, and the last slots go
    only to a source that holds none."""
    from hamid.serving import CappedListener, ConnectionCount

    counts = ConnectionCount()
    (inner,) = await trio.open_tcp_listeners(0, host="127.0.0.1")
    port = inner.socket.getsockname()[1]
    listener = CappedListener(inner, 16, counts, per_source=4, reserve=4)
    held: list = []

    async def accept_forever():
        while True:
            held.append(await listener.accept())

    async def connect(source: str, n: int) -> list[trio.SocketStream]:
        """``n`` connections from ``source``, once the listener has decided on each."""
        out = []
        for _ in range(n):
            sock = trio.socket.socket()
            await sock.bind((source, 0))
            await sock.connect(("127.0.0.1", port))
            out.append(trio.SocketStream(sock))
        with trio.fail_after(30):
            while counts.open + counts.refused < seen[0] + n:
                await trio.sleep(0.01)
        seen[0] += n
        return out

    seen = [0]
    async with trio.open_nursery() as nursery:
        nursery.start_soon(accept_forever)
        flood = await connect("127.0.0.2", 10)
        assert counts.held("127.0.0.2") == 4 and counts.open == 4 and counts.refused_source == 6
        for conn in held[:2]:  # two of its connections prove who they are: they leave its share
            counts.authenticated(conn.socket.getpeername())
        assert counts.held("127.0.0.2") == 2
        flood += await connect("127.0.0.2", 3)
        assert counts.held("127.0.0.2") == 4 and counts.open == 6
        others = await connect("127.0.0.3", 4) + await connect("127.0.0.4", 2)
        assert counts.open == 12  # 16 less the reserve of 4: shared slots all taken
        others += await connect("127.0.0.4", 1)
        assert counts.held("127.0.0.4") == 2 and counts.open == 12  # holds some: the reserve is not for it
        for i in range(4):  # new sources still get in, one connection each, until the cap
            others += await connect(f"127.0.1.{i + 1}", 2)
        assert counts.open == 16
        others += await connect("127.0.2.1", 1)
        assert counts.open == 16  # the cap holds
        for conn in held:
            await conn.aclose()
        assert counts.open == 0 and all(counts.held(f"127.0.0.{i}") == 0 for i in (2, 3, 4))
        for s in flood + others:
            await s.aclose()
        nursery.cancel_scope.cancel()


def test_a_source_is_an_ipv4_address_or_an_ipv6_64_and_a_unix_socket_is_none():
    from hamid.serving import source_of

    assert source_of(("10.1.2.3", 5)) == "10.1.2.3"
    assert source_of(("::ffff:10.1.2.3", 5, 0, 0)) == "10.1.2.3"
    assert source_of(("2001:db8:1:2:aaaa::1", 5, 0, 0)) == source_of(("2001:db8:1:2:bbbb::9", 7, 0, 0)) \
        == "2001:db8:1:2::/64"
    assert source_of("/run/x.sock") is None and source_of("") is None


async def test_a_caller_that_opens_a_connection_per_request_is_never_refused():
    # A scraper without keep-alive closes each connection after its answer; hypercorn keeps such a socket until
    # its keep-alive timer ends, so counting it against the source until then refused the 33rd scrape.
    from starlette.applications import Starlette
    from starlette.responses import PlainTextResponse
    from starlette.routing import Route

    from hamid.serving import PER_SOURCE, ConnectionCount, serve_asgi

    async def ok(_req):
        return PlainTextResponse("ok")

    counts = ConnectionCount()
    async with trio.open_nursery() as nursery:
        (bound,) = await nursery.start(lambda task_status: serve_asgi(
            Starlette(routes=[Route("/", ok)]), "127.0.0.1:0", counts=counts, task_status=task_status))
        url = bound + "/"

        def scrapes() -> None:  # one client, so one connection, per request, as a scraper without keep-alive
            for i in range(2 * PER_SOURCE + 5):
                r = httpx.get(url, timeout=10)
                assert r.status_code == 200 and r.text == "ok", (i, r.status_code)

        await trio.to_thread.run_sync(scrapes)
        assert counts.refused_source == 0
        nursery.cancel_scope.cancel()


async def test_connections_closed_on_their_side_with_nothing_asked_do_not_fill_the_listener(monkeypatch):
    # A connection whose caller closed its side left its source's share at once but kept its slot until
    # hypercorn's keep-alive timer ended: one source opening connections and closing its side at once held
    # every slot (its share never counted them) and locked every other caller out.
    from starlette.applications import Starlette
    from starlette.responses import PlainTextResponse
    from starlette.routing import Route

    import hamid.serving
    from hamid.serving import ConnectionCount, serve_asgi

    monkeypatch.setattr(hamid.serving, "HEADER_DEADLINE_S", 600)  # the timer cannot end within the test

    async def ok(_req):
        return PlainTextResponse("ok")

    counts = ConnectionCount()
    async with trio.open_nursery() as nursery:
        (bound,) = await nursery.start(lambda task_status: serve_asgi(
            Starlette(routes=[Route("/", ok)]), "127.0.0.1:0", counts=counts, max_connections=16,
            task_status=task_status))
        port = int(bound.rsplit(":", 1)[1])

        def flood_then_ask() -> tuple[int, str]:
            held = []
            for _ in range(3 * 16):
                s = socket.socket()
                s.bind(("127.0.0.2", 0))
                s.connect(("127.0.0.1", port))
                s.shutdown(socket.SHUT_WR)
                held.append(s)
            try:
                deadline = time.monotonic() + 60  # a busy machine's accept loop: only ever a failure's bound
                while True:
                    try:
                        with httpx.Client(transport=httpx.HTTPTransport(local_address="127.0.0.3")) as c:
                            r = c.get(f"http://127.0.0.1:{port}/", timeout=10)
                        return r.status_code, r.text
                    except httpx.TransportError:
                        if time.monotonic() > deadline:
                            raise
                        time.sleep(0.2)
            finally:
                for s in held:
                    s.close()

        assert await trio.to_thread.run_sync(flood_then_ask) == (200, "ok")
        nursery.cancel_scope.cancel()


async def test_a_caller_that_closes_its_side_after_asking_still_gets_its_answer():
    from starlette.applications import Starlette
    from starlette.responses import PlainTextResponse
    from starlette.routing import Route

    from hamid.serving import ConnectionCount, serve_asgi

    async def slow(_req):
        await trio.sleep(0.2)
        return PlainTextResponse("ok")

    counts = ConnectionCount()
    async with trio.open_nursery() as nursery:
        (bound,) = await nursery.start(lambda task_status: serve_asgi(
            Starlette(routes=[Route("/", slow)]), "127.0.0.1:0", counts=counts, task_status=task_status))
        port = int(bound.rsplit(":", 1)[1])

        def ask() -> bytes:
            with socket.create_connection(("127.0.0.1", port), timeout=30) as s:
                s.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
                s.shutdown(socket.SHUT_WR)
                data = b""
                while chunk := s.recv(4096):
                    data += chunk
                return data

        got = await trio.to_thread.run_sync(ask)
        assert got.startswith(b"HTTP/1.1 200") and got.endswith(b"ok"), got
        nursery.cancel_scope.cancel()
