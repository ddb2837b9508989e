"""AsyncPartitionedQueue: partitioned.py for asyncio programs, one line per method.

The flows (partition_flows.py) and the scripts are shared with the sync client; only the driver
awaits. Create it with ``await AsyncPartitionedQueue.from_url(...)``.
"""

from __future__ import annotations

import time
from types import TracebackType
from typing import Any, Sequence

from . import flows
from . import multi_lease as ml
from . import partition_flows as pf
from .aio import AsyncRolloutQueue
from .client import default_process_id, redis_options
from .cluster import connect_async
from .config import QueueConfig
from .errors import OutcomeUnknown
from .flows import Flow, T
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
from .partitioned import MultiLeaseBase
from .partitions import PROBE_RETRY, Layout, Probe, Selector, logical_config
from .transport import AsyncClient, AsyncTransport, Durability, RetryPolicy


class AsyncPartitionedQueue:
    """Mirror of PartitionedQueue."""

    def __init__(self, client: AsyncClient, name: str, partitions: int, *, retry: RetryPolicy | None = None,
                 probe_retry: RetryPolicy = PROBE_RETRY, clock: Any = time.monotonic,
                 durability: Durability | None = None) -> None:
        """Use ``await AsyncPartitionedQueue.open(...)`` or ``from_url``: opening needs I/O."""
        self.name, self.layout, self.client, self.clock = name, Layout(name, partitions), client, clock
        self.durability = durability
        self.transport = AsyncTransport(client, retry, clock=clock, durability=durability)
        self.probe_transport = AsyncTransport(client, probe_retry, clock=clock, durability=durability)
        self.selector = Selector(partitions)
        self.configs: tuple[QueueConfig, ...] = ()
        self.config = QueueConfig()

    @classmethod
    async def open(cls, client: AsyncClient, name: str, partitions: int, config: QueueConfig | None = None, *,
                   retry: RetryPolicy | None = None, durability: Durability | None = None
                   ) -> "AsyncPartitionedQueue":
        q = cls(client, name, partitions, retry=retry, durability=durability)
        q.configs = await q.run(pf.open_partitioned(q.layout, config))
        q.config = logical_config(q.configs)
        return q

    @classmethod
    async def from_url(cls, url: str, name: str, partitions: int, config: QueueConfig | None = None, *,
                       retry: RetryPolicy | None = None, cluster: bool | None = None,
                       durability: Durability | None = None, **redis_kwargs: Any) -> "AsyncPartitionedQueue":
        return await cls.open(await connect_async(url, redis_options(redis_kwargs), cluster), name, partitions,
                              config, retry=retry, durability=durability)

    async def run(self, flow: Flow[T]) -> T:
        """As PartitionedQueue.run."""
        reply: Any = None
        error: OutcomeUnknown | None = None
        while True:
            try:
                op = flow.send(reply) if error is None else flow.throw(error)
            except StopIteration as stop:
                return stop.value  # type: ignore[no-any-return]
            reply, error = None, None
            if not isinstance(op, Probe):
                reply = await self.transport.execute(op)
                continue
            try:
                reply = await (self.probe_transport if op.fast else self.transport).execute(op.op)
            except OutcomeUnknown as exc:
                error = exc

    @property
    def partitions(self) -> tuple[str, ...]:
        return self.layout.names

    def partition_for(self, source_id: str) -> str:
        return self.layout.names[self.layout.of_source(source_id)]

    async def partition(self, index: int) -> AsyncRolloutQueue:
        return await AsyncRolloutQueue.open(self.client, self.layout.names[index], retry=self.transport.retry,
                                            durability=self.durability)

    async def submit(self, groups: Sequence[SourceGroup]) -> list[str]:
        return await self.run(pf.submit(self.layout, groups, self.configs))

    async def publish_version(self, version: int, weights_uri: str | None = None) -> bool:
        return await self.run(pf.publish_version(self.layout, version, weights_uri))

    async def get_version(self) -> int:
        return await self.run(pf.version(self.layout))

    async def stats(self) -> QueueStats:
        return await self.run(pf.stats(self.layout, self.selector, self.clock, self.config))

    async def partition_stats(self) -> dict[str, QueueStats | None]:
        return await self.run(pf.partition_stats(self.layout, self.selector, self.clock))

    def worker(self, worker_id: str | None = None) -> "AsyncPartitionedWorker":
        return AsyncPartitionedWorker(self, default_process_id() if worker_id is None else worker_id)

    async def lease(self, groups: int, timeout_s: float | None = None, block_ms: int = 0, partial: bool = False,
                    trainer_id: str | None = None) -> "AsyncMultiLease | None":
        members = await self.run(ml.lease(self.layout, self.selector, trainer_id or default_process_id(), groups,
                                          partial, timeout_s, block_ms, self.clock))
        return None if members is None else AsyncMultiLease(self, members, timeout_s or self.config.lease_timeout_s)

    async def hold(self, timeout_s: float | None = None) -> "AsyncMultiHold":
        hold_id = flows.new_id()
        return AsyncMultiHold(self, hold_id, await self.run(pf.hold_open(self.layout, hold_id, timeout_s)))

    async def checkpoint(self, step: int) -> int:
        return await self.run(pf.checkpoint(self.layout, step))

    async def restore(self, step: int) -> int:
        return await self.run(pf.restore(self.layout, step))

    async def reap(self, budget: int = flows.BATCH) -> ReapReport:
        return await self.run(pf.reap(self.layout, self.selector, budget, self.clock))

    async def dead_letters(self, count: int = 100) -> list[tuple[str, DeadLetter]]:
        return await self.run(pf.dead_letters(self.layout, count))

    async def close(self) -> None:
        await self.client.aclose()

    async def __aenter__(self) -> "AsyncPartitionedQueue":
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


