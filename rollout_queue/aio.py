"""The asyncio client: the same flows as client.py, driven on redis.asyncio.

Mirror of client.py, one line per method: the flows (flows.py) and the scripts are shared, so no
transition is implemented twice. Create queues with ``await AsyncRolloutQueue.from_url(...)``.
"""

from __future__ import annotations

import time
from types import TracebackType
from typing import Any, Sequence

from . import flows
from .client import LeaseBase, default_process_id, redis_options
from .config import QueueConfig
from .flows import Flow, T
from .keys import QueueKeys
from .models import (
    DeadLetter,
    HeartbeatInfo,
    QueueStats,
    ReapReport,
    Receipt,
    Reservation,
    Sample,
    SourceGroup,
    check_receipt,
)
from .owned import OwnedAttempt, owned_attempts
from .protocol import CompletionOutcome, LeaseReply
from .cluster import connect_async
from .transport import AsyncClient, AsyncTransport, Durability, RetryPolicy


class AsyncRolloutQueue:
    """One queue on one Redis, for asyncio programs (mirrors RolloutQueue)."""

    def __init__(self, client: AsyncClient, name: str, *, retry: RetryPolicy | None = None,
                 clock: Any = time.monotonic, durability: Durability | None = None) -> None:
        """Use ``await AsyncRolloutQueue.open(client, name, config)`` or ``from_url``: opening needs I/O.
        ``durability``: as RolloutQueue's."""
        self.name = name
        self.keys = QueueKeys(name)
        self.client = client
        self.clock = clock
        self.transport = AsyncTransport(client, retry, clock=clock, durability=durability)
        self.config = QueueConfig()

    @classmethod
    async def open(cls, client: AsyncClient, name: str, config: QueueConfig | None = None, *,
                   retry: RetryPolicy | None = None, durability: Durability | None = None) -> "AsyncRolloutQueue":
        q = cls(client, name, retry=retry, durability=durability)
        q.config = await q.run(flows.open_queue(q.keys, config))
        return q

    @classmethod
    async def from_url(cls, url: str, name: str, config: QueueConfig | None = None, *,
                       retry: RetryPolicy | None = None, cluster: bool | None = None,
                       durability: Durability | None = None, **redis_kwargs: Any) -> "AsyncRolloutQueue":
        """As RolloutQueue.from_url (a ``redis+cluster://`` URL or ``cluster=True``: a Redis Cluster)."""
        return await cls.open(await connect_async(url, redis_options(redis_kwargs), cluster), name, config,
                              retry=retry, durability=durability)

    async def run(self, flow: Flow[T]) -> T:
        """Drive a flow to its result: the one driver loop of the async client."""
        reply: Any = None
        while True:
            try:
                op = flow.send(reply)
            except StopIteration as stop:
                return stop.value  # type: ignore[no-any-return]
            reply = await self.transport.execute(op)

    async def submit(self, groups: Sequence[SourceGroup]) -> list[str]:
        return await self.run(flows.submit(self.keys, groups, self.config.max_payload_bytes,
                                           self.config.max_executing_samples))

    async def publish_version(self, version: int, weights_uri: str | None = None) -> bool:
        return await self.run(flows.publish_version(self.keys, version, weights_uri))

    async def get_version(self) -> int:
        """The current policy version (a coroutine: properties cannot await)."""
        return await self.run(flows.version(self.keys))

    async def stats(self) -> QueueStats:
        return await self.run(flows.stats(self.keys))

    def worker(self, worker_id: str | None = None) -> "AsyncWorker":
        return AsyncWorker(self, default_process_id() if worker_id is None else worker_id)

    async def lease(self, groups: int, timeout_s: float | None = None, block_ms: int = 0, partial: bool = False,
                    trainer_id: str | None = None) -> "AsyncLease | None":
        got = await self.run(flows.lease(self.keys, trainer_id or default_process_id(), groups, partial, timeout_s,
                                         block_ms, self.clock))
        return None if got is None else AsyncLease(self, *got)

    async def hold(self, timeout_s: float | None = None) -> "AsyncHold":
        hold_id = flows.new_id()
        return AsyncHold(self, hold_id, await self.run(flows.hold_open(self.keys, hold_id, timeout_s)))

    async def checkpoint(self, step: int) -> int:
        return await self.run(flows.checkpoint(self.keys, step))

    async def restore(self, step: int) -> int:
        return await self.run(flows.restore(self.keys, step))

    async def reap(self, budget: int = flows.BATCH) -> ReapReport:
        return await self.run(flows.reap(self.keys, budget))

    async def dead_letters(self, count: int = 100, start: str = "-") -> list[DeadLetter]:
        return await self.run(flows.dead_letters(self.keys, count, start))

    async def requeue_dead_letter(self, dlq_id: str) -> str:
        return await self.run(flows.requeue_dead_letter(self.keys, dlq_id))

    async def close(self) -> None:
        await self.client.aclose()

    async def __aenter__(self) -> "AsyncRolloutQueue":
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


