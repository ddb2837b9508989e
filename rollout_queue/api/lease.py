"""Lease and Hold: what a trainer holds between lease and commit, and around a weight update.

A lease is one or more member leases (one per partition it drew from; always one on a plain
queue). Commit fences every member, then commits each (scale/multi_lease.py): exactly once holds
per group because each group belongs to exactly one member and each member commits atomically.
"""

from __future__ import annotations

from contextlib import contextmanager
from types import TracebackType
from typing import TYPE_CHECKING, Any, Awaitable, Iterator, Sequence, cast

from rollout_queue.api.results import Result
from rollout_queue.core.errors import IntegrationConfigError, InvalidInput, LeaseLost, RolloutQueueError
from rollout_queue.core.flows import Flow
from rollout_queue.core.keys import QueueKeys
from rollout_queue.core.models import CompletedGroup
from rollout_queue.core.protocol import LeaseReply
from rollout_queue.scale import flows as pf
from rollout_queue.scale import multi_lease as ml

if TYPE_CHECKING:
    from rollout_queue.api.queue import RolloutQueue


def error_reason(exc: BaseException) -> str | None:
    """What an errored rollback records for ``exc``, raised while a trainer held a lease; None when the
    rollback is plain (not counted). Plain: the trainer is shutting down (KeyboardInterrupt,
    SystemExit, GeneratorExit), and every error of this package but bad data, since those are about
    the queue, never about the groups held (LeaseLost, OutcomeUnknown, a state conflict, StreamStarved,
    RankFailed: ranks.py already rolled back with its own reason, IntegrationConfigError, ...).
    InvalidInput about a group's content (a sample without a reward, a payload that does not decode)
    and any other Exception may be the data's fault, so they count (DESIGN rule 4)."""
    if not isinstance(exc, Exception):
        return None
    if isinstance(exc, RolloutQueueError) and (not isinstance(exc, InvalidInput)
                                               or isinstance(exc, IntegrationConfigError)):
        return None
    return f"{type(exc).__name__}: {exc}"


def _sync_only(obj: Any, how: str) -> None:
    if obj.queue.driver.is_async:
        raise TypeError(f"{type(obj).__name__} of an asyncio queue: use `async {how}`")


def _async_only(obj: Any, how: str) -> None:
    if not obj.queue.driver.is_async:
        raise TypeError(f"{type(obj).__name__} of a sync queue: use `{how}`")


