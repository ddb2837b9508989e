"""RolloutQueue: one logical queue, for sync or asyncio code, on one Redis or as P partitions.

Thin by rule: each method builds one flow (scale/flows.py, which is core/flows/ itself when the
queue has one partition) and hands it to the driver; no method has an ``if`` about queue semantics
or about sync versus async. The driver comes from the client: ``redis.Redis`` / ``RedisCluster``
give a sync queue whose methods return values, ``redis.asyncio`` clients an asyncio queue whose
methods return awaitables of the same values (``Result[T]``).

Open a queue with ``RolloutQueue.from_url(url, name, config)`` (sync) or
``await AsyncRolloutQueue.from_url(url, name, config)`` (api/aio.py, whose types api/aio.pyi
generates from this file); ``partitions=P`` (or PartitionedQueue) spreads it over P partitions,
one per hash tag, for a Redis Cluster (docs/SCALING.md).
"""

from __future__ import annotations

import os
import secrets
import socket
import time
from typing import Any, Awaitable, Callable, ClassVar, Sequence, TypeVar, cast

from rollout_queue.api.beat import LeaseBeat, beat_lease
from rollout_queue.api.lease import Hold, Lease
from rollout_queue.api.results import Result
from rollout_queue.api.worker import Worker
from rollout_queue.core import flows
from rollout_queue.core.config import QueueConfig
from rollout_queue.core.errors import InvalidInput, LeaseLost
from rollout_queue.core.flows import Flow
from rollout_queue.core.keys import QueueKeys
from rollout_queue.core.liveness import FleetWatch
from rollout_queue.core.models import DeadLetter, PushSeal, QueueStats, ReapReport, SourceGroup
from rollout_queue.core.policy import Durability, RetryPolicy
from rollout_queue.drivers.cluster import connect, redis_options
from rollout_queue.drivers.transport import Driver, SyncClient, driver_for
from rollout_queue.scale import flows as pf
from rollout_queue.scale import multi_lease as ml
from rollout_queue.scale.layout import Layout, Selector, logical_config

T = TypeVar("T")
Q = TypeVar("Q", bound="RolloutQueue")


def default_process_id() -> str:
    """host:pid:nonce, unique per process start (the nonce keeps a restarted pid distinct)."""
    return f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(3)}"


