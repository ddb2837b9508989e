"""PartitionedQueue: one logical queue over P partitions (``q#0 … q#P-1``), on a Redis or a Redis Cluster.

Thin by the same rule as client.py: each method runs one flow of partition_flows.py and returns its
value; aio_partitioned.py mirrors it one line per method. The only thing the driver adds to
client.py's is the ``Probe``: an op whose failure is thrown back into the flow, so a sweep skips a
partition on a dead node instead of failing the whole call.

Semantics in short (docs/SCALING.md has the reasoning):
- submit places a group by ``crc32(source_id) % P``; P = 1 is the plain queue ``q``, same keys;
- bounds are logical: each partition enforces a share and the shares sum to the bound; submit
  refuses a group larger than the smallest share of max_executing_samples (partitions.py rule 2);
- a worker reserves from the fullest partitions first, rotating among equals; its receipts name
  their partition (PartitionReceipt), so each settlement goes to the one partition that owns it;
- a lease of ``groups`` may combine partial leases of several partitions (MultiLease); commit
  fences every member, then commits them one by one: exactly once still holds per group, because
  each group belongs to exactly one member and each member commits atomically on its partition;
- publish_version, holds, checkpoint and restore reach every partition; stats are summed.
"""

from __future__ import annotations

import time
from types import TracebackType
from typing import Any, Sequence

from . import flows
from . import multi_lease as ml
from . import partition_flows as pf
from .client import LeaseBase, RolloutQueue, default_process_id, redis_options
from .cluster import connect
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
from .partitions import PROBE_RETRY, Layout, Probe, Selector, logical_config
from .transport import Durability, RetryPolicy, SyncClient, SyncTransport


