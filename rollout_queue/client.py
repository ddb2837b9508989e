"""The synchronous client: RolloutQueue, Worker, Lease and Hold over redis-py.

Thin by rule: each public method runs one flow (flows.py) through the transport and returns its
value. No transition logic lives here; if a method needs an ``if`` about queue semantics, that ``if``
belongs in flows.py or a script. ``aio.py`` mirrors this module one line per method.
"""

from __future__ import annotations

import os
import secrets
import socket
import time
from types import TracebackType
from typing import Any, Sequence

from redis.backoff import NoBackoff
from redis.retry import Retry

from . import flows
from .config import QueueConfig
from .flows import Flow, T
from .keys import QueueKeys
from .models import (
    CompletedGroup,
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
from .cluster import connect
from .transport import Durability, RetryPolicy, SyncClient, SyncTransport


def default_process_id() -> str:
    """host:pid:nonce, unique per process start (the nonce keeps a restarted pid distinct)."""
    return f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(3)}"


def redis_options(options: dict[str, Any]) -> dict[str, Any]:
    """Connection defaults: no silent retries inside redis-py (the transport decides what is safe to
    resend), and a socket timeout above the longest blocking wait."""
    return {"retry": Retry(NoBackoff(), 0), "socket_timeout": 10.0, "socket_connect_timeout": 5.0, **options}


class LeaseBase:
    """What a lease holds: its groups, deadline and staleness (shared by the sync and async leases)."""

    def __init__(self, reply: LeaseReply, token: str) -> None:
        self.lease_id: str = reply.lease_id
        self.token = token
        self.deadline_ms: int = reply.deadline_ms
        self.version: int = reply.version
        self.groups: list[CompletedGroup] = list(reply.groups)
        self.closed: str | None = None

    @property
    def staleness(self) -> tuple[int, float]:
        """(max, mean) of policy version at lease time minus each group's oldest sample version."""
        values = [max(0, self.version - g.min_version) for g in self.groups]
        return max(values), sum(values) / len(values)

    def __len__(self) -> int:
        return len(self.groups)

    def __repr__(self) -> str:
        return f"<Lease {self.lease_id} groups={len(self.groups)} version={self.version} closed={self.closed}>"