class RolloutQueue:
    """One queue (DESIGN.md: Public API): submit, publish versions, lease, hold, checkpoint, reap.

    ``RolloutQueue(client, name, config)`` opens (or creates) the queue on a sync client at once;
    ``RolloutQueue.open(...)`` does the same (``await AsyncRolloutQueue.open(...)`` on an asyncio client).
    ``config=None`` adopts the stored config; a different one raises ConfigMismatch.
    ``durability``: answer state-changing calls only once that many replicas have them
    (core/policy.py Durability; docs/OPERATIONS.md, "Replicas and failover").
    """

    #: whether ``from_url`` connects with redis.asyncio (AsyncRolloutQueue)
    asyncio: ClassVar[bool] = False

    name: str
    layout: Layout
    driver: Driver
    clock: Callable[[], float]
    selector: Selector
    fleet: FleetWatch
    beats: LeaseBeat
    configs: tuple[QueueConfig, ...]
    config: QueueConfig

    def __init__(self, client: SyncClient, name: str, config: QueueConfig | None = None, *, partitions: int = 1,
                 retry: RetryPolicy | None = None, clock: Callable[[], float] = time.monotonic,
                 durability: Durability | None = None, create: bool = True) -> None:
        self._bind(driver_for(client, retry, clock=clock, durability=durability), name, partitions)
        if self.driver.is_async:
            raise InvalidInput("this is an asyncio client: open the queue with "
                               "`await AsyncRolloutQueue.open(client, name, config)`")
        self.run(self._open(config, create))

    def _bind(self, driver: Driver, name: str, partitions: int) -> None:
        self.name, self.layout, self.driver, self.clock = name, Layout(name, partitions), driver, driver.clock
        self.selector = Selector(partitions)  # which partitions leases, stats and reaps of this client try first
        #: whether the generation side is gone, as this client's blocking leases saw it (core/liveness.py)
        self.fleet = FleetWatch()
        #: this client's open leases, beaten while they are open (api/beat.py)
        self.beats = LeaseBeat(self)

    def _open(self: Q, config: QueueConfig | None, create: bool) -> Flow[Q]:
        self.configs = yield from pf.open_partitioned(self.layout, config, create)
        self.config = self.configs[0] if self.layout.count == 1 else logical_config(self.configs)
        return self

    @classmethod
    def open(cls: type[Q], client: SyncClient, name: str, config: QueueConfig | None = None, *, partitions: int = 1,
             retry: RetryPolicy | None = None, clock: Callable[[], float] = time.monotonic,
             durability: Durability | None = None, create: bool = True) -> Result[Q]:
        """Open (or create) queue ``name`` on ``client`` (sync or asyncio). ``create=False``: raise
        QueueNotFound rather than create a missing queue (what a worker, producer or reaper wants)."""
        return cls._open_on(client, name, config, partitions, retry, clock, durability, create)

    @classmethod
    def _open_on(cls: type[Q], client: Any, name: str, config: QueueConfig | None, partitions: int,
                 retry: RetryPolicy | None, clock: Callable[[], float], durability: Durability | None,
                 create: bool) -> Result[Q]:
        q = cls.__new__(cls)
        q._bind(driver_for(client, retry, clock=clock, durability=durability), name, partitions)
        return q.run(q._open(config, create))

    @classmethod
    def from_url(cls: type[Q], url: str, name: str, config: QueueConfig | None = None, *, partitions: int = 1,
                 retry: RetryPolicy | None = None, cluster: bool | None = None,
                 durability: Durability | None = None, create: bool = True, **redis_kwargs: Any) -> Result[Q]:
        """Connect and open (or create) queue ``name``. A ``redis+cluster://`` URL (or ``cluster=True``)
        connects to a Redis Cluster (drivers/cluster.py); ``partitions`` spreads the queue over its nodes.
        Raises ConfigMismatch if ``config`` (or the partition count) differs from the stored one."""
        client = connect(url, redis_options(redis_kwargs, asyncio=cls.asyncio), cluster, asyncio=cls.asyncio)
        # A failed open (QueueNotFound, ConfigMismatch, ...) closes the connection it made: a worker
        # that asks again every second for a queue not created yet must not keep one per try.
        if cls.asyncio:
            opening = cast(Awaitable[Q], cls._open_on(client, name, config, partitions, retry, time.monotonic,
                                                      durability, create))
            return cast(Q, _closed_on_failure(opening, client))  # Awaitable[Q]: the asyncio surface (api/aio.pyi)
        try:
            return cls._open_on(client, name, config, partitions, retry, time.monotonic, durability, create)
        except BaseException:
            client.close()
            raise

    def run(self, flow: Flow[T]) -> Result[T]:
        """Drive any flow (core/flows/, ops/views.py, ...) on this queue's driver."""
        result: T = self.driver.run(flow)  # an awaitable of it on an asyncio driver (api/results.py)
        return result

    @property
    def client(self) -> Any:
        """The redis-py client the driver sends on."""
        return self.driver.client

    # -- the queue's own partitions ------------------------------------------------------------

    @property
    def keys(self) -> QueueKeys:
        """The Redis keys of a one-partition queue (a partitioned one has ``layout.keys[i]``)."""
        if self.layout.count != 1:
            raise InvalidInput(f"{self.name!r} has {self.layout.count} partitions, each with its own keys: "
                               "use queue.layout.keys[i] (or queue.partition(i).keys)")
        return self.layout.keys[0]

    @property
    def partitions(self) -> tuple[str, ...]:
        """The partitions' queue names (``(name,)`` for a queue of one partition)."""
        return self.layout.names

    def partition_for(self, source_id: str) -> str:
        """The partition that holds (or will hold) the group ``source_id``."""
        return self.layout.names[self.layout.of_source(source_id)]

    def partition(self: Q, index: int) -> Q:
        """Partition ``index`` as a queue of its own on the same driver (inspection, dead letters)."""
        part = type(self).__new__(type(self))
        part._bind(self.driver, self.layout.names[index], 1)
        part.configs = (self.configs[index],)
        part.config = self.configs[index]
        return part

    # -- operations ----------------------------------------------------------------------------

    def submit(self, groups: Sequence[SourceGroup]) -> Result[list[str]]:
        """Backlog source groups; returns their entry IDs (a known source_id returns its existing ID).
        Raises GroupTooLarge (nothing sent) for a group no partition can ever execute, and
        PartitionsUnreachable if a partition is down (the rest are stored; resubmitting is idempotent)."""
        return self.run(pf.submit(self.layout, groups, self.configs))

    def publish_version(self, version: int, weights_uri: str | None = None) -> Result[bool]:
        """Record policy version ``version``; False if it was already the current one (a replay)."""
        return self.run(pf.publish_version(self.layout, version, weights_uri))

    def derive_admission(self, batch_groups: int) -> Result[int | None]:
        """Give the queue admission control where its config left it to the trainer
        (``QueueConfig.batch_groups`` DERIVED, the default): ``batch_groups`` is the number of
        groups the trainer commits per published version, so generation runs at most
        max_staleness + 1 versions' worth of groups ahead of training. A queue whose batch_groups
        was set (a number, or None: off) keeps it; so does one a trainer derived before (a resumed
        trainer adopts it). Returns the batch_groups in force (None: admission control off), and
        ``config`` says it from then on. The trainer-side helpers call it (TrainingStream,
        RankedStream, the TRL adapters); raises InvalidInput for a batch_groups below 1."""
        return self.run(self._derive_admission(batch_groups))

    def _derive_admission(self, batch_groups: int) -> Flow[int | None]:
        stored = yield from pf.derive_admission(self.layout, batch_groups)
        self.configs = tuple(c.replace(batch_groups=v) for c, v in zip(self.configs, stored))
        self.config = self.configs[0] if self.layout.count == 1 else logical_config(self.configs)
        return self.config.batch_groups  # type: ignore[return-value]  # a number or None once derived

    @property
    def version(self) -> Result[int]:
        """The current policy version (0 before the first publish; the lowest over the partitions)."""
        return self.run(pf.version(self.layout))

    def stats(self) -> Result[QueueStats]:
        """Counts by state, summed over the partitions that answer (``counters['partitions_unreachable']``)."""
        return self.run(pf.stats(self.layout, self.selector, self.clock, self.config))

    def partition_stats(self) -> Result[dict[str, QueueStats | None]]:
        """Each partition's stats (None: it did not answer); bounds in ``counters`` are its share."""
        return self.run(pf.partition_stats(self.layout, self.selector, self.clock))

    def worker(self, worker_id: str | None = None) -> Worker:
        """A generation worker's handle (``worker_id`` defaults to host:pid:nonce)."""
        return Worker(self, default_process_id() if worker_id is None else worker_id)

    def lease(self, groups: int, timeout_s: float | None = None, block_ms: int = 0, partial: bool = False,
              trainer_id: str | None = None, fleet: FleetWatch | None = None,
              beat: bool = True) -> Result[Lease | None]:
        """Lease exactly ``groups`` fresh completed groups (>= 1 when ``partial``), or None. Raises
        LeaseUnsatisfiable at once for a lease the bounds can never fill, and, from a blocking lease
        (``block_ms`` > 0) that waited in vain, WorkersGone once no worker has been live for the
        grace of ``fleet`` (core/liveness.py; None: this queue's own watch, ``self.fleet``, whose
        grace is worker_timeout_s) while groups wait to be generated.

        ``beat``: the lease beats in the background until it is committed, rolled back or lost
        (api/beat.py), so that if this process dies the reaper takes its groups back
        trainer_silence_s after the last beat rather than at the deadline. False: the deadline alone
        (an asyncio trainer that blocks its loop for longer than trainer_silence_s)."""
        return self.run(self._lease(groups, timeout_s, block_ms, partial, trainer_id or default_process_id(),
                                    fleet or self.fleet, beat))

    def _lease(self, groups: int, timeout_s: float | None, block_ms: int, partial: bool,
               trainer_id: str, fleet: FleetWatch, beat: bool = True) -> Flow[Lease | None]:
        members = yield from ml.lease_watched(self.layout, self.selector, trainer_id, groups, partial, timeout_s,
                                              block_ms, self.clock, self.config, fleet)
        if members is None:
            return None
        lease = Lease(self, members, timeout_s or self.config.lease_timeout_s)
        if beat:
            # Beaten once before it is handed out: the silence bound holds from the lease's first instant.
            # A lease already lost by then (a timeout shorter than the round trip, a reaper quicker than
            # this client) is handed out all the same, as it was before beats: its commit or rollback
            # says LeaseLost, which is where the caller handles a lease it could not keep.
            try:
                interval = yield from beat_lease(lease)
            except LeaseLost:
                interval = None
            if interval is not None:
                self.beats.add(lease, interval)
        return lease

    def hold(self, timeout_s: float | None = None, holder: str | None = None,
             reason: str = "weight update") -> Result[Hold]:
        """Close admission (no new reservations or leases) on every partition until the hold is
        released or expires (all or nothing). ``holder`` (default: this process's id) and ``reason``
        are what `rollout-queue holds` shows operators while it stands."""
        return self.run(self._hold(flows.new_id(), timeout_s, holder or default_process_id(), reason))

    def _hold(self, hold_id: str, timeout_s: float | None, holder: str, reason: str) -> Flow[Hold]:
        return Hold(self, hold_id, (yield from pf.hold_open(self.layout, hold_id, timeout_s, holder, reason)))

    # -- rounds of a torch.distributed weights push (rollout_queue.weights.push drives them) --------
    # They live on the first partition, whose versions channel every worker listens to.

    def open_push(self, version: int, uri: str, addr: str, backend: str = "gloo", join_s: float = 2.0,
                  deadline_s: float = 60.0, unreached: Sequence[str] = ()) -> Result[int]:
        """Open a round pushing ``version`` (to be recorded with ``uri``) from the rendezvous store at
        ``addr``; returns its epoch (resent after a lost reply, the same round). Workers may join for
        ``join_s``; the round ends by ``deadline_s``. ``unreached``: workers not admitted (members of
        this version's earlier round that never reached the rendezvous)."""
        return self.run(flows.push_open(self.layout.keys[0], flows.new_id(), version, uri, addr, backend, join_s,
                                        deadline_s, unreached))

    def seal_push(self, epoch: int, expect: int = 0) -> Result[PushSeal | None | tuple[int, int]]:
        """Fix round ``epoch``'s members once ``expect`` workers joined (0: every live worker) or its join
        window passed; (joined, expected) while it is still joinable; None if it was superseded."""
        return self.run(flows.push_seal(self.layout.keys[0], epoch, expect))

    def close_push(self, epoch: int, outcome: str, acked: int, dropped: int) -> Result[bool]:
        """Record how round ``epoch`` ended (done, partial, failed, empty)."""
        return self.run(flows.push_close(self.layout.keys[0], epoch, outcome, acked, dropped))

    def checkpoint(self, step: int) -> Result[int]:
        """A model checkpoint covers ``step``: drop the data committed at or before it."""
        return self.run(pf.checkpoint(self.layout, step))

    def restore(self, step: int) -> Result[int]:
        """The trainer resumed from checkpoint ``step``: requeue every group committed after it."""
        return self.run(pf.restore(self.layout, step))

    def reap(self, budget: int = flows.BATCH) -> Result[ReapReport]:
        """One reaper pass over every partition that answers (safe from several processes at once)."""
        return self.run(pf.reap(self.layout, self.selector, budget, self.clock))

    def settle_parked(self) -> Result[int]:
        """Finish the settlements workers' scripts parked (dead letters, filtered groups: the worker
        role holds no XACK), as the reaper's pass does; returns how many. Trainer and admin may too."""
        return self.run(pf.settle_parked(self.layout))

    def dead_letters(self, count: int = 100, start: str = "-") -> Result[list[DeadLetter]]:
        """Up to ``count`` oldest dead letters (of each partition), each naming its partition in ``queue``."""
        return self.run(pf.dead_letters(self.layout, count, start))

    def requeue_dead_letter(self, dlq_id: str, partition: str | None = None) -> Result[str]:
        """Submit a dead letter's pristine group again (in ``partition``, its DeadLetter.queue; needed
        only when the queue has several); returns its new entry ID."""
        return self.run(pf.requeue_dead_letter(self.layout, dlq_id, partition))

    def close(self) -> Result[None]:
        """Stop beating this client's leases and close the connection (await it on an asyncio queue)."""
        self.beats.stop()
        closing: None = self.driver.close()  # an awaitable on an asyncio driver (api/results.py)
        return closing

    def __enter__(self: Q) -> Q:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    async def __aenter__(self: Q) -> Q:
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.beats.stop()
        await self.driver.close()

    def __repr__(self) -> str:
        kind = "asyncio" if self.driver.is_async else "sync"
        return f"<{type(self).__name__} {self.name!r} partitions={self.layout.count} {kind}>"


async def _closed_on_failure(opening: Awaitable[Q], client: Any) -> Q:
    """An asyncio queue's open (from_url), its connection closed when the open fails."""
    try:
        return await opening
    except BaseException:
        await client.aclose()
        raise


class PartitionedQueue(RolloutQueue):
    """RolloutQueue with the partition count as the third positional argument (the older spelling
    of ``partitions=P``); the same class in every other way."""

    def __init__(self, client: SyncClient, name: str, partitions: int, config: QueueConfig | None = None,
                 **options: Any) -> None:
        super().__init__(client, name, config, partitions=partitions, **options)

    @classmethod
    def open(cls: type[Q], client: SyncClient, name: str, partitions: int = 1,  # type: ignore[override]
             config: QueueConfig | None = None, **options: Any) -> Result[Q]:
        return super().open(client, name, config, partitions=partitions, **options)

    @classmethod
    def from_url(cls: type[Q], url: str, name: str, partitions: int = 1,  # type: ignore[override]
                 config: QueueConfig | None = None, **options: Any) -> Result[Q]:
        return super().from_url(url, name, config, partitions=partitions, **options)