class PartitionedQueue:
    """A logical queue of ``partitions`` partitions (DESIGN: Keys, last line)."""

    def __init__(self, client: SyncClient, name: str, partitions: int, config: QueueConfig | None = None, *,
                 retry: RetryPolicy | None = None, probe_retry: RetryPolicy = PROBE_RETRY,
                 clock: Any = time.monotonic, durability: Durability | None = None) -> None:
        """``durability``: as RolloutQueue's, on every partition (each WAITs on its own node)."""
        self.name, self.layout, self.client, self.clock = name, Layout(name, partitions), client, clock
        self.durability = durability
        self.transport = SyncTransport(client, retry, clock=clock, durability=durability)
        self.probe_transport = SyncTransport(client, probe_retry, clock=clock, durability=durability)
        self.selector = Selector(partitions)  # for leases, stats and reaps of this client
        #: each partition's stored config: its share of the logical bounds (partitions.split_config)
        self.configs: tuple[QueueConfig, ...] = self.run(pf.open_partitioned(self.layout, config))
        #: the logical config: the shares summed (equal to ``config`` when one was given)
        self.config = logical_config(self.configs)

    @classmethod
    def from_url(cls, url: str, name: str, partitions: int, config: QueueConfig | None = None, *,
                 retry: RetryPolicy | None = None, cluster: bool | None = None,
                 durability: Durability | None = None, **redis_kwargs: Any) -> "PartitionedQueue":
        """Connect (``redis+cluster://`` or ``cluster=True``: a Redis Cluster) and open the queue.
        Raises ConfigMismatch if the queue exists with another partition count or config."""
        return cls(connect(url, redis_options(redis_kwargs), cluster), name, partitions, config, retry=retry,
                   durability=durability)

    def run(self, flow: Flow[T]) -> T:
        """Drive a flow; a Probe's failure is thrown back into it (the flow decides)."""
        reply: Any = None
        error: OutcomeUnknown | None = None
        while True:
            try:
                op = flow.send(reply) if error is None else flow.throw(error)
            except StopIteration as stop:
                return stop.value  # type: ignore[no-any-return]
            reply, error = None, None
            if not isinstance(op, Probe):
                reply = self.transport.execute(op)
                continue
            try:
                reply = (self.probe_transport if op.fast else self.transport).execute(op.op)
            except OutcomeUnknown as exc:
                error = exc

    @property
    def partitions(self) -> tuple[str, ...]:
        """The partitions' queue names (``(name,)`` when there is one)."""
        return self.layout.names

    def partition_for(self, source_id: str) -> str:
        return self.layout.names[self.layout.of_source(source_id)]

    def partition(self, index: int) -> RolloutQueue:
        """One partition as a plain RolloutQueue on the same connection (inspection, dead letters)."""
        return RolloutQueue(self.client, self.layout.names[index], retry=self.transport.retry,
                            durability=self.durability)

    def submit(self, groups: Sequence[SourceGroup]) -> list[str]:
        """Backlog groups in their partitions. Raises GroupTooLarge (nothing sent) for a group with
        more samples than the smallest partition's share of max_executing_samples; PartitionsUnreachable
        if some partition is down (the rest are stored; resubmitting the same groups is idempotent)."""
        return self.run(pf.submit(self.layout, groups, self.configs))

    def publish_version(self, version: int, weights_uri: str | None = None) -> bool:
        return self.run(pf.publish_version(self.layout, version, weights_uri))

    @property
    def version(self) -> int:
        """The lowest partition's policy version (every partition has reached it)."""
        return self.run(pf.version(self.layout))

    def stats(self) -> QueueStats:
        """Summed over the partitions that answer (``counters['partitions_unreachable']``); the
        bounds in ``counters`` are the logical ones."""
        return self.run(pf.stats(self.layout, self.selector, self.clock, self.config))

    def partition_stats(self) -> dict[str, QueueStats | None]:
        """Each partition's stats (None: it did not answer); bounds in ``counters`` are its share."""
        return self.run(pf.partition_stats(self.layout, self.selector, self.clock))

    def worker(self, worker_id: str | None = None) -> "PartitionedWorker":
        return PartitionedWorker(self, default_process_id() if worker_id is None else worker_id)

    def lease(self, groups: int, timeout_s: float | None = None, block_ms: int = 0, partial: bool = False,
              trainer_id: str | None = None) -> "MultiLease | None":
        """Exactly ``groups`` fresh completed groups (>= 1 when partial) from one or more partitions."""
        members = self.run(ml.lease(self.layout, self.selector, trainer_id or default_process_id(), groups,
                                    partial, timeout_s, block_ms, self.clock))
        return None if members is None else MultiLease(self, members, timeout_s or self.config.lease_timeout_s)

    def hold(self, timeout_s: float | None = None) -> "MultiHold":
        """Close admission on every partition (all or nothing)."""
        hold_id = flows.new_id()
        return MultiHold(self, hold_id, self.run(pf.hold_open(self.layout, hold_id, timeout_s)))

    def checkpoint(self, step: int) -> int:
        return self.run(pf.checkpoint(self.layout, step))

    def restore(self, step: int) -> int:
        return self.run(pf.restore(self.layout, step))

    def reap(self, budget: int = flows.BATCH) -> ReapReport:
        """One reaper pass over every partition that answers."""
        return self.run(pf.reap(self.layout, self.selector, budget, self.clock))

    def dead_letters(self, count: int = 100) -> list[tuple[str, DeadLetter]]:
        """(partition, dead letter) for up to ``count`` oldest dead letters of each partition."""
        return self.run(pf.dead_letters(self.layout, count))

    def close(self) -> None:
        self.client.close()

    def __enter__(self) -> "PartitionedQueue":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class PartitionedWorker:
    """A worker over every partition. Its receipts are PartitionReceipts; settle them unchanged."""

    def __init__(self, queue: PartitionedQueue, worker_id: str, selector: Selector | None = None) -> None:
        self.queue, self.worker_id = queue, worker_id
        self.selector = selector or Selector(queue.layout.count)

    def _keys(self, receipt: Receipt) -> Any:
        return self.queue.layout.keys[self.queue.layout.index(check_receipt(receipt, self.worker_id))]

    def reserve(self, max_groups: int = 1, block_ms: int = 0, max_samples: int = 0,
                overcommit: bool = False) -> list[Reservation]:
        return self.queue.run(pf.reserve(self.queue.layout, self.selector, self.worker_id, max_groups, max_samples,
                                         block_ms, self.queue.clock, overcommit))

    def complete(self, receipt: Receipt, samples: Sequence[Sample]) -> str:
        return self.queue.run(flows.complete(self._keys(receipt), receipt, samples,
                                             self.queue.config.max_payload_bytes))

    def fail(self, receipt: Receipt, reason: str) -> str:
        return self.queue.run(flows.fail(self._keys(receipt), receipt, reason))

    def abort(self, receipt: Receipt, reason: str = "aborted") -> str:
        return self.queue.run(flows.abort(self._keys(receipt), receipt, reason))

    def filter(self, receipt: Receipt, reason: str) -> str:
        return self.queue.run(flows.filter_group(self._keys(receipt), receipt, reason))

    def heartbeat(self) -> HeartbeatInfo:
        """Heartbeat every partition that answers; the newest version any of them announces."""
        return self.queue.run(pf.heartbeat(self.queue.layout, self.selector, self.worker_id, self.queue.clock))

    def close(self, terminal: str = "aborted", reason: str = "worker closed") -> tuple[int, int]:
        """Requeue all owned work on every partition and deregister. Returns (requeued, dead-lettered)."""
        return self.queue.run(pf.close_worker(self.queue.layout, self.worker_id, terminal, reason))


