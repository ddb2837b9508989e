"""The asyncio names of the facade: the same classes, for callers that ``await`` each call.

One implementation serves both kinds of caller (api/__init__.py): ``AsyncWorker`` *is* ``Worker``,
and ``AsyncRolloutQueue`` differs from ``RolloutQueue`` only in the client ``from_url`` opens. What
this module adds is types: a type checker reads api/aio.pyi instead, where every method whose
result the driver decides returns ``Awaitable[T]`` and hands out the other async classes. That stub
is generated from the facade's own annotations (``python -m rollout_queue.devtools.async_stub``;
tests/unit/test_typing.py fails when it is stale), so nothing here or there is written by hand
beyond these names. Never put a method here: it would be typed by the stub, not checked.
"""

from __future__ import annotations

from rollout_queue.api.fleet import FleetReserver
from rollout_queue.api.lease import Hold, Lease
from rollout_queue.api.queue import PartitionedQueue, RolloutQueue
from rollout_queue.api.worker import Worker


class AsyncRolloutQueue(RolloutQueue):
    """RolloutQueue whose ``from_url`` connects with redis.asyncio: ``await AsyncRolloutQueue.from_url(...)``."""

    asyncio = True


class AsyncPartitionedQueue(PartitionedQueue, AsyncRolloutQueue):
    """PartitionedQueue whose ``from_url`` connects with redis.asyncio."""


AsyncWorker = Worker
AsyncLease = Lease
AsyncHold = Hold
AsyncFleetReserver = FleetReserver
