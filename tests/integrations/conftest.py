"""Fixtures of the integration tests that are about a trainer framework, not the server: one
private redis-server per module instead of the suite's server kinds."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator

import pytest

from rollout_queue import QueueConfig, RolloutQueue
from rollout_queue.devtools.local_server import LocalServer


@pytest.fixture(scope="module")
def private_redis_url() -> Iterator[str]:
    """A private redis-server for the module (TRL's own behaviour does not vary by server kind)."""
    local = LocalServer("redis")
    try:
        yield local.start().url
    finally:
        local.cleanup(graceful=False)


@pytest.fixture
def fresh_name() -> str:
    """A queue name no other test of the module uses."""
    return "t-" + uuid.uuid4().hex[:12]


@pytest.fixture
def env_queue(private_redis_url: str, fresh_name: str,
              monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[[QueueConfig], RolloutQueue]]:
    """Opens the test's queue with a config and names it in REDIS_URL / ROLLOUT_QUEUE, where the
    adapters a framework builds by configuration find it; what it opened is closed after the test
    (after the fixtures that use it are torn down)."""
    opened: list[RolloutQueue] = []

    def open_queue(config: QueueConfig) -> RolloutQueue:
        queue = RolloutQueue.from_url(private_redis_url, fresh_name, config)
        opened.append(queue)
        monkeypatch.setenv("REDIS_URL", private_redis_url)
        monkeypatch.setenv("ROLLOUT_QUEUE", fresh_name)
        return queue

    yield open_queue
    for queue in opened:
        queue.close()
