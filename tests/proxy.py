"""A loopback TCP forwarder for replication and failover tests: a stand-in for a network path.

Owns two things a test cannot get from a server process alone:

- a **lagging replication link**: put a Proxy between a replica and its primary (``replicaof`` the
  proxy) and ``stall()`` it: the primary's replication stream is read and held here, not delivered,
  while the replica's acknowledgements still flow back (the primary sees an online replica whose
  offset stops moving, exactly asynchronous replication falling behind). Killing the primary then
  loses what was held, as a real failover loses what the replica had not received;
- a **moving service address** (what Sentinel-aware clients, a VIP or a proxy give applications):
  clients connect to the Proxy and ``point_at()`` sends new connections to another server and cuts
  the old ones.

It knows nothing about Redis. Threads are daemons and every socket is closed by ``close()``.
"""

from __future__ import annotations

import socket
import threading
from types import TracebackType

HOST = "127.0.0.1"


class Proxy:
    """Forwards each accepted connection to ``target`` (host, port), byte for byte."""

    def __init__(self, target: tuple[str, int]) -> None:
        self.target = target
        self._listener = socket.create_server((HOST, 0))
        self.port: int = self._listener.getsockname()[1]
        self._lock = threading.Lock()
        self._pairs: list[tuple[socket.socket, socket.socket]] = []
        self._stalled = False
        self.held_bytes = 0  # replication bytes read from the server side and never delivered
        self._closed = False
        threading.Thread(target=self._accept, daemon=True).start()

    @property
    def address(self) -> tuple[str, int]:
        return HOST, self.port

    @property
    def url(self) -> str:
        return f"redis://{HOST}:{self.port}/0"

    def stall(self) -> None:
        """Stop delivering server -> client bytes: they are read (the server's writes succeed) and
        dropped, counted in ``held_bytes``, so a stalled link never catches up; client -> server bytes
        still flow. ``cut()`` ends the stall with the connections."""
        with self._lock:
            self._stalled = True

    def cut(self) -> None:
        """Close every forwarded connection; held bytes are dropped."""
        with self._lock:
            pairs, self._pairs = self._pairs, []
            self._stalled = False
        for a, b in pairs:
            for sock in (a, b):
                _close(sock)

    def point_at(self, target: tuple[str, int]) -> None:
        """New connections go to ``target``; the current ones are cut (clients reconnect)."""
        with self._lock:
            self.target = target
        self.cut()

    def close(self) -> None:
        self._closed = True
        _close(self._listener)
        self.cut()

    def __enter__(self) -> "Proxy":
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

    # -- internals ----------------------------------------------------------------------------------
    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return  # closed
            with self._lock:
                target = self.target
            try:
                server = socket.create_connection(target, timeout=5)
                server.settimeout(None)
                for sock in (client, server):  # as Redis does: no Nagle delay on small replies
                    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            except OSError:
                _close(client)  # nothing listens there: the client sees a refused/closed connection
                continue
            with self._lock:
                self._pairs.append((client, server))
            threading.Thread(target=self._pump, args=(client, server, False), daemon=True).start()
            threading.Thread(target=self._pump, args=(server, client, True), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket, downstream: bool) -> None:
        try:
            while True:
                data = src.recv(65536)
                if not data:
                    break
                with self._lock:
                    hold = downstream and self._stalled
                    if hold:
                        self.held_bytes += len(data)
                if not hold:
                    dst.sendall(data)
        except OSError:
            pass
        finally:
            _close(src)
            _close(dst)


def _close(sock: socket.socket) -> None:
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    sock.close()
