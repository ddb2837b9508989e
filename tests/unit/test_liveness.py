"""The hang-to-error rule without Redis (core/liveness.py): FleetWatch over hand-made stats snapshots,
and the read of the last workers seen over canned replies (h11 style)."""

from __future__ import annotations

import math
from typing import Any

import pytest

from rollout_queue import InvalidInput, QueueStats, WorkersGone
from rollout_queue.core.errors import StreamStarved
from rollout_queue.core.keys import QueueKeys
from rollout_queue.core.liveness import FleetWatch, WorkerSeen, last_workers, needs_workers
from tests.unit.test_owned import drive

T = 10.0  # the queue's worker_timeout_s in these tests


def stats(**values: Any) -> QueueStats:
    base = dict(backlog=0, ready=0, executing_groups=0, executing_samples=0, completed=0, leased=0, retained=0,
                committed=0, filtered=0, dead=0, version=0, version_published=True, submitted=0, kept=0,
                workers_alive=0, workers_silent=0, active_leases=0, active_holds=0, staleness_max=None,
                staleness_mean=None, evictions={}, terminals={}, filtered_by_reason={}, counters={})
    return QueueStats(**{**base, **values})


DOWN = stats(backlog=5, executing_groups=1)  # no live worker, groups waiting for one


def armed(grace_s: float | None = None) -> FleetWatch:
    """A watch whose waiter has had a batch (so a fleet existed)."""
    watch = FleetWatch(grace_s)
    watch.note_batch()
    return watch


def test_gone_only_after_the_grace_of_continuous_looks() -> None:
    watch = armed()  # grace: worker_timeout_s
    assert [watch.observe(DOWN, T, t) for t in (0.0, 4.0, 8.0)] == [None, None, None]
    assert watch.observe(DOWN, T, 10.0) == 10.0
    assert watch.grace(T) == T and FleetWatch(3.0).grace(T) == 3.0


def test_a_live_worker_or_nothing_waiting_resets_the_count() -> None:
    watch = armed(5.0)
    watch.observe(DOWN, T, 0.0)
    assert watch.observe(stats(backlog=5, workers_alive=1), T, 4.0) is None  # a slow worker still beats
    assert watch.observe(DOWN, T, 8.0) is None  # counted again from 8
    assert watch.observe(DOWN, T, 12.0) is None
    assert watch.observe(DOWN, T, 13.0) == 5.0
    drained = armed(0.0)
    for t in range(100):  # no worker and nothing queued, ready or executing: StreamStarved's to say
        assert drained.observe(stats(completed=1, leased=3), T, float(t)) is None


def test_a_fleet_still_starting_is_not_a_fleet_gone() -> None:
    """A trainer started before its workers (a worker registers once its engine is up: minutes for
    vLLM) waits for them (StreamStarved at wait_s); the watch arms at the first live worker or batch."""
    watch = FleetWatch(0.0)
    assert all(watch.observe(DOWN, T, float(t)) is None for t in range(0, 300, 5))
    assert not watch.armed
    assert watch.observe(stats(backlog=5, workers_alive=2), T, 300.0) is None and watch.armed
    assert watch.observe(DOWN, T, 305.0) == 0.0
    batch = FleetWatch(0.0)
    batch.note_batch()
    assert batch.observe(DOWN, T, 0.0) == 0.0


def test_looks_further_apart_than_worker_timeout_prove_nothing() -> None:
    """A worker may have come and gone between two looks more than worker_timeout_s apart."""
    watch = armed(15.0)
    watch.observe(DOWN, T, 0.0)
    assert watch.observe(DOWN, T, 10.5) is None  # a gap of 10.5 > T: the count starts again at 10.5
    assert watch.observe(DOWN, T, 20.5) is None
    assert watch.observe(DOWN, T, 25.5) == 15.0
    waits = armed(3.0)  # a wait as long as worker_timeout_s between looks: the wait itself is evidence
    assert [waits.observe(DOWN, 1.0, t, waited_s=1.0) for t in (0.0, 1.9, 3.8)] == [None, None, 3.8]


def test_grace_bounds() -> None:
    off = armed(math.inf)
    assert all(off.observe(DOWN, T, float(t)) is None for t in range(0, 1000, 5))
    assert armed(0.0).observe(DOWN, T, 0.0) == 0.0
    for bad in (-1.0, float("nan"), "5", True):
        with pytest.raises(InvalidInput, match="grace"):
            FleetWatch(bad)  # type: ignore[arg-type]


def test_needs_workers_counts_queued_ready_and_executing() -> None:
    assert not needs_workers(stats(completed=9, leased=9))
    assert needs_workers(stats(backlog=1)) and needs_workers(stats(ready=1)) and needs_workers(stats(executing_groups=1))


def test_the_last_workers_seen_registered_first_then_reaped_newest_first() -> None:
    keys = QueueKeys("unit")
    flow = last_workers(keys, limit=4)
    sent, got = drive(flow, [
        [b"100", b"0"],                                    # TIME: 100 s
        b"40000",                                          # the clock offset: 40 s of outage
        [b"w2", b"55000", b"w1", b"50000"],                # ZREVRANGE workers WITHSCORES (queue clock)
        [[b"9-0", [b"worker", b"w0", b"heartbeat_ms", b"30000"]],
         [b"8-0", [b"worker", b"w1", b"heartbeat_ms", b"20000"]],  # registered again since: the registration wins
         [b"7-0", [b"worker", b"wc", b"heartbeat_ms", b"0"]]],     # reaped while closing: unknown
    ])
    assert sent == [("TIME",), ("HGET", keys["clock"], "offset"), ("ZREVRANGE", keys["workers"], 0, 3, "WITHSCORES"),
                    ("XREVRANGE", keys["reaped"], "+", "-", "COUNT", 4)]
    assert got == [WorkerSeen("w2", 5.0, "registered, silent"), WorkerSeen("w1", 10.0, "registered, silent"),
                   WorkerSeen("w0", 30.0, "reaped"), WorkerSeen("wc", None, "reaped")]
    assert str(got[2]) == "w0 (last heartbeat 30 s ago, reaped)"


def test_the_error_is_a_stream_starved_that_names_workers_and_states() -> None:
    exc = WorkersGone("q", 4, 12.5, DOWN, (WorkerSeen("w1", 21.0, "reaped"),), 10.0, 10.0)
    assert isinstance(exc, StreamStarved) and not exc.exhausted and exc.groups == 4
    text = str(exc)
    for part in ("no worker has been alive for at least 12.5 s", "worker_timeout_s=10", "5 group(s) are queued",
                 "1 executing", "w1 (last heartbeat 21 s ago, reaped)", "fleet_grace_s"):
        assert part in text, part
