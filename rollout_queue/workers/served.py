"""The queues one worker process serves, as one worker handle: ``--queue grpo`` or ``--queue run-a:3,run-b:1``.

Why: the runtime reserves, settles, heartbeats, lists what it owns and closes through one object;
whether that is one queue or several (and whether each has one partition or P, on one Redis or a
Redis Cluster) is decided here, once, so the runtime loop stays ignorant of queues, partitions and
Redis keys. It owns:

1. Opening: every queue through ``AsyncRolloutQueue.from_url`` with the worker's ``--partitions``
   and ``create`` (False for the shipped worker: a mistyped name raises QueueNotFound, nothing is
   written). The queues share one URL and one partition count.
2. Reserving: one queue reserves directly; several go through ``FleetReserver`` by weight
   (scale/fleet.py has the rule).
3. Routing: with several queues a reservation's receipt is wrapped in a ``ServedReceipt`` that
   names its queue (entry IDs are unique only within one queue), so each settlement goes to the
   worker of the queue that issued it, unchanged. With one queue receipts pass through as they are.
4. Completions: each queue's ``complete`` calls are coalesced by its own ``BatchingWorker``.

The one policy rule of a worker serving several queues (docs/DESIGN.md, "One worker, several
queues"): it has one engine and one set of weights, so its policy versions follow the **first**
queue named (the lead) only. Every other queue must never publish a policy version: a sample's
version would otherwise be the lead's, meaningless to that queue's staleness bound. ``check_follower``
refuses such a queue at start (``ServedQueuesRefused``) and the runtime stops if one publishes later.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any, Mapping, Sequence

from rollout_queue import AsyncRolloutQueue, AsyncWorker, Durability, HeartbeatInfo, Receipt, Reservation, Sample
from rollout_queue.api.aio import AsyncFleetReserver
from rollout_queue.core.errors import InvalidInput
from rollout_queue.core.keys import validate_queue_name
from rollout_queue.core.models import OwnedAttempt, PushTicket
from rollout_queue.workers.completions import BatchingWorker

__all__ = ["ServedQueues", "ServedQueuesRefused", "ServedReceipt", "parse_queue_spec", "receipt_scope"]


class ServedQueuesRefused(InvalidInput):
    """The queues cannot be served together by one worker (a follower queue publishes policy versions)."""


def parse_queue_spec(spec: str | Mapping[str, float]) -> dict[str, float]:
    """``"grpo"`` -> {"grpo": 1}; ``"run-a:3,run-b:1"`` -> {"run-a": 3, "run-b": 1}, in order.

    A queue name may itself contain ``:``; the part after the last ``:`` is a weight only when it
    is a positive number (name a queue called ``x:3`` as ``x:3:1``). Raises ValueError.
    """
    if isinstance(spec, Mapping):
        items = list(spec.items())
    else:
        items = []
        for raw in str(spec).split(","):
            raw = raw.strip()
            if not raw:
                raise ValueError(f"--queue {spec!r}: an empty queue name")
            name, sep, weight = raw.rpartition(":")
            try:
                value = float(weight) if sep else math.nan
            except ValueError:
                value = math.nan
            items.append((name, value) if sep and name and math.isfinite(value) and value > 0 else (raw, 1.0))
    out: dict[str, float] = {}
    for name, share in items:
        validate_queue_name(name)
        if name in out:
            raise ValueError(f"--queue names {name!r} twice")
        if not (isinstance(share, (int, float)) and math.isfinite(share) and share > 0):
            raise ValueError(f"--queue {name!r}: the weight must be a positive number, got {share!r}")
        out[name] = float(share)
    if not out:
        raise ValueError("--queue: name at least one queue")
    return out


@dataclass(frozen=True)
class ServedReceipt(Receipt):
    """A receipt of one of several served queues: ``served`` names the queue, ``inner`` is the
    receipt that queue's worker issued (a PartitionReceipt on a partitioned queue)."""

    served: str = ""
    inner: Receipt | None = None


def receipt_scope(receipt: Receipt) -> str:
    """What, besides (entry, attempt), makes a receipt unique among a worker's attempts: its queue
    and partition ('' for a plain queue's receipt). Engine request ids carry it."""
    if isinstance(receipt, ServedReceipt):
        assert receipt.inner is not None
        inner = receipt_scope(receipt.inner)
        return f"{receipt.served}/{inner}" if inner else receipt.served
    return getattr(receipt, "queue", "") or ""


