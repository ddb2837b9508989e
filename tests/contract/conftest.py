"""Contract-test fixtures: one suite, run over the sync and the asyncio client.

``open_queue(config)`` returns a RolloutQueue, or an AsyncRolloutQueue behind ``SyncView`` (each
coroutine run to completion on a private event loop), so every contract test exercises both
transports through the same shared flows and scripts (BullMQ's adapter-conformance idea): there is
no mirrored test tree.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis

from rollout_queue import AsyncRolloutQueue, Hold, Lease, QueueConfig, RolloutQueue, Worker

#: what an async target hands out (one class serves both drivers): wrapped as well
_ASYNC_TYPES = (RolloutQueue, Worker, Lease, Hold)


class SyncView:
    """Presents an async client object with the sync client's calling convention."""

    def __init__(self, target: Any, loop: asyncio.AbstractEventLoop) -> None:
        object.__setattr__(self, "_target", target)
        object.__setattr__(self, "_loop", loop)

    def _wrap(self, value: Any) -> Any:
        if inspect.isawaitable(value):
            value = self._loop.run_until_complete(value)
        if isinstance(value, _ASYNC_TYPES):
            return SyncView(value, self._loop)
        return value

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._target, name)
        if callable(attr) and not isinstance(attr, type):
            return lambda *a, **kw: self._wrap(attr(*a, **kw))
        return self._wrap(attr)

    def __setattr__(self, name: str, value: Any) -> None:
        setattr(self._target, name, value)

    def __len__(self) -> int:
        return len(self._target)

    def __enter__(self) -> "SyncView":
        self._wrap(self._target.__aenter__())
        return self

    def __exit__(self, *exc: Any) -> None:
        self._wrap(self._target.__aexit__(*exc))


@pytest.fixture(params=["sync", "async"])
def transport(request: pytest.FixtureRequest) -> str:
    return request.param


@pytest.fixture
def open_queue(transport: str, redis_url: str, queue_name: str) -> Iterator[Callable[..., Any]]:
    """Factory: open_queue(config=None, name=queue_name) -> a queue client of this test's transport."""
    loop = asyncio.new_event_loop()
    opened: list[Any] = []

    def factory(config: QueueConfig | None = None, name: str | None = None, **kwargs: Any) -> Any:
        if transport == "sync":
            q: Any = RolloutQueue.from_url(redis_url, name or queue_name, config, **kwargs)
        else:
            q = SyncView(loop.run_until_complete(AsyncRolloutQueue.from_url(redis_url, name or queue_name,
                                                                            config, **kwargs)), loop)
        opened.append(q)
        return q

    yield factory
    for q in opened:
        q.close()
    loop.close()


@pytest.fixture
def raw(r: redis.Redis) -> redis.Redis:
    """A plain client to inspect Redis truth (XPENDING, ZRANGE ...) beside the queue client."""
    return r


def snapshot(raw: redis.Redis, queue_name: str, exclude: tuple[str, ...] = ()) -> dict[bytes, bytes]:
    """Every key of the queue -> its DUMP serialisation: two equal snapshots mean byte-identical data.

    ``exclude`` names key suffixes a refusal is documented to touch anyway (e.g. reserve refreshes
    the caller's heartbeat in ``workers`` and its replay record in ``reserves``).
    """
    out: dict[bytes, bytes] = {}
    for key in sorted(raw.scan_iter(match=f"rollout:{{{queue_name}}}:*", count=1000)):
        if any(key.decode().endswith(":" + suffix) for suffix in exclude + ("clock",)):
            continue
        dumped = raw.dump(key)
        if dumped is not None:
            out[key] = dumped
    return out


@pytest.fixture
def hostile(r: redis.Redis, redis_url: str, queue_name: str) -> Iterator[redis.Redis]:
    """A client holding the worker role's credential for this queue (what ``rollout-queue acl
    --apply`` writes): the tests of what a leaked worker credential can and cannot do."""
    import secrets

    from rollout_queue.ops.acl import role_rules

    user, password = f"w-{secrets.token_hex(3)}", secrets.token_hex(8)
    r.execute_command("ACL", "SETUSER", user, ">" + password, *role_rules(queue_name, "worker").rules)
    client = redis.Redis.from_url(redis_url, username=user, password=password, decode_responses=True)
    yield client
    client.close()
    r.execute_command("ACL", "DELUSER", user)
