"""The partitions of a logical queue: names, placement of source groups, and which partition to ask next.

A logical queue ``q`` with P partitions is P ordinary queues ``q#0 … q#P-1``, each with its own hash
tag, so every script still runs on one Redis Cluster slot and no transition spans two partitions.
With P = 1 the only partition is ``q`` itself: exactly today's single queue, the same keys.

Rules this module keeps (no I/O here; partition_flows.py drives the calls):

1. Placement is stable: a source group lives in partition ``crc32(source_id) % P``, a pure function
   of the source_id, so resubmitting a source_id reaches the same partition and stays idempotent.
   P is therefore fixed for a queue's life (recorded once under ``keys.partitions``).
2. Bounds are logical: ``split_config`` gives each partition a share of every bound of
   ``SPLIT_BOUNDS`` and the shares sum to the bound exactly (``floor(bound / P)``, plus one for the
   first ``bound % P`` partitions), so the partitions together never hold more than the logical
   queue may. A bound below P is refused (a share of 0 would stop that partition), and so is a group
   larger than the smallest share of max_executing_samples (``largest_group``): it could never run
   in whichever partition its source_id hashes to (docs/DESIGN.md "Partitions").
3. Choosing a partition is cheap: ``Selector`` orders partitions by a backlog estimate (refreshed
   every few seconds, decremented by what this client took) in log2 buckets, and rotates the order
   within a bucket on every call, so P partitions with similar backlogs are served in turn and a much
   fuller one is drained first. Unreachable partitions are skipped for a growing back-off.
"""

from __future__ import annotations

import random
import zlib
from dataclasses import dataclass, field, fields
from typing import Any, Iterable, Mapping, Sequence, TypeVar

from rollout_queue.core.checks import check_int
from rollout_queue.core.config import DERIVED, QueueConfig
from rollout_queue.core.errors import InvalidInput
from rollout_queue.core.keys import QueueKeys, validate_queue_name
from rollout_queue.core.models import HeartbeatInfo, QueueStats, Receipt
from rollout_queue.core.protocol import Call

#: Logical bounds split over the partitions: the partitions' shares sum to the bound (rule 2).
SPLIT_BOUNDS = ("max_executing_samples", "max_retained_groups", "max_completed_groups", "batch_groups")


def partition_names(name: str, count: int) -> tuple[str, ...]:
    """``(name,)`` for one partition, else ``name#0 … name#{count-1}``."""
    validate_queue_name(name)
    check_int(count, "partitions", 1, 4096)
    return (name,) if count == 1 else tuple(validate_queue_name(f"{name}#{i}") for i in range(count))


def partition_index(source_id: str, count: int) -> int:
    """The partition of a source group: a stable hash (crc32, not Python's salted hash) of its source_id."""
    return zlib.crc32(source_id.encode("utf-8")) % count


def share(bound: int, count: int, index: int) -> int:
    """Partition ``index``'s share of ``bound``: floor(bound / count), plus one for the first
    ``bound % count`` partitions, so the ``count`` shares sum to ``bound`` exactly."""
    return bound // count + (1 if index < bound % count else 0)


def split_config(config: QueueConfig, count: int) -> tuple[QueueConfig, ...]:
    """Each partition's config: every bound of SPLIT_BOUNDS split by ``share`` (the rest as given).

    Raises InvalidInput, before anything is written, for a logical bound below ``count``: some
    partition's share would be 0, and the partition could then never run (or buffer, or admit) a group.
    """
    if count == 1:
        return (config,)
    small = [name for name in SPLIT_BOUNDS if _bound(getattr(config, name)) and getattr(config, name) < count]
    if small:
        given = ", ".join(f"{name}={getattr(config, name)}" for name in small)
        raise InvalidInput(f"{given} is below partitions={count}: each partition enforces a share of the logical "
                           f"bound, and a share of 0 would stop it. Raise {' and '.join(small)} to >= {count} or "
                           "use fewer partitions (nothing was written)")
    return tuple(config.replace(**{name: share(getattr(config, name), count, i) for name in SPLIT_BOUNDS
                                   if _bound(getattr(config, name))}) for i in range(count))


def _bound(value: object) -> bool:
    """A split bound that is a number (not None, off, nor batch_groups' DERIVED, left to the trainer)."""
    return isinstance(value, int)


