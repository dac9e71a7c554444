"""A TCP proxy for tests that can be cut: what a network partition between one
daemon and the API server looks like to that daemon. Threads; 127.0.0.1.

``cut()`` closes every open connection and from then on accepts new ones but
never answers (a black hole: the client's requests hang until its own
timeout, as across a dead link); ``restore()`` forwards again."""

from __future__ import annotations

import socket
import threading


class TcpProxy:
    def __init__(self, target: tuple[str, int]) -> None:
        self.target = target
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        self._cut = False
        self._lock = threading.Lock()
        self._open: list[socket.socket] = []
        self._stop = False
        threading.Thread(target=self._accept, daemon=True, name="tcpproxy").start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def cut(self) -> None:
        with self._lock:
            self._cut = True
            for s in self._open:
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
                s.close()
            self._open.clear()

    def restore(self) -> None:
        with self._lock:
            self._cut = False

    def close(self) -> None:
        self._stop = True
        self.cut()
        self._listener.close()

    def _accept(self) -> None:
        while not self._stop:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            with self._lock:
                self._open.append(client)
                if self._cut:
                    continue  # held open, never answered
            try:
                upstream = socket.create_connection(self.target, timeout=5)
            except OSError:
                client.close()
                continue
            with self._lock:
                self._open.append(upstream)
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()

    def _pipe(self, src: socket.socket, dst: socket.socket) -> None:
        try:
            while True:
                data = src.recv(65536)
                if not data:
                    break
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
