"""The framework-neutral trainer contract (integrations/stream.py) against a real Redis: each promise
of its docstring, checked on Redis truth (stats, the commits stream), not on the class's own state."""

from __future__ import annotations

import logging
import time
from typing import Any

import pytest

from rollout_queue import QueueConfig, RolloutQueue, SourceGroup
from rollout_queue.core.errors import IntegrationConfigError, LeaseLost, LeasesOpen, LeaseUnsatisfiable, StreamStarved
from rollout_queue.integrations.stream import TrainingStream
from tests.integrations.helpers import committed_steps, fill

CFG = QueueConfig(max_staleness=4, lease_timeout_s=30.0)


@pytest.fixture
def q(redis_url: str, queue_name: str) -> Any:
    queue = RolloutQueue.from_url(redis_url, queue_name, CFG)
    yield queue
    queue.close()


def test_ack_commits_every_open_lease_once_with_the_step(q: RolloutQueue) -> None:
    fill(q, 6)
    stream = TrainingStream(q, groups_per_step=2, wait_s=5)
    first, second = stream.next(), stream.next(1)
    assert len(first) == 2 and len(second) == 1 and q.stats().leased == 3
    assert len(stream.ack(7)) == 2 and stream.open == [] and stream.last_acked == 7
    assert committed_steps(q) == [(7, 2), (7, 1)]
    assert stream.ack(8) == []  # nothing open: nothing committed twice
    assert q.stats().committed == 3


def test_a_failed_step_rolls_back_and_nothing_is_trained(q: RolloutQueue) -> None:
    fill(q, 4)
    stream = TrainingStream(q, groups_per_step=4, wait_s=5)
    stream.next()
    assert stream.rollback() == 4
    s = q.stats()
    assert s.leased == 0 and s.committed == 0 and s.ready + s.backlog == 4  # requeued pristine, to regenerate
    assert committed_steps(q) == []


def test_restore_requeues_what_was_acked_after_the_checkpoint(q: RolloutQueue) -> None:
    fill(q, 6)
    stream = TrainingStream(q, groups_per_step=2, wait_s=5)
    for step in (1, 2, 3):
        stream.next()
        stream.ack(step)
    assert stream.checkpoint(1, save=lambda step: None) == 2
    # the trainer dies after step 3, is restarted from checkpoint 1: steps 2 and 3 were never saved
    resumed = TrainingStream(q, groups_per_step=2, wait_s=5)
    assert resumed.restore(1) == 4
    s = q.stats()
    assert s.committed == 2 and s.ready + s.backlog == 4


def test_checkpoint_runs_save_first_and_refuses_while_its_own_lease_is_open(q: RolloutQueue) -> None:
    fill(q, 2)
    stream = TrainingStream(q, groups_per_step=1, wait_s=5)
    stream.next()
    saved: list[int] = []
    with pytest.raises(IntegrationConfigError, match="not acked"):
        stream.checkpoint(1, save=saved.append)
    assert saved == []  # refused before saving: the saved weights would cover an open batch
    stream.ack(1)
    stream.checkpoint(1, save=saved.append)
    assert saved == [1]


def test_checkpoint_waits_out_a_dead_incarnations_lease_then_gives_up(redis_url: str, queue_name: str,
                                                                      caplog: pytest.LogCaptureFixture) -> None:
    q = RolloutQueue.from_url(redis_url, queue_name, QueueConfig(max_staleness=4, lease_timeout_s=1.0))
    fill(q, 2)
    q.lease(groups=1, timeout_s=1.0)  # a trainer that died holding it
    stream = TrainingStream(q, groups_per_step=1, wait_s=5)
    started = time.monotonic()
    with caplog.at_level(logging.INFO, logger="rollout_queue.integrations.stream"):
        stream.checkpoint(0, wait_s=20)  # the reaper (called by checkpoint) requeues it at its deadline
    assert time.monotonic() - started < 15 and q.stats().leased == 0
    # The pause is logged once as it starts (a resumed TRL run stopped up to a minute, unexplained), and its end.
    said = [r.getMessage() for r in caplog.records if r.name == "rollout_queue.integrations.stream"]
    assert len([m for m in said if m.startswith("checkpoint waits for leases other trainers hold")]) == 1, said
    assert [m for m in said if m.startswith("checkpoint done")], said
    waits = next(r for r in caplog.records if r.getMessage().startswith("checkpoint waits"))
    assert getattr(waits, "fields", {}).get("leased") == 1, waits.__dict__
    q.lease(groups=1, timeout_s=60.0)
    with pytest.raises(LeasesOpen):
        stream.checkpoint(1, wait_s=0.5)  # a new step: the same one again only finishes the recorded one