def logical_config(shares: Sequence[QueueConfig]) -> QueueConfig:
    """The logical queue's config from its partitions' (stored) ones: the SPLIT_BOUNDS summed, every
    other field as partition 0 has it. The inverse of split_config for the config it split."""
    summed: dict[str, object] = {}
    for name in SPLIT_BOUNDS:
        values = [getattr(c, name) for c in shares]
        # batch_groups None: no admission control; DERIVED: left to the trainer (on every partition
        # until a trainer derives it; one that did not answer then may still say so)
        summed[name] = (DERIVED if DERIVED in values else None if None in values
                        else sum(values))
    return shares[0].replace(**summed)


def largest_group(shares: Sequence[QueueConfig]) -> int:
    """The largest ``n`` a partitioned queue can ever execute: the smallest partition's share of
    max_executing_samples. Placement is by source_id alone, so the rule must hold in every partition."""
    return min(c.max_executing_samples for c in shares)


@dataclass(frozen=True)
class Layout:
    """Names and keys of a logical queue's partitions."""

    name: str
    count: int
    names: tuple[str, ...] = field(init=False)
    keys: tuple[QueueKeys, ...] = field(init=False)

    def __post_init__(self) -> None:
        names = partition_names(self.name, self.count)
        object.__setattr__(self, "names", names)
        object.__setattr__(self, "keys", tuple(QueueKeys(n) for n in names))

    @property
    def record(self) -> str:
        """Where the partition count is recorded (under the logical name's own tag)."""
        return QueueKeys(self.name).partitions

    def of_source(self, source_id: str) -> int:
        return partition_index(source_id, self.count)

    def index(self, receipt: Receipt) -> int:
        """The partition that issued ``receipt`` (a plain Receipt only names one when P = 1)."""
        queue = getattr(receipt, "queue", "") or (self.names[0] if self.count == 1 else "")
        if queue not in self.names:
            raise InvalidInput(f"receipt {receipt.entry_id} names no partition of {self.name!r} (got {queue!r}): "
                               "settle the receipt a PartitionedWorker returned, unchanged")
        return self.names.index(queue)


@dataclass(frozen=True)
class PartitionReceipt(Receipt):
    """A receipt that also names the partition (queue) that issued it: entry IDs are unique only
    within one partition, so a settlement is routed by ``queue``."""

    queue: str = ""

    def __post_init__(self) -> None:
        super().__post_init__()
        validate_queue_name(self.queue)


class Selector:
    """Which partition to ask next: fullest first (log2 buckets of a backlog estimate), rotating
    within a bucket, skipping unreachable ones. One per worker or trainer; not thread-safe."""

    def __init__(self, count: int, refresh_s: float = 5.0, seed: int | None = None,
                 down_s: float = 0.5, max_down_s: float = 10.0) -> None:
        self.count, self.refresh_s = count, refresh_s
        self.random = random.Random(seed)
        self.rotation = self.random.randrange(count)  # workers start spread over the partitions
        self.estimate: list[int | None] = [None] * count  # None: unknown, ranked with the fullest
        self.down_until = [0.0] * count
        self.failures = [0] * count
        self.down_s, self.max_down_s = down_s, max_down_s
        self.next_refresh = 0.0
        #: reserve calls whose outcome is unknown, by partition: resent (same request id) before any
        #: new reserve there, so grants made to this worker are replayed to it, never stranded.
        self.pending: dict[int, Call] = {}

    def order(self, now: float) -> list[int]:
        """Live partitions to try now, best first (all of them if every one is marked down)."""
        live = [i for i in range(self.count) if self.down_until[i] <= now] or list(range(self.count))
        start = self.rotation
        self.rotation = (self.rotation + 1) % self.count
        return sorted(live, key=lambda i: (-_bucket(self.estimate[i]), (i - start) % self.count))

    def is_down(self, i: int, now: float) -> bool:
        return self.down_until[i] > now

    def refresh_due(self, now: float) -> bool:
        if now < self.next_refresh:
            return False
        self.next_refresh = now + self.refresh_s * (0.75 + 0.5 * self.random.random())  # jitter: no herds
        return True

    def set_estimate(self, i: int, available: int) -> None:
        self.estimate[i] = max(0, available)

    def took(self, i: int, got: int, asked: int, drained: bool = True) -> None:
        """A call asked partition ``i`` for ``asked`` and got ``got``; ``drained``: fewer than asked
        because the partition had no more (not because a hold or a bound refused)."""
        current = self.estimate[i]
        if got < asked and drained:
            self.estimate[i] = 0
        elif current is not None:
            self.estimate[i] = max(1 if got < asked else 0, current - got)

    def woke(self, i: int) -> None:
        """Partition i's wake stream moved: it may have work again, ask it first."""
        self.estimate[i] = None

    def mark_down(self, i: int, now: float) -> None:
        self.failures[i] += 1
        self.down_until[i] = now + min(self.max_down_s, self.down_s * 2 ** (self.failures[i] - 1))

    def mark_up(self, i: int) -> None:
        self.failures[i], self.down_until[i] = 0, 0.0


