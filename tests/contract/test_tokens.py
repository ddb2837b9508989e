"""Token accounting (DESIGN: Token accounting): counters.tokens_generated at adoption (complete,
complete_many), tokens_trained at commit, tokens_<reason> at every discard of an adopted completion,
and the per-attempt token records (the ``tokens`` hash) living exactly as long as their payloads.

Each test drives the public API over both transports and both servers and reads the counters through
``stats().waste``; Redis truth (the ``tokens`` hash) is read only to prove nothing is left behind.
"""

from __future__ import annotations

import pytest
import redis

from rollout_queue import QueueConfig, ScriptError
from rollout_queue.core.codec import encode_completion
from tests.contract.conftest import snapshot
from tests.contract.lifecycle import complete_all, fill_buffer, keys, reserve_all, samples_for, submit, train
from tests.contract.worker_support import call_complete, samples

#: samples_for: 3 token ids per sample, 2 samples per group (fill_buffer's n).
GROUP_TOKENS = 6


def _records(raw: redis.Redis, queue_name: str) -> dict[str, int]:
    return {k.decode(): int(v) for k, v in raw.hgetall(keys(queue_name)["tokens"]).items()}


def test_generated_at_adoption_trained_at_commit(open_queue, raw: redis.Redis, queue_name: str) -> None:
    q = open_queue(QueueConfig())
    ids = fill_buffer(q, 4)
    w = q.stats().waste
    assert (w.generated, w.trained, w.discarded_total, w.per_trained) == (4 * GROUP_TOKENS, 0, 0, None)
    assert _records(raw, queue_name) == {f"{i}:1": GROUP_TOKENS for i in ids}
    train(q, 3)
    w = q.stats().waste
    assert (w.generated, w.trained, w.discarded_total) == (4 * GROUP_TOKENS, 3 * GROUP_TOKENS, 0)
    assert w.per_trained == pytest.approx(4 / 3)
    # The committed groups' records went with their payloads; the buffered one's stays.
    assert _records(raw, queue_name) == {f"{ids[3]}:1": GROUP_TOKENS}
    train(q, 1)
    assert _records(raw, queue_name) == {} and q.stats().waste.per_trained == 1.0


def test_stale_evictions_count_their_tokens(open_queue, raw: redis.Redis, queue_name: str) -> None:
    q = open_queue(QueueConfig(max_staleness=1))
    ids = fill_buffer(q, 4, versions=[0, 2, 1, 3])
    q.publish_version(3)  # floor 2: the v0 and v1 groups are evicted stale at lease
    lease = q.lease(2)
    assert [g.entry_id for g in lease.groups] == [ids[1], ids[3]]
    w = q.stats().waste
    assert w.discarded["stale"] == 2 * GROUP_TOKENS and w.trained == 0
    assert set(_records(raw, queue_name)) == {f"{ids[1]}:1", f"{ids[3]}:1"}  # the leased ones' only
    lease.commit()
    w = q.stats().waste
    assert (w.generated, w.trained, w.discarded_total) == (4 * GROUP_TOKENS, 2 * GROUP_TOKENS, 2 * GROUP_TOKENS)
    assert w.per_trained == 2.0 and _records(raw, queue_name) == {}


def test_overflow_counts_the_victim_and_a_self_eviction(open_queue, raw: redis.Redis, queue_name: str) -> None:
    q = open_queue(QueueConfig(max_completed_groups=1, max_staleness=4))
    submit(q, 3)
    w = q.worker("w1")
    res = reserve_all(w, 3)
    complete_all(w, res[:1], versions=1)
    complete_all(w, res[1:2], versions=2)  # fresher: evicts the v1 group (the victim)
    assert w.complete(res[2].receipt, samples_for(res[2], version=0)) == "evicted_self"  # staler
    waste = q.stats().waste
    assert waste.generated == 3 * GROUP_TOKENS and waste.discarded["overflow"] == 2 * GROUP_TOKENS
    assert _records(raw, queue_name) == {f"{res[1].entry_id}:1": GROUP_TOKENS}


@pytest.mark.parametrize("how", ["rollback", "expiry"])
def test_a_lease_rolled_back_or_expired_discards_its_tokens(open_queue, raw: redis.Redis, queue_name: str,
                                                             how: str) -> None:
    q = open_queue(QueueConfig())
    fill_buffer(q, 3)
    lease = q.lease(2)
    if how == "rollback":
        assert lease.rollback() == 2
    else:
        raw.zadd(keys(queue_name)["leases"], {lease.lease_id: 0})  # due now (the index holds the deadline)
        q.reap()
    w = q.stats().waste
    reason = "rolled_back" if how == "rollback" else "expired"
    assert w.discarded[reason] == 2 * GROUP_TOKENS and w.trained == 0, w
    assert len(_records(raw, queue_name)) == 1  # the one still buffered


def test_complete_many_counts_each_adopted_item_once(open_queue, raw: redis.Redis, queue_name: str) -> None:
    q = open_queue(QueueConfig())
    submit(q, 2)
    w = q.worker("w1")
    res = reserve_all(w, 2)
    items = [(r.receipt, samples(2, tokens=5)) for r in res]
    assert w.complete_many(items) == ["buffered", "buffered"]
    assert w.complete_many(items) == ["replay", "replay"]  # a resend adopts nothing again
    assert q.stats().waste.generated == 2 * 2 * 5


@pytest.mark.parametrize("tokens", [-1, 2 ** 31, "1.5", "", "x"])
def test_a_bad_token_count_is_a_rolloutq_error_before_anything_is_written(open_queue, raw: redis.Redis,
                                                                          queue_name: str, tokens: object) -> None:
    q = open_queue(QueueConfig())
    submit(q, 1)
    res = reserve_all(q.worker("w1"), 1)[0]
    before = snapshot(raw, queue_name)
    with pytest.raises(ScriptError, match="ROLLOUTQ.*bad tokens"):
        call_complete(q, res.entry_id, 1, "w1", encode_completion(samples(2)), tokens=tokens)
    assert snapshot(raw, queue_name) == before  # the staged payload deleted too


def test_a_filtered_group_counts_the_tokens_its_worker_generated(open_queue, raw: redis.Redis,
                                                                 queue_name: str) -> None:
    q = open_queue(QueueConfig())
    submit(q, 2)
    w = q.worker("w1")
    res = reserve_all(w, 2)
    assert w.filter(res[0].receipt, "all rewards equal", tokens=40) == "filtered"
    assert w.filter(res[0].receipt, "all rewards equal", tokens=40) == "replay"  # counted once
    assert w.filter(res[1].receipt, "all rewards equal") == "filtered"  # not known: nothing counted
    waste = q.stats().waste
    assert waste.discarded["filtered"] == 40 and waste.generated == 40  # generated, then thrown away


def test_an_abort_keeping_no_progress_counts_what_it_threw_away(open_queue, raw: redis.Redis,
                                                                queue_name: str) -> None:
    q = open_queue(QueueConfig())
    submit(q, 2)
    w = q.worker("w1")
    res = reserve_all(w, 2)
    assert w.abort(res[0].receipt, "weight update", discarded=30) == "ready"
    assert w.abort(res[0].receipt, "weight update", discarded=30) == "replay"  # counted once
    # Progress kept is not thrown away: the next attempt continues it (partial_continued at reserve).
    assert w.abort(res[1].receipt, "drain", progress=samples(2)) == "ready"
    waste = q.stats().waste
    assert waste.discarded["aborted"] == 30 and waste.generated == 30, waste