class AsyncPartitionedWorker:
    """Mirror of PartitionedWorker."""

    def __init__(self, queue: AsyncPartitionedQueue, worker_id: str, selector: Selector | None = None) -> None:
        self.queue, self.worker_id = queue, worker_id
        self.selector = selector or Selector(queue.layout.count)

    def _keys(self, receipt: Receipt) -> Any:
        return self.queue.layout.keys[self.queue.layout.index(check_receipt(receipt, self.worker_id))]

    async def reserve(self, max_groups: int = 1, block_ms: int = 0, max_samples: int = 0,
                      overcommit: bool = False) -> list[Reservation]:
        return await self.queue.run(pf.reserve(self.queue.layout, self.selector, self.worker_id, max_groups,
                                               max_samples, block_ms, self.queue.clock, overcommit))

    async def complete(self, receipt: Receipt, samples: Sequence[Sample]) -> str:
        return await self.queue.run(flows.complete(self._keys(receipt), receipt, samples,
                                                   self.queue.config.max_payload_bytes))

    async def fail(self, receipt: Receipt, reason: str) -> str:
        return await self.queue.run(flows.fail(self._keys(receipt), receipt, reason))

    async def abort(self, receipt: Receipt, reason: str = "aborted") -> str:
        return await self.queue.run(flows.abort(self._keys(receipt), receipt, reason))

    async def filter(self, receipt: Receipt, reason: str) -> str:
        return await self.queue.run(flows.filter_group(self._keys(receipt), receipt, reason))

    async def heartbeat(self) -> HeartbeatInfo:
        return await self.queue.run(pf.heartbeat(self.queue.layout, self.selector, self.worker_id, self.queue.clock))

    async def close(self, terminal: str = "aborted", reason: str = "worker closed") -> tuple[int, int]:
        return await self.queue.run(pf.close_worker(self.queue.layout, self.worker_id, terminal, reason))


class AsyncMultiLease(MultiLeaseBase):
    """Mirror of MultiLease."""

    def __init__(self, queue: AsyncPartitionedQueue, members: Sequence[ml.Member], fence_s: float) -> None:
        super().__init__(queue.layout, members, fence_s)
        self.queue = queue

    async def commit(self, step: int | None = None) -> list[str]:
        ids = await self.queue.run(ml.commit(self.members, self.committed, step, self.fence_s))
        self.closed = "committed"
        return ids

    async def rollback(self) -> int:
        n = await self.queue.run(ml.rollback(self.members, self.committed))
        self.closed = "rolled_back"
        return n

    async def extend(self, seconds: float) -> int:
        self.deadline_ms = await self.queue.run(ml.extend(self.members, self.committed, seconds))
        return self.deadline_ms

    async def __aenter__(self) -> "AsyncMultiLease":
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        if self.closed:
            return
        if exc_type is None:
            await self.commit()
        else:
            await self.rollback()


class AsyncMultiHold:
    """Mirror of MultiHold."""

    def __init__(self, queue: AsyncPartitionedQueue, hold_id: str, waiting: int) -> None:
        self.queue, self.hold_id, self.waiting = queue, hold_id, waiting

    async def wait_terminal(self, timeout_s: float) -> bool:
        return await self.queue.run(pf.hold_wait(self.queue.layout, self.hold_id, timeout_s, self.queue.clock))

    async def record_weight_update(self, version: int, weights_uri: str | None = None) -> bool:
        return await self.queue.run(pf.publish_version(self.queue.layout, version, weights_uri, self.hold_id))

    async def release(self) -> int:
        return await self.queue.run(pf.hold_release(self.queue.layout, self.hold_id))

    async def __aenter__(self) -> "AsyncMultiHold":
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.release()
