"""Several runs on one worker fleet: a worker reserves from several queues in proportion to weights.

Two experiments sharing 8 GPUs 3:1 give their queues weights 3 and 1; every worker then spends
about 3/4 of its generated samples on the first. Each queue keeps its own policy version (a
Reservation carries the version of the queue it came from) and its own bounds; the fleet only
decides *which queue to ask next*. It never moves work between queues.

The rule (``WeightedShare``) is deterministic stride scheduling, counted in samples: serving queue k
``s`` samples adds ``s / weight_k`` to its pass; the next queue is the one with the lowest pass. A
queue that had no work is skipped without being charged, and when it has work again it rejoins at
the lowest pass of the busy queues, so it cannot bank credit while idle and then starve the others.
``quantum_samples`` makes a worker stay on its current queue until that queue is this many
(weighted) samples ahead: an engine that holds one model at a time switches weights at most once
per quantum instead of on every call. Proportions then hold over windows of about
``quantum × sum(weights) / min(weights)`` samples rather than per call.

This module is the sans-IO plan (``plan_reserve``); ``rollout_queue.api.fleet.FleetReserver`` runs it
over the queues' workers, sync or asyncio.
"""

from __future__ import annotations

import math
from typing import Callable, Generator, Sequence

from rollout_queue.core.checks import check_int
from rollout_queue.core.models import Reservation

#: One request of the plan: (queue index, max_groups, max_samples, block_ms) -> its reservations.
Ask = tuple[int, int, int, int]
Plan = Generator[Ask, list[Reservation], list[tuple[int, Reservation]]]
#: A blocked fleet worker watches one queue at a time for this long, then the next.
BLOCK_SLICE_MS = 200


class WeightedShare:
    """Stride scheduling over queues, in samples (see the module docstring). Pure; not thread-safe."""

    def __init__(self, weights: Sequence[float], quantum_samples: int = 0) -> None:
        if not weights or any(not (isinstance(w, (int, float)) and w > 0 and math.isfinite(w)) for w in weights):
            raise ValueError(f"weights must be positive finite numbers, got {list(weights)!r}")
        if quantum_samples < 0:
            raise ValueError("quantum_samples must be >= 0")
        self.weights = [float(w) for w in weights]
        self.quantum = quantum_samples
        self.passes = [0.0] * len(weights)
        self.idle = [False] * len(weights)
        self.samples_per_group = [1.0] * len(weights)  # running mean, to plan a call in groups
        self.current: int | None = None

    def _rejoined(self, k: int) -> float:
        """Queue k's pass, raised to the busy queues' lowest if it was idle."""
        busy = [self.passes[j] for j in range(len(self.passes)) if not self.idle[j]]
        return max(self.passes[k], min(busy)) if self.idle[k] and busy else self.passes[k]

    def choose(self, eligible: Sequence[int], passes: Sequence[float], current: int | None) -> int:
        """The queue to serve next among ``eligible`` (stay on ``current`` within its quantum)."""
        lowest = min(passes[k] for k in eligible)
        if current is not None and current in eligible and passes[current] - lowest < self.quantum / self.weights[current]:
            return current
        return min(eligible, key=lambda k: (passes[k], k))

    def plan(self, groups: int, eligible: Sequence[int]) -> list[tuple[int, int]]:
        """Split ``groups`` over the eligible queues: [(queue, groups)] in the order first chosen.
        An idle queue asked again rejoins here, at the busy queues' lowest pass."""
        for k in eligible:
            self.passes[k], self.idle[k] = self._rejoined(k), False
        passes = list(self.passes)
        counts: dict[int, int] = {}
        current = self.current
        for _ in range(groups):
            current = self.choose(eligible, passes, current)
            counts[current] = counts.get(current, 0) + 1
            passes[current] += self.samples_per_group[current] / self.weights[current]
        return list(counts.items())

    def charge(self, k: int, groups: int, samples: int) -> None:
        """Queue k served ``groups`` groups of ``samples`` samples in all."""
        self.passes[k] = self._rejoined(k) + samples / self.weights[k]
        self.idle[k] = False
        self.current = k
        if groups:
            self.samples_per_group[k] = 0.8 * self.samples_per_group[k] + 0.2 * samples / groups

    def mark_idle(self, k: int) -> None:
        self.idle[k] = True


def plan_reserve(share: WeightedShare, max_groups: int, max_samples: int, block_ms: int,
                 clock: Callable[[], float]) -> Plan:
    """Reserve up to ``max_groups`` groups (``max_samples`` samples, 0: no cap) over the queues in
    weighted proportion; queues that come back empty are skipped for the rest of the call. With
    nothing anywhere, block up to ``block_ms``, watching the queues in turn (lowest pass first)."""
    max_groups, max_samples = check_int(max_groups, "max_groups", 1), check_int(max_samples, "max_samples")
    block_ms = check_int(block_ms, "block_ms")
    deadline = clock() + block_ms / 1000
    out: list[tuple[int, Reservation]] = []
    eligible = list(range(len(share.weights)))
    while eligible and len(out) < max_groups:
        for k, groups in share.plan(max_groups - len(out), eligible):
            samples = max_samples - sum(r.group.n for _, r in out) if max_samples else 0
            if max_samples and samples <= 0:
                return out
            got = yield (k, groups, samples, 0)
            share.charge(k, len(got), sum(r.group.n for r in got))
            out += [(k, r) for r in got]
            if len(got) < groups:
                share.mark_idle(k)
                eligible.remove(k)
    if out or block_ms <= 0:
        return out
    while True:
        for k in sorted(range(len(share.weights)), key=lambda k: (share.passes[k], k)):
            remaining = int((deadline - clock()) * 1000)
            if remaining <= 0:
                return []
            got = yield (k, max_groups, max_samples, min(remaining, BLOCK_SLICE_MS))
            if got:
                share.charge(k, len(got), sum(r.group.n for r in got))
                return [(k, r) for r in got]
