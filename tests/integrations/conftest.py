"""Fixtures of the integration tests that are about a trainer framework, not the server: one
private redis-server per module instead of the suite's server kinds."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest

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