def _bucket(estimate: int | None) -> int:
    return 64 if estimate is None else estimate.bit_length()


# -- aggregates ------------------------------------------------------------------------------------


_CONFIG_FIELDS = frozenset(QueueConfig().to_meta())
K = TypeVar("K")


def sum_maps(maps: Iterable[Mapping[K, int]]) -> dict[K, int]:
    """Per key, the sum over the partitions' maps (counters, entries by state or by PEL owner)."""
    out: dict[K, int] = {}
    for m in maps:
        for k, v in m.items():
            out[k] = out.get(k, 0) + v
    return out


def sum_stats(parts: Sequence[QueueStats], unreachable: int = 0, logical: QueueConfig | None = None) -> QueueStats:
    """One QueueStats for the logical queue: counts summed; ``version`` is the lowest partition's
    (the version every partition has reached); staleness over all buffered groups. The number of
    partitions left out is in ``counters['partitions_unreachable']``. The bounds in the counters
    are the logical ones: ``logical``'s, else the sum of the partitions' shares."""
    if not parts:
        raise ValueError("no partition stats to aggregate")
    summed: dict[str, Any] = {}
    for f in fields(QueueStats):
        if f.name in ("version", "staleness_max", "staleness_mean", "since_commit_ms", "buffer_versions",
                      "staleness_mode"):
            continue  # not sums: set below
        values = [getattr(s, f.name) for s in parts]
        if isinstance(values[0], bool):
            summed[f.name] = all(values)
        elif isinstance(values[0], int):
            summed[f.name] = sum(values)
        else:
            summed[f.name] = sum_maps(values)
    maxima = [s.staleness_max for s in parts if s.staleness_max is not None]
    weighted = [(s.staleness_mean, s.completed) for s in parts if s.staleness_mean is not None]
    weight = sum(n for _, n in weighted)
    summed["version"] = min(s.version for s in parts)
    summed["staleness_mode"] = parts[0].staleness_mode  # config: the same on every partition
    since = [s.since_commit_ms for s in parts if s.since_commit_ms is not None]
    summed["since_commit_ms"] = min(since) if since else None  # the latest commit on any partition
    summed["staleness_max"] = max(maxima) if maxima else None
    summed["staleness_mean"] = sum(m * n for m, n in weighted) / weight if weight else None
    by_version: dict[int, int] = {}
    for s in parts:
        for v, n in s.buffer_versions:
            by_version[v] = by_version.get(v, 0) + n
    summed["buffer_versions"] = tuple(sorted(by_version.items()))
    # Config values in the counters: the split bounds are logical (the shares sum to them, and with a
    # partition unreachable only ``logical`` still knows them); the other fields are the same everywhere.
    shares = {k: v for k, v in parts[0].counters.items() if k in _CONFIG_FIELDS}
    stored = logical.to_meta() if logical is not None else None
    for name in SPLIT_BOUNDS:
        if name in shares:
            values = [s.counters.get(name, 0) for s in parts]
            # a negative share (batch_groups -1: left to the trainer) is no amount: say so, not -P
            shares[name] = int(stored[name]) if stored else min(values) if min(values) < 0 else sum(values)
    summed["counters"] = {**summed["counters"], **shares, "partitions": len(parts) + unreachable,
                          "partitions_unreachable": unreachable}
    return QueueStats(**summed)


def merge_heartbeats(infos: Sequence[HeartbeatInfo]) -> HeartbeatInfo:
    """The newest policy version any partition announces (with its weights), held if any is held."""
    newest = max(infos, key=lambda h: (h.version_published, h.version))
    return HeartbeatInfo(newest.version, newest.version_published, newest.weights_uri,
                         any(h.held for h in infos), max(h.server_ms for h in infos))