class AsyncWorker:
    """Mirror of Worker."""

    def __init__(self, queue: AsyncRolloutQueue, worker_id: str) -> None:
        self.queue, self.worker_id = queue, worker_id

    def _own(self, receipt: Receipt) -> Receipt:
        return check_receipt(receipt, self.worker_id)

    async def reserve(self, max_groups: int = 1, block_ms: int = 0, max_samples: int = 0,
                      overcommit: bool = False) -> list[Reservation]:
        return await self.queue.run(flows.reserve(self.queue.keys, self.worker_id, max_groups, max_samples,
                                                  block_ms, self.queue.clock, overcommit))

    async def complete(self, receipt: Receipt, samples: Sequence[Sample]) -> str:
        return await self.queue.run(flows.complete(self.queue.keys, self._own(receipt), samples,
                                                   self.queue.config.max_payload_bytes))

    async def complete_many(self, items: Sequence[tuple[Receipt, Sequence[Sample]]]) -> list[CompletionOutcome]:
        """As Worker.complete_many: refusals come back in their items' places, not raised."""
        return await self.queue.run(flows.complete_many(self.queue.keys, self.worker_id, items,
                                                        self.queue.config.max_payload_bytes))

    async def fail(self, receipt: Receipt, reason: str) -> str:
        return await self.queue.run(flows.fail(self.queue.keys, self._own(receipt), reason))

    async def abort(self, receipt: Receipt, reason: str = "aborted") -> str:
        return await self.queue.run(flows.abort(self.queue.keys, self._own(receipt), reason))

    async def filter(self, receipt: Receipt, reason: str) -> str:
        return await self.queue.run(flows.filter_group(self.queue.keys, self._own(receipt), reason))

    async def heartbeat(self) -> HeartbeatInfo:
        return await self.queue.run(flows.heartbeat(self.queue.keys, self.worker_id))

    async def owned(self, min_idle_ms: int = 0) -> list[OwnedAttempt]:
        """As Worker.owned: what the PEL gives this worker now (read-only)."""
        return await self.queue.run(owned_attempts(self.queue.keys, self.worker_id, min_idle_ms))

    async def close(self, terminal: str = "aborted", reason: str = "worker closed") -> tuple[int, int]:
        return await self.queue.run(flows.close_worker(self.queue.keys, self.worker_id, terminal, reason))


class AsyncLease(LeaseBase):
    """Mirror of Lease; ``async with`` commits on normal exit and rolls back on an exception."""

    def __init__(self, queue: AsyncRolloutQueue, reply: LeaseReply, token: str) -> None:
        super().__init__(reply, token)
        self.queue = queue

    async def commit(self, step: int | None = None) -> str:
        commit_id = await self.queue.run(flows.commit(self.queue.keys, self.lease_id, self.token, step))
        self.closed = "committed"
        return commit_id

    async def rollback(self) -> int:
        n = await self.queue.run(flows.rollback(self.queue.keys, self.lease_id, self.token))
        self.closed = "rolled_back"
        return n

    async def extend(self, seconds: float) -> int:
        self.deadline_ms = await self.queue.run(flows.extend(self.queue.keys, self.lease_id, self.token, seconds))
        return self.deadline_ms

    async def __aenter__(self) -> "AsyncLease":
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        if self.closed:
            return
        if exc_type is None:
            await self.commit()
        else:
            await self.rollback()


class AsyncHold:
    """Mirror of Hold."""

    def __init__(self, queue: AsyncRolloutQueue, hold_id: str, waiting: int) -> None:
        self.queue, self.hold_id, self.waiting = queue, hold_id, waiting

    async def wait_terminal(self, timeout_s: float) -> bool:
        return await self.queue.run(flows.hold_wait(self.queue.keys, self.hold_id, timeout_s, self.queue.clock))

    async def record_weight_update(self, version: int, weights_uri: str | None = None) -> bool:
        return await self.queue.run(flows.publish_version(self.queue.keys, version, weights_uri, self.hold_id))

    async def release(self) -> int:
        return await self.queue.run(flows.hold_release(self.queue.keys, self.hold_id))

    async def __aenter__(self) -> "AsyncHold":
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.release()
