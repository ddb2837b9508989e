"""The queue always makes progress (issue 12, liveness items 1 and 3).

A queue with no reaper process still completes reserve -> complete -> lease -> commit when stale
groups fill the buffer, and a lease the bounds can never satisfy is refused at once with a typed
error naming the bound, instead of answering None for ever.
"""

from __future__ import annotations

import pytest

from rollout_queue import LeaseUnsatisfiable, QueueConfig
from tests.contract.worker_support import counter, group, samples


def _complete(q, n_groups: int, version: int = 0, worker: str = "w1") -> list[str]:
    ids = q.submit([group(f"{worker}-{version}-{i}") for i in range(n_groups)])
    w = q.worker(worker)
    for r in w.reserve(n_groups):
        assert w.complete(r.receipt, samples(r.group.n, version=version)) == "buffered"
    return ids


def test_a_stale_group_alone_in_the_buffer_is_requeued_by_lease(open_queue, raw, queue_name) -> None:
    q = open_queue(QueueConfig(max_staleness=2))
    (entry,) = _complete(q, 1, version=0)
    q.publish_version(3)
    assert q.lease(1) is None  # stale: never leased
    stats = q.stats()
    assert (stats.completed, stats.ready, stats.evictions["stale"]) == (0, 1, 1)
    # ... and regenerated on the new weights, with no reaper process anywhere.
    w = q.worker("w2")
    (again,) = w.reserve(1)
    assert again.entry_id == entry and again.receipt.attempt == 2
    w.complete(again.receipt, samples(2, version=3))
    lease = q.lease(1)
    assert lease is not None and [g.entry_id for g in lease.groups] == [entry]
    lease.commit()
    assert q.stats().committed == 1


def test_a_buffer_full_of_stale_groups_does_not_stall_the_queue(open_queue, raw, queue_name) -> None:
    """Both slots stale: reserve used to answer 'backpressure' and lease None, for ever."""
    q = open_queue(QueueConfig(max_staleness=2, max_completed_groups=2))
    ids = _complete(q, 2, version=0)
    q.publish_version(3)
    w = q.worker("w2")
    got = w.reserve(2)  # the stale groups were evicted inline: no backpressure
    assert sorted(r.entry_id for r in got) == sorted(ids)
    for r in got:
        w.complete(r.receipt, samples(2, version=3))
    lease = q.lease(2)
    assert lease is not None
    lease.commit()
    stats = q.stats()
    assert (stats.committed, stats.evictions["stale"], stats.completed) == (2, 2, 0)


def test_reserve_evicts_stale_groups_even_when_the_buffer_has_room(open_queue, raw, queue_name) -> None:
    q = open_queue(QueueConfig(max_staleness=0))
    _complete(q, 3, version=0)
    q.publish_version(1)
    q.worker("w9").reserve(1)
    assert counter(raw, queue_name, "evicted_stale") == 3
    assert q.stats().completed == 0


@pytest.mark.parametrize("cfg, groups, bound, limit", [
    (QueueConfig(max_completed_groups=4), 5, "max_completed_groups", 4),
    (QueueConfig(max_retained_groups=3), 4, "max_retained_groups", 3),
    (QueueConfig(batch_groups=2, max_staleness=1), 5, "batch_groups", 4),
    (QueueConfig(batch_groups=2), 3, "batch_groups", 2),  # on-policy: (0 + 0 + 1) * 2
])
def test_a_lease_the_bounds_can_never_satisfy_is_refused_at_once(open_queue, raw, queue_name, cfg, groups,
                                                                 bound, limit) -> None:
    q = open_queue(cfg)
    with pytest.raises(LeaseUnsatisfiable) as info:
        q.lease(groups, block_ms=60_000)  # would have blocked a minute, then None, for ever
    assert (info.value.groups, info.value.bound, info.value.limit) == (groups, bound, limit)
    assert bound in str(info.value)
    assert q.lease(limit) is None  # what the bounds allow is only waited for


def test_admission_limit_follows_commits_and_versions(open_queue, raw, queue_name) -> None:
    q = open_queue(QueueConfig(batch_groups=2, max_staleness=0))
    _complete(q, 2)
    lease = q.lease(2)
    lease.commit()  # committed 2: at version 0 nothing more can be admitted
    with pytest.raises(LeaseUnsatisfiable):
        q.lease(1, partial=True)
    q.publish_version(1)  # (1 + 0 + 1) * 2 - 2 = 2 more
    _complete(q, 2, version=1, worker="w3")
    assert len(q.lease(2)) == 2


def test_a_partial_lease_is_refused_only_when_nothing_can_ever_complete(open_queue, raw, queue_name) -> None:
    q = open_queue(QueueConfig(max_completed_groups=2))
    _complete(q, 2)
    lease = q.lease(8, partial=True)  # more than the bound, but partial: what there is
    assert lease is not None and len(lease) == 2


def test_a_lease_replay_is_answered_before_the_bounds_are_checked(open_queue, raw, queue_name) -> None:
    """A retried lease call (its reply lost) replays the lease it made, even if a bound shrank since."""
    from rollout_queue.core import protocol as p
    from tests.contract.worker_support import send

    q = open_queue(QueueConfig(max_completed_groups=4))
    _complete(q, 2)
    call = p.build(q.keys, "lease", lease_id="L-replay", token="t", trainer_id="tr", groups=2, partial=0, timeout_ms=0)
    first = send(q, call)
    raw.hset(q.keys["meta"], "max_completed_groups", 1)  # as `config set` would
    assert send(q, call) == first


def test_an_owned_entry_missing_from_its_index_is_found_by_the_reaper(open_queue, raw, queue_name) -> None:
    """Issue 12 item 4: an entry the PEL gives to @ready or @done but that ready / the buffer lost (a
    hand edit, a crash of something that is not a script) was stuck for ever: reap skipped those owners."""
    from tests.contract.worker_support import keys

    q = open_queue(QueueConfig(max_attempts=5))
    a, b = _complete(q, 2)
    c = q.submit([group("c")])[0]
    w = q.worker("w1")
    (rc,) = w.reserve(1)
    w.abort(rc.receipt)  # c: owned by @ready
    k = keys(queue_name)
    raw.zrem(k["ready"], c)
    raw.zrem(k["buffer"], a)
    raw.zrem(k["bufver"], a)
    assert q.worker("w2").reserve(5) == [] and len(q.lease(2, partial=True)) == 1  # only b is reachable
    report = q.reap()
    while report.reindexed < 2:  # the sweep goes through both owners in bounded calls
        report += q.reap()
    granted = {r.entry_id: r.receipt.attempt for r in q.worker("w3").reserve(5)}
    assert granted == {c: 2, a: 2}  # c at its next attempt; a's lost completion regenerated
    assert q.stats().counters["reindexed"] == 2