class Lease:
    """Completed groups handed to one trainer until commit, rollback or the deadline."""

    queue: "RolloutQueue"
    parts: list[LeaseReply]
    #: each member's partition name, and the member leases as (keys, lease_id, token)
    partitions: list[str]
    members: list[tuple[QueueKeys, str, str]]
    groups: list[CompletedGroup]
    #: the partition of each group, in the order of ``groups`` (entry IDs repeat across partitions)
    group_partitions: list[str]
    version: int
    deadline_ms: int
    fence_s: float
    committed: dict[int, str]  # member index -> commit id, kept across a failed commit()
    closed: str | None

    def __init__(self, queue: "RolloutQueue", members: Sequence[ml.Member], fence_s: float) -> None:
        layout = queue.layout
        self.queue = queue
        self.parts = [reply for _, reply, _ in members]
        self.partitions = [layout.names[i] for i, _, _ in members]
        self.members = [(layout.keys[i], reply.lease_id, token) for i, reply, token in members]
        self.groups = [g for r in self.parts for g in r.groups]
        self.group_partitions = [name for name, r in zip(self.partitions, self.parts) for _ in r.groups]
        self.version = max(r.version for r in self.parts)
        self.deadline_ms = min(r.deadline_ms for r in self.parts)
        self.fence_s = fence_s
        self.committed = {}
        self.closed = None

    @property
    def lease_id(self) -> str:
        """The lease's id (``partition/id,...`` over the partitions of a partitioned queue)."""
        if self.queue.layout.count == 1:
            return self.members[0][1]
        return ",".join(f"{name}/{lease_id}" for name, (_, lease_id, _) in zip(self.partitions, self.members))

    @lease_id.setter
    def lease_id(self, value: str) -> None:
        self._set_member(lease_id=value)

    @property
    def token(self) -> str:
        """The secret that proves this holder's right to commit (``,``-joined over members)."""
        return ",".join(token for _, _, token in self.members)

    @token.setter
    def token(self, value: str) -> None:
        self._set_member(token=value)

    def _set_member(self, **change: str) -> None:
        """Point a one-member lease at another id or token (a test of the server's refusal, say)."""
        if len(self.members) != 1:
            raise AttributeError("a lease of several partitions is changed through .members")
        keys, lease_id, token = self.members[0]
        self.members[0] = (keys, change.get("lease_id", lease_id), change.get("token", token))

    @property
    def staleness(self) -> tuple[int, float]:
        """(max, mean) of policy version at lease time minus each group's oldest sample version."""
        values = [max(0, r.version - g.min_version) for r in self.parts for g in r.groups]
        return max(values), sum(values) / len(values)

    def commit(self, step: int | None = None) -> Result[str]:
        """The groups were trained: settle them committed; returns the commit id (``partition/id,...``
        over several partitions). Raises LeaseLost (nothing committed) if a member is gone; after
        OutcomeUnknown, call commit() again: committed members are skipped or replayed."""
        return self.queue.run(self._commit(step))

    def _commit(self, step: int | None) -> Flow[str]:
        with self._beaten_until_lost():
            ids = yield from ml.commit(self.members, self.committed, step, self.fence_s)
        self.closed = "committed"
        self.queue.beats.discard(self)
        if self.queue.layout.count == 1:
            return ids[0]
        return ",".join(f"{name}/{commit_id}" for name, commit_id in zip(self.partitions, ids))

    def rollback(self, reason: str | None = None) -> Result[int]:
        """The groups were not trained: hand them back. Returns how many went back.

        Without ``reason`` (the trainer stops, or gives the lease up): they are requeued to be
        generated again, not counted. With ``reason`` (the trainer raised on this data; see
        ``error_reason``): an errored rollback, DESIGN rule 4: they go back to the buffer with their
        completions, each counted, held apart in later leases, and a group that was in max_attempts
        such leases is dead-lettered with the reason (not in the count returned)."""
        return self.queue.run(self._rollback(reason))

    def _rollback(self, reason: str | None = None) -> Flow[int]:
        with self._beaten_until_lost():
            n = yield from ml.rollback(self.members, self.committed, reason)
        self.closed = "rolled_back"
        self.queue.beats.discard(self)
        return n

    @contextmanager
    def _beaten_until_lost(self) -> Iterator[None]:
        """A LeaseLost ends the beating (the lease is gone); OutcomeUnknown does not (call again)."""
        try:
            yield
        except LeaseLost:
            self.queue.beats.discard(self)
            raise

    def extend(self, seconds: float) -> Result[int]:
        """Move the deadline ``seconds`` from now; returns the new (earliest) deadline in ms."""
        return self.queue.run(self._extend(seconds))

    def _extend(self, seconds: float) -> Flow[int]:
        self.deadline_ms = yield from ml.extend(self.members, self.committed, seconds)
        return self.deadline_ms

    def __len__(self) -> int:
        return len(self.groups)

    def __repr__(self) -> str:
        return f"<Lease {self.lease_id} groups={len(self.groups)} version={self.version} closed={self.closed}>"

    def __enter__(self) -> "Lease":
        _sync_only(self, "with")
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        if not self.closed:
            self.commit() if exc is None else self.rollback(error_reason(exc))

    async def __aenter__(self) -> "Lease":
        _async_only(self, "with")
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        if not self.closed:
            # Awaitables on the asyncio queue this guard admits (api/results.py: Result).
            await cast(Awaitable[object], self.commit() if exc is None else self.rollback(error_reason(exc)))


class Hold:
    """An admission hold around a weight update, on every partition (DESIGN.md: Weight updates)."""

    queue: "RolloutQueue"
    hold_id: str
    waiting: int  # attempts executing when the hold opened

    def __init__(self, queue: "RolloutQueue", hold_id: str, waiting: int) -> None:
        self.queue, self.hold_id, self.waiting = queue, hold_id, waiting

    def wait_terminal(self, timeout_s: float) -> Result[bool]:
        """True once every attempt executing when the hold opened is terminal; False on timeout."""
        return self.queue.run(pf.hold_wait(self.queue.layout, self.hold_id, timeout_s, self.queue.clock))

    def record_weight_update(self, version: int, weights_uri: str | None = None) -> Result[bool]:
        """Publish ``version`` under this hold (refused once the hold is gone: HoldLost)."""
        return self.queue.run(pf.publish_version(self.queue.layout, version, weights_uri, self.hold_id))

    def release(self) -> Result[int]:
        """Remove this hold; admission reopens when no hold is left. Returns the holds still active."""
        return self.queue.run(pf.hold_release(self.queue.layout, self.hold_id))

    def __repr__(self) -> str:
        return f"<Hold {self.hold_id} waiting={self.waiting}>"

    def __enter__(self) -> "Hold":
        _sync_only(self, "with")
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()

    async def __aenter__(self) -> "Hold":
        _async_only(self, "with")
        return self

    async def __aexit__(self, *exc: object) -> None:
        await cast(Awaitable[int], self.release())  # an asyncio queue's, as _async_only admits