def test_next_fails_fast_with_the_queues_state_instead_of_waiting_forever(q: RolloutQueue) -> None:
    stream = TrainingStream(q, groups_per_step=3, wait_s=0.6, block_ms=200)
    started = time.monotonic()
    with pytest.raises(StreamStarved, match="no worker is alive|nothing is queued") as info:
        stream.next()
    assert time.monotonic() - started < 5 and info.value.groups == 3 and not info.value.exhausted
    fill(q, 2)
    done = TrainingStream(q, groups_per_step=3, wait_s=60, block_ms=100, exhausted=lambda: True)
    started = time.monotonic()
    with pytest.raises(StreamStarved, match="enqueued its whole plan") as info:
        done.next()  # 2 left, 3 wanted, the source says it is done: fail now, not after 60 s
    assert info.value.exhausted and time.monotonic() - started < 5


def test_an_expired_lease_is_lost_at_ack_and_its_groups_stay_whole(redis_url: str, queue_name: str) -> None:
    q = RolloutQueue.from_url(redis_url, queue_name, QueueConfig(max_staleness=4, lease_timeout_s=0.3))
    fill(q, 2)
    stream = TrainingStream(q, groups_per_step=2, wait_s=5, lease_timeout_s=0.3)
    stream.next()
    time.sleep(0.5)
    q.reap()
    with pytest.raises(LeaseLost):
        stream.ack(1)
    assert q.stats().committed == 0 and committed_steps(q) == []


def test_an_asyncio_queue_and_bad_sizes_are_refused(redis_url: str, queue_name: str, q: RolloutQueue) -> None:
    with pytest.raises(IntegrationConfigError):
        TrainingStream(q, groups_per_step=0)
    import asyncio

    from rollout_queue import AsyncRolloutQueue

    async def opened() -> Any:
        return await AsyncRolloutQueue.from_url(redis_url, queue_name)

    aq = asyncio.run(opened())
    with pytest.raises(IntegrationConfigError, match="sync queue"):
        TrainingStream(aq)


def test_a_dead_predecessors_lease_is_not_counted_as_exhausted_data(redis_url: str, queue_name: str) -> None:
    """Issue 29 item 16: a resumed trainer with the source exhausted must count the groups a dead
    predecessor still leases as coming back (at its deadline), not raise StreamStarved(exhausted)."""
    import threading

    from rollout_queue import Sample

    q = RolloutQueue.from_url(redis_url, queue_name, QueueConfig(max_staleness=4, lease_timeout_s=30.0))
    fill(q, 3)
    q.lease(groups=2, timeout_s=1.0, trainer_id="dead-trainer")  # it died holding 2 of the 3 groups
    stop = threading.Event()

    def worker() -> None:  # regenerates what comes back once the dead trainer's lease expires
        w = q.worker("w-regen")
        while not stop.is_set():
            for r in w.reserve(max_groups=4, block_ms=100):
                w.complete(r.receipt, [Sample(slot=k, token_ids=(1,), logprobs=(-0.5,), reward=float(k), version=0)
                                       for k in range(r.group.n)])

    thread = threading.Thread(target=worker, daemon=True)
    thread.start()
    try:
        stream = TrainingStream(q, groups_per_step=2, wait_s=60, block_ms=100, exhausted=lambda: True)
        lease = stream.next()  # 1 completed + 2 leased by the dead trainer: enough, so it waits for them
        assert len(lease) == 2
        stream.ack(1)
    finally:
        stop.set()
        thread.join(10)
    s = q.stats()
    assert s.committed == 2 and s.leased == 0


def test_this_streams_own_open_leases_do_not_count_as_coming_back(q: RolloutQueue) -> None:
    """The groups this stream itself holds open will be acked, not returned: with the source
    exhausted and too few others left, next() still fails at once."""
    fill(q, 3)
    stream = TrainingStream(q, groups_per_step=2, wait_s=60, block_ms=100, exhausted=lambda: True)
    stream.next()
    started = time.monotonic()
    with pytest.raises(StreamStarved) as info:
        stream.next()  # 1 completed left, 2 of its own leased: exhausted now, not after 60 s
    assert info.value.exhausted and time.monotonic() - started < 10