class RolloutQueue:
    """One queue on one Redis (DESIGN: Public API)."""

    def __init__(self, client: SyncClient, name: str, config: QueueConfig | None = None, *,
                 retry: RetryPolicy | None = None, clock: Any = time.monotonic,
                 durability: Durability | None = None) -> None:
        """``durability``: answer state-changing calls only once that many replicas have them
        (transport.Durability; docs/OPERATIONS.md, "Replicas and failover")."""
        self.name = name
        self.keys = QueueKeys(name)
        self.client = client
        self.clock = clock
        self.transport = SyncTransport(client, retry, clock=clock, durability=durability)
        self.config: QueueConfig = self.run(flows.open_queue(self.keys, config))

    @classmethod
    def from_url(cls, url: str, name: str, config: QueueConfig | None = None, *,
                 retry: RetryPolicy | None = None, cluster: bool | None = None,
                 durability: Durability | None = None, **redis_kwargs: Any) -> "RolloutQueue":
        """Connect and open (or create) queue ``name``. ``config=None`` adopts the stored config.
        A ``redis+cluster://`` URL (or ``cluster=True``) connects to a Redis Cluster (cluster.py).
        ``durability=Durability(replicas=N, timeout_ms=T)``: durable mode (see __init__).
        Raises ConfigMismatch if ``config`` differs from the stored one."""
        return cls(connect(url, redis_options(redis_kwargs), cluster), name, config, retry=retry,
                   durability=durability)

    def run(self, flow: Flow[T]) -> T:
        """Drive a flow to its result: the one driver loop of the sync client."""
        reply: Any = None
        while True:
            try:
                op = flow.send(reply)
            except StopIteration as stop:
                return stop.value  # type: ignore[no-any-return]
            reply = self.transport.execute(op)

    def submit(self, groups: Sequence[SourceGroup]) -> list[str]:
        """Backlog source groups; returns their entry IDs (a known source_id returns its existing ID).
        Raises GroupTooLarge (nothing sent) for a group with n > max_executing_samples."""
        return self.run(flows.submit(self.keys, groups, self.config.max_payload_bytes,
                                     self.config.max_executing_samples))

    def publish_version(self, version: int, weights_uri: str | None = None) -> bool:
        """Record policy version ``version``; False if it was already the current one (a replay)."""
        return self.run(flows.publish_version(self.keys, version, weights_uri))

    @property
    def version(self) -> int:
        """The current policy version (0 before the first publish)."""
        return self.run(flows.version(self.keys))

    def stats(self) -> QueueStats:
        return self.run(flows.stats(self.keys))

    def worker(self, worker_id: str | None = None) -> "Worker":
        return Worker(self, default_process_id() if worker_id is None else worker_id)

    def lease(self, groups: int, timeout_s: float | None = None, block_ms: int = 0, partial: bool = False,
              trainer_id: str | None = None) -> "Lease | None":
        """Lease exactly ``groups`` fresh completed groups (>= 1 when ``partial``), or None."""
        got = self.run(flows.lease(self.keys, trainer_id or default_process_id(), groups, partial, timeout_s,
                                   block_ms, self.clock))
        return None if got is None else Lease(self, *got)

    def hold(self, timeout_s: float | None = None) -> "Hold":
        """Close admission (no new reservations or leases) until the hold is released or expires."""
        hold_id = flows.new_id()
        return Hold(self, hold_id, self.run(flows.hold_open(self.keys, hold_id, timeout_s)))

    def checkpoint(self, step: int) -> int:
        """A model checkpoint covers ``step``: drop the data committed at or before it."""
        return self.run(flows.checkpoint(self.keys, step))

    def restore(self, step: int) -> int:
        """The trainer resumed from checkpoint ``step``: requeue every group committed after it."""
        return self.run(flows.restore(self.keys, step))

    def reap(self, budget: int = flows.BATCH) -> ReapReport:
        """One reaper pass (safe to run from several processes at once)."""
        return self.run(flows.reap(self.keys, budget))

    def dead_letters(self, count: int = 100, start: str = "-") -> list[DeadLetter]:
        return self.run(flows.dead_letters(self.keys, count, start))

    def requeue_dead_letter(self, dlq_id: str) -> str:
        """Submit a dead letter's pristine group again; returns its new entry ID."""
        return self.run(flows.requeue_dead_letter(self.keys, dlq_id))

    def close(self) -> None:
        self.client.close()

    def __enter__(self) -> "RolloutQueue":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class Worker:
    """A generation worker's handle: reserve, then settle each receipt exactly once."""

    def __init__(self, queue: RolloutQueue, worker_id: str) -> None:
        self.queue, self.worker_id = queue, worker_id

    def _own(self, receipt: Receipt) -> Receipt:
        return check_receipt(receipt, self.worker_id)

    def reserve(self, max_groups: int = 1, block_ms: int = 0, max_samples: int = 0,
                overcommit: bool = False) -> list[Reservation]:
        """Up to ``max_groups`` groups and ``max_samples`` samples (0: no cap of the caller's own).
        ``overcommit``: this caller queues samples internally, so the oldest group larger than
        ``max_samples`` may be its first grant; without it such a group is left for another caller."""
        return self.queue.run(flows.reserve(self.queue.keys, self.worker_id, max_groups, max_samples, block_ms,
                                            self.queue.clock, overcommit))

    def complete(self, receipt: Receipt, samples: Sequence[Sample]) -> str:
        return self.queue.run(flows.complete(self.queue.keys, self._own(receipt), samples,
                                             self.queue.config.max_payload_bytes))

    def complete_many(self, items: Sequence[tuple[Receipt, Sequence[Sample]]]) -> list[CompletionOutcome]:
        """Complete several attempts in one script call per chunk, each settled as ``complete`` would.

        Returns one outcome per item: 'buffered' / 'replay' / 'evicted_self', or the item's refusal as
        an exception instance (StaleReceipt, PayloadTooLarge, MalformedCompletion), not raised: the
        other items are settled either way. Safe to repeat after OutcomeUnknown (settled items replay).
        Raises InvalidInput, before anything is sent, for a receipt of another worker."""
        return self.queue.run(flows.complete_many(self.queue.keys, self.worker_id, items,
                                                  self.queue.config.max_payload_bytes))

    def fail(self, receipt: Receipt, reason: str) -> str:
        return self.queue.run(flows.fail(self.queue.keys, self._own(receipt), reason))

    def abort(self, receipt: Receipt, reason: str = "aborted") -> str:
        return self.queue.run(flows.abort(self.queue.keys, self._own(receipt), reason))

    def filter(self, receipt: Receipt, reason: str) -> str:
        return self.queue.run(flows.filter_group(self.queue.keys, self._own(receipt), reason))

    def heartbeat(self) -> HeartbeatInfo:
        return self.queue.run(flows.heartbeat(self.queue.keys, self.worker_id))

    def owned(self, min_idle_ms: int = 0) -> list[OwnedAttempt]:
        """What the PEL gives this worker now (read-only): each entry's exact receipt and ms since its
        delivery, oldest entry first. An attempt listed here that you do not hold is orphaned (its
        settlement was lost in a server crash, or a reserve reply never arrived): hand it back with
        ``abort(receipt)``, which refuses (StaleReceipt) if it moved meanwhile."""
        return self.queue.run(owned_attempts(self.queue.keys, self.worker_id, min_idle_ms))

    def close(self, terminal: str = "aborted", reason: str = "worker closed") -> tuple[int, int]:
        """Requeue all owned work (terminal 'aborted', or 'lost' after a fatal engine error) and
        deregister. Returns (requeued, dead-lettered)."""
        return self.queue.run(flows.close_worker(self.queue.keys, self.worker_id, terminal, reason))


