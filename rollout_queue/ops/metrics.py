"""Prometheus metrics: the queue exporter (``rollout-queue metrics --port N``) and process metrics that
workers and trainers expose about themselves.

The exporter is a custom collector: every scrape reads one snapshot of the queue through the read-only
views (so it runs under the ``operator`` ACL role and never changes a key) and turns it into families
named in Prometheus style, ``rollout_queue_<what>{queue="...", ...}``. Counters are the ledger's own
monotonic counters from the meta hash, so they survive exporter restarts. Needs the ``metrics``
extra (prometheus-client); the core package never imports this module.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from contextlib import contextmanager
from typing import Any, Iterable, Iterator, Sequence

import redis
from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest, start_http_server
from prometheus_client.core import (CounterMetricFamily, GaugeHistogramMetricFamily, GaugeMetricFamily,
                                    HistogramMetricFamily, Metric)
from prometheus_client.samples import Sample
from prometheus_client.utils import floatToGoString

from rollout_queue.core.errors import RolloutQueueError
from rollout_queue.core.histograms import cumulative
from rollout_queue.ops.escape import clean
from rollout_queue.ops import partition_views
from rollout_queue.ops.view_models import STATES, WAITING, SampleDistribution, Snapshot, WorkerView, state_counts
from rollout_queue.ops.views import QueueView

log = logging.getLogger("rollout_queue.ops.metrics")

STALENESS_BUCKETS = (0, 1, 2, 3, 4, 8, 16, 32)
ATTEMPT_BUCKETS = (1, 2, 3, 4, 5, 8)
AGE_BUCKETS_S = (1, 5, 15, 30, 60, 120, 300, 600, 1800, 3600)
LEASE_WAIT_BUCKETS_S = (0.01, 0.05, 0.1, 0.5, 1, 2, 5, 10, 30, 60, 300)
#: meta counter -> (metric, help). Only counters that never decrease (committed and dead do, on
#: restore and dlq requeue: they are the groups{state=...} gauges instead).
COUNTERS = {
    "submitted": ("rollout_queue_submitted", "Source groups submitted (new source_ids only)."),
    "completed_total": ("rollout_queue_completions", "Completions accepted into the buffer."),
    "leases_total": ("rollout_queue_leases", "Leases handed to trainers."),
    "restored": ("rollout_queue_restored", "Committed groups put back to ready by restore(step)."),
    "dead_requeued": ("rollout_queue_dead_letters_requeued", "Dead letters submitted again."),
    "dead_purged": ("rollout_queue_dead_letters_purged", "Dead letters deleted by dlq purge."),
    "pruned": ("rollout_queue_pruned", "Settled groups whose ledger line outlived settled_retention_s."),
    "workers_reaped": ("rollout_queue_workers_reaped", "Workers the queue gave up on (silent past worker_timeout, "
                       "or a close cut short); `rollout-queue reaped` lists them."),
}


#: The labels every series of one snapshot carries: (names, values).
Base = tuple[tuple[str, ...], tuple[str, ...]]


def _gauge(name: str, doc: str, labels: Sequence[str], rows: Iterable[tuple[Sequence[str], float]]) -> Metric:
    family = GaugeMetricFamily(name, doc, labels=list(labels))
    for values, value in rows:
        family.add_metric(list(values), value)
    return family


def _counter(name: str, doc: str, labels: Sequence[str], rows: Iterable[tuple[Sequence[str], float]]) -> Metric:
    family = CounterMetricFamily(name, doc, labels=list(labels))
    for values, value in rows:
        family.add_metric(list(values), value)
    return family


def _gauge_histogram(name: str, doc: str, base: Base, values: Sequence[float], bounds: Sequence[float]) -> Metric:
    """A histogram of values that exist now (PEL entries): cumulative buckets."""
    return _counted_histogram(name, doc, base, [(v, 1) for v in values], bounds)


def _counted_histogram(name: str, doc: str, base: Base, counts: Sequence[tuple[float, int]],
                       bounds: Sequence[float]) -> Metric:
    """The same from (value, how many) pairs (the buffer's staleness, counted in Redis)."""
    buckets = [(floatToGoString(b), float(sum(n for v, n in counts if v <= b))) for b in bounds]
    buckets.append(("+Inf", float(sum(n for _, n in counts))))
    family = GaugeHistogramMetricFamily(name, doc, labels=list(base[0]))
    family.add_metric(list(base[1]), buckets, gsum_value=float(sum(v * n for v, n in counts)))
    return family


def _sample_histogram(name: str, doc: str, base: Base, dist: SampleDistribution) -> Metric:
    """Workers' own sample counts (core/histograms.py's buckets) as a Prometheus histogram:
    cumulative ``_bucket{le}`` and ``_count``; no ``_sum``, since workers count buckets, not totals."""
    running = cumulative(dist.counts)
    buckets = [(floatToGoString(e), float(n)) for e, n in zip(dist.edges, running)]
    buckets.append(("+Inf", float(running[-1])))
    family = HistogramMetricFamily(name, doc, labels=list(base[0]))
    family.add_metric(list(base[1]), buckets, None)
    family.samples.append(Sample(name + "_count", dict(zip(base[0], base[1])), float(running[-1])))
    return family


def families(snap: Snapshot, queue: str, partition: str | None = None, workers: bool = True) -> Iterator[Metric]:
    """Every metric of one snapshot: labelled ``queue`` (a plain queue), or ``queue`` (the logical
    name) and ``partition`` for one partition's snapshot (a partitioned queue)."""
    base: Base = (("queue",), (queue,)) if partition is None else (("queue", "partition"), (queue, partition))
    yield from _gauges(snap, base, workers)
    yield from _histograms(snap, base)
    yield from _counters(snap.stats, base)


def _gauges(snap: Snapshot, base: Base, workers: bool = True) -> Iterator[Metric]:
    names, q = base
    st = snap.stats
    counts = state_counts(st)
    yield _gauge("rollout_queue_groups", "Source groups by state (DESIGN: ownership state machine).",
                 (*names, "state"), (((*q, s), counts[s]) for s in STATES))
    yield _gauge("rollout_queue_executing_samples", "Samples of attempts now executing.", names,
                 [(q, st.executing_samples)])
    yield _gauge("rollout_queue_retained_groups", "Reservations in the PEL (bounded by max_retained_groups).",
                 names, [(q, st.retained)])
    yield _gauge("rollout_queue_kept_groups", "Committed groups kept until a checkpoint covers them.",
                 names, [(q, st.kept)])
    yield _gauge("rollout_queue_ledger_lines", "Ledger lines (one per entry until settled_retention_s after "
                 "it settled): the memory that grows with the run.", names, [(q, st.ledger_lines)])
    yield _gauge("rollout_queue_source_ids", "source_id -> entry mappings kept for idempotent submit.",
                 names, [(q, st.source_ids)])
    yield _gauge("rollout_queue_policy_version", "Current policy version (-1 before the first publish).",
                 names, [(q, st.version if st.version_published else -1)])
    if workers:
        yield _workers(snap.workers, base)
    # One series per worker (ids churn with restarts: a deregistered worker's series ends). A worker id
    # is untrusted text: clean() keeps control characters out of the exposition.
    yield _gauge("rollout_queue_worker_heartbeat_age_seconds", "Seconds since each registered worker's last "
                 "heartbeat (alive while under worker_timeout_s).", (*names, "worker"),
                 [((*q, clean(w.worker_id)), w.silent_ms / 1000) for w in snap.workers if w.silent_ms is not None])
    yield _gauge("rollout_queue_worker_executing_groups", "Groups each worker (or unregistered PEL consumer) "
                 "is executing now.", (*names, "worker"),
                 [((*q, clean(w.worker_id)), w.executing_groups) for w in snap.workers])
    yield _gauge("rollout_queue_leases_active", "Active leases.", names, [(q, len(snap.leases))])
    remaining = [x.remaining_ms for x in snap.leases if x.remaining_ms is not None]  # None: a garbage deadline
    yield _gauge("rollout_queue_leases_overdue", "Leases past their deadline, not yet rolled back.", names,
                 [(q, sum(1 for r in remaining if r < 0))])
    # A countdown, never a timestamp: negative once overdue, +Inf with no lease (an alert on "< 60"
    # stays quiet instead of the series vanishing).
    yield _gauge("rollout_queue_lease_seconds_to_deadline", "Seconds left before the earliest active lease "
                 "deadline (negative: overdue; +Inf: no active lease).", names,
                 [(q, min(remaining) / 1000 if remaining else math.inf)])
    yield _gauge("rollout_queue_oldest_wait_seconds", "Seconds the longest-waiting group of each state has "
                 "waited there (backlog: since submission; ready: since requeued; executing: since reserved; "
                 "completed: since buffered; leased: since leased); 0 when the state is empty.",
                 (*names, "state"), (((*q, s), (snap.oldest_ms(s) or 0) / 1000) for s in WAITING))
    held = [h.held_ms for h in snap.holds if h.held_ms is not None]
    yield _gauge("rollout_queue_admission_held_seconds", "Seconds the oldest standing admission hold has been "
                 "held (0: admission open); `rollout-queue holds` names its holder and reason.", names,
                 [(q, max(0, max(held)) / 1000 if held else 0.0)])
    progressed = [w for w in snap.workers if w.progress is not None]
    yield _counter("rollout_queue_worker_completed_groups", "Groups each worker reported completed since its "
                   "process started (its heartbeat's own count; rate() is its groups/s).", (*names, "worker"),
                   [((*q, clean(w.worker_id)), w.progress.groups) for w in progressed])  # type: ignore[union-attr]
    yield _counter("rollout_queue_worker_generated_tokens", "Tokens each worker reported generated since its "
                   "process started (rate() is its tokens/s).", (*names, "worker"),
                   [((*q, clean(w.worker_id)), w.progress.tokens) for w in progressed])  # type: ignore[union-attr]
    if st.since_commit_ms is not None:  # absent until a trainer commits
        yield _gauge("rollout_queue_seconds_since_last_commit", "Seconds since a trainer last committed a "
                     "lease (queue clock): growing while groups are completed means the trainer is stalled.",
                     names, [(q, st.since_commit_ms / 1000)])
    yield _gauge("rollout_queue_admission_holds", "Active admission holds (weight updates, drain).", names,
                 [(q, st.active_holds)])
    yield _gauge("rollout_queue_draining", "1 while the operator drain hold stands.", names,
                 [(q, 1 if snap.drain.active else 0)])
    if st.staleness_max is not None:
        yield _gauge("rollout_queue_buffer_staleness_versions_max", "Largest staleness in the buffer, in policy "
                     "versions.", names,
                     [(q, st.staleness_max)])


def worker_status(w: WorkerView) -> str:
    """alive, silent (a garbage heartbeat score is registered but never alive) or unregistered."""
    registered = w.garbage or w.last_heartbeat_ms is not None
    return "alive" if w.alive else "silent" if registered else "unregistered"


def _workers(rows: Sequence[WorkerView], base: Base) -> Metric:
    """Workers by status. Over a partitioned queue's rows (one per worker and partition) each worker
    counts once: silent if it is silent in any partition it is registered in (its work there is
    about to be reaped), else alive, else unregistered (only a PEL consumer somewhere)."""
    rank = {"unregistered": 0, "alive": 1, "silent": 2}
    worst: dict[str, str] = {}
    for w in rows:
        status = worker_status(w)
        if rank[status] >= rank.get(worst.get(w.worker_id, "unregistered"), 0):
            worst[w.worker_id] = status
    status_counts = {"alive": 0, "silent": 0, "unregistered": 0}
    for status in worst.values():
        status_counts[status] += 1
    names, q = base
    return _gauge("rollout_queue_workers", "Workers by heartbeat status.", (*names, "status"),
                  (((*q, k), v) for k, v in status_counts.items()))


def _histograms(snap: Snapshot, base: Base) -> Iterator[Metric]:
    yield _counted_histogram("rollout_queue_buffer_staleness_versions", "Staleness (policy versions) of buffered groups.",
                           base, snap.buffer_staleness, STALENESS_BUCKETS)
    attempts = [float(k) for k, n in snap.pel.attempts.items() for _ in range(n)]
    yield _gauge_histogram("rollout_queue_pel_attempts", "Attempt number (delivery count) of PEL entries.",
                           base, attempts, ATTEMPT_BUCKETS)
    yield _gauge_histogram("rollout_queue_executing_attempt_age_seconds",
                           "Seconds since each executing attempt was reserved.", base,
                           [a / 1000 for a in snap.pel.executing_ages_ms], AGE_BUCKETS_S)
    # Summed over the registered workers' own counts since each started: a worker that closes or is
    # reaped takes its counts out of the sum (Prometheus reads the drop as a counter reset).
    yield _sample_histogram("rollout_queue_sample_tokens", "Samples (trajectories) by length in tokens after "
                            "the prompt, as the registered workers count them since each started.", base,
                            snap.sample_tokens)
    yield _sample_histogram("rollout_queue_sample_seconds", "Samples (trajectories) by duration in seconds, "
                            "first request to end, as the registered workers count them since each started.", base,
                            snap.sample_seconds)


def _counters(st: Any, base: Base) -> Iterator[Metric]:
    for key, (name, doc) in COUNTERS.items():
        family = CounterMetricFamily(name, doc, labels=list(base[0]))
        family.add_metric(list(base[1]), st.counters.get(key, 0))
        yield family
    # Monotonic sums of a gauge and what moves groups out of it, written by the same script (commit.lua
    # vs restore_batch.lua; dlq_requeue.lua / dlq_purge.lua), so a rate() over them never dips.
    c = st.counters
    for name, doc, value in (
            ("rollout_queue_commits", "Groups committed by trainers (committed now plus restored).",
             st.committed + c.get("restored", 0)),
            ("rollout_queue_dead_letters", "Groups settled dead (dead now plus requeued and purged dead letters).",
             st.dead + c.get("dead_requeued", 0) + c.get("dead_purged", 0))):
        family = CounterMetricFamily(name, doc, labels=list(base[0]))
        family.add_metric(list(base[1]), value)
        yield family
    ended = CounterMetricFamily("rollout_queue_attempts_ended", "Attempts that ended without a completion.",
                                labels=[*base[0], "terminal"])
    for terminal, n in sorted(st.terminals.items()):
        ended.add_metric([*base[1], terminal], n)
    yield ended
    evicted = CounterMetricFamily("rollout_queue_evictions", "Buffered groups sent back to ready.",
                                  labels=[*base[0], "reason"])
    for reason, n in sorted(st.evictions.items()):
        evicted.add_metric([*base[1], reason], n)
    yield evicted
    filtered = CounterMetricFamily("rollout_queue_filtered", "Groups settled filtered, by reason.",
                                   labels=[*base[0], "reason"])
    for reason, n in sorted(st.filtered_by_reason.items()):
        filtered.add_metric([*base[1], reason], n)
    yield filtered
    yield from _token_families(st, base)


def _token_families(st: Any, base: Base) -> Iterator[Metric]:
    """Where generated tokens went (DESIGN: Token accounting): generated / trained is the waste ratio
    (rate(generated) / rate(trained) over a window), discarded by reason says why."""
    w = st.waste
    for name, doc, value in (
            ("rollout_queue_tokens_generated", "Tokens of the completions the buffer adopted.", w.generated),
            ("rollout_queue_tokens_trained", "Tokens of committed leases.", w.trained),
            ("rollout_queue_tokens_continued", "Tokens taken over from progress records, not generated again.",
             w.continued)):
        family = CounterMetricFamily(name, doc, labels=list(base[0]))
        family.add_metric(list(base[1]), value)
        yield family
    discarded = CounterMetricFamily("rollout_queue_tokens_discarded",
                                    "Tokens of adopted completions thrown away, by reason.", labels=[*base[0], "reason"])
    for reason, n in w.discarded.items():
        discarded.add_metric([*base[1], reason], n)
    yield discarded


class QueueCollector:
    """Reads the queue at each scrape. A failed read yields ``rollout_queue_up 0`` and nothing else, so
    an alert on ``up == 0`` fires instead of stale numbers being served.

    A partitioned queue (P > 1) is read partition by partition: every series carries ``queue`` (the
    logical name) and ``partition`` (``q#3``), so ``sum by (queue)`` is the logical queue and a rate
    over a counter stays right while a partition is unreachable (its ``rollout_queue_up`` is 0, the
    others are served). ``rollout_queue_workers`` counts each worker once over the partitions (no
    partition label); ``rollout_queue_partitions`` says how many there are."""

    def __init__(self, view: QueueView) -> None:
        self.view = view

    def describe(self) -> list[Metric]:
        return []  # registering must not read Redis

    def collect(self) -> Iterator[Metric]:
        start = time.perf_counter()
        name, layout = self.view.name, self.view.layout
        try:
            snap = self.view.run(partition_views.snapshot(layout))
        except (RolloutQueueError, redis.RedisError, OSError) as exc:
            log.warning("scrape failed", extra={"fields": {"queue": name, "error": str(exc)}})
            if layout.count == 1:
                yield _gauge("rollout_queue_up", "1 if the last scrape read the queue.", ("queue",), [((name,), 0)])
            else:
                yield _gauge("rollout_queue_up", "1 if the last scrape read the partition.", ("queue", "partition"),
                             [((name, part), 0) for part in layout.names])
            return
        if layout.count == 1:
            yield from families(snap, name)
            yield _gauge("rollout_queue_up", "1 if the last scrape read the queue.", ("queue",), [((name,), 1)])
        else:
            yield from _merged(snap, name)
        yield _gauge("rollout_queue_scrape_seconds", "Time to read the queue for this scrape.", ("queue",),
                     [((name,), time.perf_counter() - start)])


def _merged(snap: Snapshot, name: str) -> Iterator[Metric]:
    """The families of every partition that answered, one family per metric name."""
    merged: dict[str, Metric] = {}
    for part, psnap in snap.partitions:
        if psnap is None:
            continue
        for family in families(psnap, name, part, workers=False):
            if family.name in merged:
                merged[family.name].samples.extend(family.samples)
            else:
                merged[family.name] = family
    yield from merged.values()
    yield _workers(snap.workers, (("queue",), (name,)))
    yield _gauge("rollout_queue_up", "1 if the last scrape read the partition.", ("queue", "partition"),
                 [((name, part), 0 if psnap is None else 1) for part, psnap in snap.partitions])
    yield _gauge("rollout_queue_partitions", "Partitions of the logical queue.", ("queue",),
                 [((name,), len(snap.partitions))])


def registry_for(view: QueueView) -> CollectorRegistry:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(QueueCollector(view))  # duck-typed collector
    return registry


def exposition(view: QueueView) -> str:
    """One scrape as Prometheus text (``rollout-queue metrics --once``)."""
    return generate_latest(registry_for(view)).decode()


def serve(view: QueueView, port: int, addr: str = "127.0.0.1") -> tuple[Any, threading.Thread]:
    """Serve /metrics on ``addr:port`` from a daemon thread; returns (server, thread). Loopback
    unless told: the series name queues, workers and trainers, which is not for every network."""
    return start_http_server(port, addr, registry=registry_for(view))


class ProcessMetrics:
    """What a worker or trainer process says about itself, on its own port (serve()):
    ``rollout_queue_worker_tokens_total`` (tokens/s is its rate), samples and attempt seconds,
    and the trainer's ``rollout_queue_trainer_lease_wait_seconds``."""

    def __init__(self, queue: str, registry: CollectorRegistry | None = None) -> None:
        self.queue = queue
        self.registry = registry or CollectorRegistry()
        r = self.registry
        self.tokens = Counter("rollout_queue_worker_tokens", "Tokens generated.", ["queue"], registry=r)
        self.samples = Counter("rollout_queue_worker_samples", "Samples generated.", ["queue"], registry=r)
        self.attempt_seconds = Histogram("rollout_queue_worker_attempt_seconds", "Seconds from reserve to complete.",
                                         ["queue"], buckets=AGE_BUCKETS_S, registry=r)
        self.lease_wait = Histogram("rollout_queue_trainer_lease_wait_seconds", "Seconds a trainer waited for a lease.",
                                    ["queue"], buckets=LEASE_WAIT_BUCKETS_S, registry=r)

    def completed(self, tokens: int, samples: int, seconds: float) -> None:
        """Record one completed attempt."""
        self.tokens.labels(self.queue).inc(tokens)
        self.samples.labels(self.queue).inc(samples)
        self.attempt_seconds.labels(self.queue).observe(seconds)

    @contextmanager
    def lease_wait_timer(self) -> Iterator[None]:
        """``with metrics.lease_wait_timer(): lease = q.lease(...)``"""
        with self.lease_wait.labels(self.queue).time():
            yield

    def serve(self, port: int, addr: str = "127.0.0.1") -> tuple[Any, threading.Thread]:
        return start_http_server(port, addr, registry=self.registry)