class MultiLeaseBase:
    """The groups of one or more partition leases, handed to one trainer as one batch."""

    def __init__(self, layout: Layout, members: Sequence[ml.Member], fence_s: float) -> None:
        self.parts = [LeaseBase(reply, token) for _, reply, token in members]
        self.partitions = [layout.names[i] for i, _, _ in members]
        self.members = [(layout.keys[i], reply.lease_id, token) for i, reply, token in members]
        self.lease_id = ",".join(f"{name}/{part.lease_id}" for name, part in zip(self.partitions, self.parts))
        self.groups = [g for part in self.parts for g in part.groups]
        #: the partition of each group, in the order of ``groups`` (entry IDs repeat across partitions)
        self.group_partitions = [name for name, part in zip(self.partitions, self.parts) for _ in part.groups]
        self.version = max(part.version for part in self.parts)
        self.deadline_ms = min(part.deadline_ms for part in self.parts)
        self.fence_s = fence_s
        self.committed: dict[int, str] = {}  # member index -> commit id, kept across a failed commit()
        self.closed: str | None = None

    @property
    def staleness(self) -> tuple[int, float]:
        """(max, mean) over the groups, each against its own partition's version at lease time."""
        values = [max(0, part.version - g.min_version) for part in self.parts for g in part.groups]
        return max(values), sum(values) / len(values)

    def __len__(self) -> int:
        return len(self.groups)

    def __repr__(self) -> str:
        return f"<MultiLease {self.lease_id} groups={len(self.groups)} closed={self.closed}>"


class MultiLease(MultiLeaseBase):
    """A composite lease: commit/rollback/extend act on every member lease (see multi_lease.commit)."""

    def __init__(self, queue: PartitionedQueue, members: Sequence[ml.Member], fence_s: float) -> None:
        super().__init__(queue.layout, members, fence_s)
        self.queue = queue

    def commit(self, step: int | None = None) -> list[str]:
        """Fence every member, then commit each. Raises LeaseLost (nothing committed) if one is lost;
        after OutcomeUnknown, call commit() again: committed members are skipped or replayed."""
        ids = self.queue.run(ml.commit(self.members, self.committed, step, self.fence_s))
        self.closed = "committed"
        return ids

    def rollback(self) -> int:
        n = self.queue.run(ml.rollback(self.members, self.committed))
        self.closed = "rolled_back"
        return n

    def extend(self, seconds: float) -> int:
        self.deadline_ms = self.queue.run(ml.extend(self.members, self.committed, seconds))
        return self.deadline_ms

    def __enter__(self) -> "MultiLease":
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        if self.closed:
            return
        if exc_type is None:
            self.commit()
        else:
            self.rollback()


class MultiHold:
    """An admission hold on every partition."""

    def __init__(self, queue: PartitionedQueue, hold_id: str, waiting: int) -> None:
        self.queue, self.hold_id, self.waiting = queue, hold_id, waiting

    def wait_terminal(self, timeout_s: float) -> bool:
        return self.queue.run(pf.hold_wait(self.queue.layout, self.hold_id, timeout_s, self.queue.clock))

    def record_weight_update(self, version: int, weights_uri: str | None = None) -> bool:
        return self.queue.run(pf.publish_version(self.queue.layout, version, weights_uri, self.hold_id))

    def release(self) -> int:
        return self.queue.run(pf.hold_release(self.queue.layout, self.hold_id))

    def __enter__(self) -> "MultiHold":
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()