class Lease(LeaseBase):
    """Completed groups handed to one trainer until commit, rollback or the deadline."""

    def __init__(self, queue: RolloutQueue, reply: LeaseReply, token: str) -> None:
        super().__init__(reply, token)
        self.queue = queue

    def commit(self, step: int | None = None) -> str:
        """The groups were trained: settle them committed. Raises LeaseLost if the lease is gone."""
        commit_id = self.queue.run(flows.commit(self.queue.keys, self.lease_id, self.token, step))
        self.closed = "committed"
        return commit_id

    def rollback(self) -> int:
        """The groups were not trained: requeue them (not counted toward max_attempts)."""
        n = self.queue.run(flows.rollback(self.queue.keys, self.lease_id, self.token))
        self.closed = "rolled_back"
        return n

    def extend(self, seconds: float) -> int:
        self.deadline_ms = self.queue.run(flows.extend(self.queue.keys, self.lease_id, self.token, seconds))
        return self.deadline_ms

    def __enter__(self) -> "Lease":
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        if self.closed:
            return
        if exc_type is None:
            self.commit()
        else:
            self.rollback()


class Hold:
    """An admission hold around a weight update (DESIGN: Weight updates and admission holds)."""

    def __init__(self, queue: RolloutQueue, hold_id: str, waiting: int) -> None:
        self.queue, self.hold_id, self.waiting = queue, hold_id, waiting

    def wait_terminal(self, timeout_s: float) -> bool:
        """True once every attempt executing when the hold opened is terminal; False on timeout."""
        return self.queue.run(flows.hold_wait(self.queue.keys, self.hold_id, timeout_s, self.queue.clock))

    def record_weight_update(self, version: int, weights_uri: str | None = None) -> bool:
        return self.queue.run(flows.publish_version(self.queue.keys, version, weights_uri, self.hold_id))

    def release(self) -> int:
        """Remove this hold; admission reopens when no hold is left. Returns the holds still active."""
        return self.queue.run(flows.hold_release(self.queue.keys, self.hold_id))

    def __enter__(self) -> "Hold":
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()