class ServedQueues:
    """One worker id on every queue it serves; the runtime's only handle on the queues."""

    def __init__(self, queues: Mapping[str, AsyncRolloutQueue], weights: Mapping[str, float], worker_id: str) -> None:
        self.names = list(queues)
        self.lead = self.names[0]
        self.queues = dict(queues)
        self.worker_id = worker_id
        #: each queue's worker, coalescing its completions (completions.py)
        self.workers: dict[str, AsyncWorker] = {n: BatchingWorker(q.worker(worker_id)) for n, q in queues.items()}
        self.fleet = AsyncFleetReserver(self.workers, weights) if len(self.names) > 1 else None

    @classmethod
    async def open(cls, url: str, spec: str | Mapping[str, float], worker_id: str, *, partitions: int = 1,
                   create: bool = True, durability: Durability | None = None) -> "ServedQueues":
        """Open every queue of ``spec`` (parse_queue_spec). ``create=False``: QueueNotFound for a
        missing one (the queues opened before it are closed again; nothing is written)."""
        weights = parse_queue_spec(spec)
        opened: dict[str, AsyncRolloutQueue] = {}
        try:
            for name in weights:
                opened[name] = await AsyncRolloutQueue.from_url(url, name, partitions=partitions, create=create,
                                                                durability=durability)
        except BaseException:
            for q in opened.values():
                await q.close()
            raise
        return cls(opened, weights, worker_id)

    @property
    def several(self) -> bool:
        return self.fleet is not None

    @property
    def worker_timeout_s(self) -> float:
        """The shortest worker timeout: heartbeats must keep the worker alive on every queue."""
        return min(q.config.worker_timeout_s for q in self.queues.values())

    # -- reserving ------------------------------------------------------------------------------

    async def reserve(self, max_groups: int = 1, block_ms: int = 0, max_samples: int = 0,
                      overcommit: bool = False) -> list[Reservation]:
        if self.fleet is None:
            return await self.workers[self.lead].reserve(max_groups, block_ms=block_ms, max_samples=max_samples,
                                                         overcommit=overcommit)
        got = await self.fleet.reserve(max_groups, block_ms=block_ms, max_samples=max_samples, overcommit=overcommit)
        return [replace(r, receipt=self._wrap(name, r.receipt)) for name, r in got]

    def _wrap(self, name: str, receipt: Receipt) -> Receipt:
        return ServedReceipt(receipt.entry_id, receipt.attempt, receipt.worker_id, served=name, inner=receipt)

    def _route(self, receipt: Receipt) -> tuple[AsyncWorker, Receipt]:
        if self.fleet is None:
            return self.workers[self.lead], receipt
        if not isinstance(receipt, ServedReceipt) or receipt.served not in self.workers or receipt.inner is None:
            raise InvalidInput(f"receipt {receipt.entry_id} names none of the served queues {self.names}")
        return self.workers[receipt.served], receipt.inner

    # -- settling (the calls verdicts.py sends) -------------------------------------------------

    async def complete(self, receipt: Receipt, samples: Sequence[Sample]) -> str:
        worker, inner = self._route(receipt)
        return await worker.complete(inner, samples)

    async def filter(self, receipt: Receipt, reason: str, tokens: int = 0) -> str:
        worker, inner = self._route(receipt)
        return await worker.filter(inner, reason, tokens)

    async def fail(self, receipt: Receipt, reason: str) -> str:
        worker, inner = self._route(receipt)
        return await worker.fail(inner, reason)

    async def abort(self, receipt: Receipt, reason: str = "aborted", progress: Sequence[Sample] = (),
                    discarded: int = 0) -> str:
        worker, inner = self._route(receipt)
        return await worker.abort(inner, reason, progress, discarded)

    async def save_partial(self, receipt: Receipt, samples: Sequence[Sample]) -> str:
        worker, inner = self._route(receipt)
        return await worker.save_partial(inner, samples)

    # -- liveness, reconciliation, close --------------------------------------------------------

    async def heartbeat(self) -> HeartbeatInfo:
        """Heartbeat every queue; the lead's reply (its policy version). Raises ServedQueuesRefused
        if a follower queue has published a policy version."""
        lead = await self.workers[self.lead].heartbeat()
        for name in self.names[1:]:
            check_follower(name, self.lead, await self.workers[name].heartbeat())
        return lead

    async def join_push(self, epoch: int, newer_than: int) -> PushTicket | None:
        """Join a weights push round of the lead queue (whose versions the worker follows)."""
        return await self.workers[self.lead].join_push(epoch, newer_than)

    async def owned(self, min_idle_ms: int = 0) -> list[OwnedAttempt]:
        if self.fleet is None:
            return await self.workers[self.lead].owned(min_idle_ms)
        out: list[OwnedAttempt] = []
        for name in self.names:
            out += [replace(a, receipt=self._wrap(name, a.receipt)) for a in await self.workers[name].owned(min_idle_ms)]
        return out

    async def close(self, terminal: str = "aborted", reason: str = "worker closed") -> tuple[int, int]:
        """Requeue what the worker owns on every queue and deregister: (requeued, dead-lettered), summed.
        Every queue is tried; the first failure is raised after the others were closed."""
        requeued = dead = 0
        error: BaseException | None = None
        for name in self.names:
            try:
                r, d = await self.workers[name].close(terminal, reason)
            except Exception as exc:  # the others must still be closed
                error = error or exc
                continue
            requeued, dead = requeued + r, dead + d
        if error is not None:
            raise error
        return requeued, dead

    async def aclose(self) -> None:
        """Close every queue's connection."""
        for q in self.queues.values():
            await q.close()


def check_follower(name: str, lead: str, info: Any) -> None:
    """A follower queue (any but the first) must never publish a policy version (module docstring),
    version 0 included: recorded with a weights URI it names a model other than the lead's, and any
    published version turns on that queue's staleness bound, which would judge samples tagged with
    the lead's versions."""
    published = info.version_published if isinstance(info, HeartbeatInfo) else info.published
    if published:
        raise ServedQueuesRefused(
            f"queue {name!r} publishes policy versions (version {info.version}), but a worker serving several "
            f"queues follows the policy of its first queue {lead!r} only: all queues of one worker must share "
            "one model and weights source. Run a separate worker for each queue whose trainer publishes "
            "weights, or name that queue first.")
