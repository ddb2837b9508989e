"""Root conftest: hermetic environment and private Redis/Valkey servers for the whole suite.

This file owns which server kinds the suite runs against and the fixtures that hand them out:
``server`` (one per kind, shared by the session), ``fresh_server`` (one per test, for kill -9 and
restart), ``redis_url``, ``r`` and ``queue_name``. It must not FLUSHALL a shared server (each
test deletes only its own queue's keys), register markers (pyproject.toml declares them), or
silently skip a server kind that CI asked for.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator

import pytest
import redis

from rollout_queue.devtools.local_server import INSTALL_HINT, KINDS, LocalServer, available_servers

# Tests never reach the network or phone home, whatever the developer's shell has set.
for _name in ("HF_HUB_OFFLINE", "VLLM_NO_USAGE_STATS", "DO_NOT_TRACK", "TRANSFORMERS_OFFLINE", "TRL_EXPERIMENTAL_SILENCE"):
    os.environ.setdefault(_name, "1")


def _server_kinds() -> list[str]:
    """Kinds from ROLLOUT_TEST_SERVERS (e.g. "redis,valkey"), else every kind installed here.

    A requested kind that is missing is a usage error, not a skip: CI that asks for valkey must
    fail when valkey is absent rather than report green having tested only redis.
    """
    found = available_servers()
    requested = os.environ.get("ROLLOUT_TEST_SERVERS", "").strip()
    if not requested:
        return [kind for kind in KINDS if kind in found]
    kinds = [kind.strip() for kind in requested.split(",") if kind.strip()]
    unknown = sorted(set(kinds) - set(KINDS))
    if unknown:
        raise pytest.UsageError(f"ROLLOUT_TEST_SERVERS names unknown kinds {unknown}; use {KINDS}")
    missing = [kind for kind in kinds if kind not in found]
    if missing:
        raise pytest.UsageError(
            f"ROLLOUT_TEST_SERVERS={requested!r} asks for {missing}, not installed here; "
            f"{INSTALL_HINT}"
        )
    return list(dict.fromkeys(kinds))


# With no server installed at all, one parameter of None makes every server test error out with
# find_server's install hint, instead of pytest quietly skipping an empty parameter set.
SERVER_KINDS: list[str | None] = list(_server_kinds()) or [None]
_KIND_IDS = [kind or "no-server" for kind in SERVER_KINDS]


@pytest.fixture(scope="session", params=SERVER_KINDS, ids=_KIND_IDS)
def server(request: pytest.FixtureRequest) -> Iterator[LocalServer]:
    """One started server per kind, shared by every test of the session."""
    local = LocalServer(request.param)
    try:
        yield local.start()
    finally:
        local.cleanup()


@pytest.fixture(params=SERVER_KINDS, ids=_KIND_IDS)
def fresh_server(request: pytest.FixtureRequest) -> Iterator[LocalServer]:
    """A private server for this test alone, free to kill -9, restart or reconfigure."""
    local = LocalServer(request.param)
    try:
        yield local.start()
    finally:
        local.cleanup(graceful=False)  # its data dies with it; no need to wait for a clean stop


def _require_running(server: LocalServer) -> LocalServer:
    # A test that stopped the *shared* server would break every later test in confusing ways;
    # name the culprit's victim here instead. Tests that kill servers use fresh_server.
    if not server.is_running():
        raise RuntimeError(f"the session server {server!r} is down; use fresh_server to kill one")
    return server


@pytest.fixture
def redis_url(server: LocalServer) -> str:
    """URL of the session server of this test's kind."""
    return _require_running(server).url


@pytest.fixture
def r(server: LocalServer) -> Iterator[redis.Redis]:
    """A bytes-replies client to the session server, closed after the test."""
    client = redis.Redis.from_url(_require_running(server).url, decode_responses=False)
    try:
        yield client
    finally:
        client.close()


def _delete_queue_keys(url: str, queue: str) -> None:
    """UNLINK every key of ``queue`` and of its partitions (``queue#0`` …), SCAN by SCAN.

    Never FLUSHALL: other tests' queues live on the same server.
    """
    client = redis.Redis.from_url(url)
    try:
        for pattern in (f"rollout:{{{queue}}}:*", f"rollout:{{{queue}#*}}:*"):
            batch: list[bytes] = []
            for key in client.scan_iter(match=pattern, count=1000):
                batch.append(key)
                if len(batch) >= 500:
                    client.unlink(*batch)
                    batch.clear()
            if batch:
                client.unlink(*batch)
    finally:
        client.close()


@pytest.fixture
def queue_name(request: pytest.FixtureRequest) -> Iterator[str]:
    """A unique queue name; its keys on the session server are deleted after the test.

    Only a test that uses the session server (directly or through ``r``/``redis_url``) gets
    the cleanup; asking for ``server`` here would parametrize pure tests over server kinds
    for nothing. A ``fresh_server`` is thrown away whole, so its keys need no deleting.
    """
    name = f"t-{uuid.uuid4().hex[:12]}"
    shared: LocalServer | None = None
    if "server" in request.fixturenames:
        shared = request.getfixturevalue("server")
    yield name
    if shared is not None and shared.is_running():
        _delete_queue_keys(shared.url, name)