def test_a_rollback_with_a_reason_is_counted_and_one_without_is_not(q: RolloutQueue, redis_url: str) -> None:
    """rollback(reason) after an error the data may have caused: the groups go back to the buffer,
    each counted (DESIGN rule 4); rollback() (the trainer stops): requeued to be generated again."""
    import redis as redis_client

    fill(q, 4)
    stream = TrainingStream(q, groups_per_step=2, wait_s=5)
    errored = [g.entry_id for g in stream.next().groups]
    assert stream.rollback("ValueError: loss is nan") == 2
    plain = [g.entry_id for g in stream.next().groups]
    assert len(set(plain) & set(errored)) == 1, "marked groups are held apart: one per lease while others are there"
    assert stream.rollback() == 2
    raw = redis_client.Redis.from_url(redis_url)
    marks = {k.decode(): v for k, v in raw.zrange(q.keys["suspects"], 0, -1, withscores=True)}
    assert marks == {e: 1.0 for e in errored}
    s = q.stats()
    assert s.completed == 2 and s.ready == 2 and s.dead == 0


# -- admission control (item 5) -----------------------------------------------------------------


def test_a_publishing_loop_sizes_admission_control_at_its_first_ack_after_a_version(
        q: RolloutQueue, redis_url: str, queue_name: str) -> None:
    """Issue 30: a queue whose config left batch_groups unset gets it from the stream (its batch x
    publish_every), so the workers run at most max_staleness + 1 versions ahead of training."""
    fill(q, 6)
    stream = TrainingStream(q, groups_per_step=2, wait_s=5)
    stream.next()
    stream.ack(1)
    assert q.stats().admission_batch is None  # no version published yet: nothing derived
    q.publish_version(1)
    stream.next()
    stream.ack(2)
    assert q.stats().admission_batch == 2 and q.config.batch_groups == 2
    # The resumed trainer opens with the config it started with: it adopts the derived value.
    again = RolloutQueue.from_url(redis_url, queue_name, CFG)
    assert again.config.batch_groups == 2
    again.close()
    # Generation ahead is bounded: (version 1 + max_staleness 4 + 1) x 2 = 12 groups admitted in all,
    # 4 committed and 2 buffered, so 6 more of the 20 waiting may be generated, no more.
    q.submit([SourceGroup(f"more{i}", "p", 2) for i in range(20)])
    assert len(q.worker("w2").reserve(max_groups=20, max_samples=100)) == 6


def test_publish_every_multiplies_the_batch(q: RolloutQueue) -> None:
    fill(q, 6)
    stream = TrainingStream(q, groups_per_step=1, wait_s=5, publish_every=3)
    for step in (1, 2):
        stream.next(2 if step == 2 else None)  # the largest batch leased counts
        stream.ack(step)
        q.publish_version(step)
    assert q.stats().admission_batch == 2 * 3


def test_a_loop_that_publishes_no_version_is_never_stopped_by_admission(q: RolloutQueue) -> None:
    """Admission counts versions: derived without any, it would close after max_staleness + 1 batches
    (5 here); this loop runs 8 and admission control stays unset."""
    fill(q, 16)
    stream = TrainingStream(q, groups_per_step=2, wait_s=5)
    for step in range(1, 9):
        stream.next()
        stream.ack(step)
    assert q.stats().committed == 16 and q.stats().admission_batch is None


@pytest.mark.parametrize("given", [None, 5], ids=["off", "set"])
def test_the_users_batch_groups_is_kept(redis_url: str, queue_name: str, given: int | None) -> None:
    q = RolloutQueue.from_url(redis_url, queue_name, CFG.replace(batch_groups=given))
    fill(q, 4)
    stream = TrainingStream(q, groups_per_step=2, wait_s=5)
    for step in (1, 2):
        stream.next()
        stream.ack(step)
        q.publish_version(step)
    assert q.stats().admission_batch == given
    q.close()


def test_a_loop_that_publishes_slower_than_it_said_is_told_so_at_once(redis_url: str, queue_name: str) -> None:
    """Admission closed for good (no version published) is no wait: the lease names batch_groups."""
    q = RolloutQueue.from_url(redis_url, queue_name, CFG.replace(max_staleness=0, batch_groups=2))
    fill(q, 2)
    q.submit([SourceGroup(f"more{i}", "p", 2) for i in range(4)])
    stream = TrainingStream(q, groups_per_step=2, wait_s=60)
    stream.next()
    stream.ack(1)  # (version 0 + 0 + 1) x 2 admitted and committed: none more until a version is published
    started = time.monotonic()
    with pytest.raises(LeaseUnsatisfiable, match="batch_groups.*publish a version first"):
        stream.next()
    assert time.monotonic() - started < 5
    q.close()
