"""Fixed bucket edges for the distributions workers report: sample lengths (tokens) and durations.

Why fixed and shared: every worker counts into the same buckets, so the queue can add the counts of
any set of workers (``rollout-queue stats``, the exporter's Prometheus histograms) without storing a
single sample. A count list has one entry per edge plus one for everything above the last edge; a
value lands in the first bucket whose edge is >= it (Prometheus' ``le``). Pure, no I/O.
"""

from __future__ import annotations

from bisect import bisect_left
from typing import Iterable, Sequence

#: Tokens after the prompt of one sample (a trajectory: model turns and observations together).
TOKEN_BUCKETS: tuple[int, ...] = (16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384, 32768)
#: Seconds from a sample's first request to its end (a trajectory: every turn and environment step).
SECOND_BUCKETS: tuple[float, ...] = (0.25, 0.5, 1, 2, 5, 10, 20, 30, 60, 120, 300, 600)


def bucket_index(edges: Sequence[float], value: float) -> int:
    """The bucket ``value`` counts in: the first edge >= value, or len(edges) (above every edge)."""
    return bisect_left(edges, value)


def empty_counts(edges: Sequence[float]) -> list[int]:
    return [0] * (len(edges) + 1)


def quantile_edge(edges: Sequence[float], counts: Sequence[int], q: float) -> float | None:
    """The upper edge of the bucket holding quantile ``q`` (inf above the last edge); None if no counts."""
    total = sum(counts)
    if not total:
        return None
    rank = q * total
    seen = 0
    for i, c in enumerate(counts):
        seen += c
        if seen >= rank and c:
            return float(edges[i]) if i < len(edges) else float("inf")
    return float("inf")


def bucket_count(edges: Sequence[float]) -> int:
    """How many counts a list over ``edges`` has: one per edge plus one above the last."""
    return len(edges) + 1


def add_counts(edges: Sequence[float], lists: Iterable[Sequence[int]]) -> tuple[int, ...]:
    """The counts of several count lists over ``edges`` added bucket by bucket (an empty list adds
    nothing; so does one of another length, which no worker of these edges reports)."""
    total = empty_counts(edges)
    for counts in lists:
        if len(counts) == len(total):
            total = [a + b for a, b in zip(total, counts)]
    return tuple(total)


def cumulative(counts: Sequence[int]) -> list[int]:
    """Counts at or below each bucket's edge (Prometheus' ``le`` buckets); the last is the total."""
    out, seen = [], 0
    for c in counts:
        seen += c
        out.append(seen)
    return out


def max_edge(edges: Sequence[float], counts: Sequence[int]) -> float | None:
    """The upper edge of the highest bucket with a count (inf above the last edge); None if none."""
    for i in range(len(counts) - 1, -1, -1):
        if counts[i]:
            return float(edges[i]) if i < len(edges) else float("inf")
    return None


def format_counts(counts: Sequence[int]) -> str:
    """A count list as heartbeat.lua takes and stores it: comma-joined decimals ('' for none)."""
    return ",".join(str(int(c)) for c in counts)
