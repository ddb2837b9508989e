"""Regressions for the bugs the chaos harness and the bad-input fuzz found: one deterministic test each.

Each test writes the smallest garbage (or bad input) that broke the queue, then proves the fix: a
typed error (a RolloutQueueError, a ROLLOUTQ ScriptError for corrupt state) or a ghost dropped, and
the well-formed group next to it still goes reserve -> complete -> lease -> commit.
"""

from __future__ import annotations

import pytest
import redis

from rollout_queue import InvalidInput, LeaseLost, QueueConfig, RolloutQueue, Sample, ScriptError, SourceGroup
from rollout_queue.core.scripts import counter_home
from tests.helpers import wait_until

CFG = QueueConfig(worker_timeout_s=5.0, lease_timeout_s=30.0, max_payload_bytes=65536)


@pytest.fixture
def q(redis_url: str, queue_name: str) -> RolloutQueue:
    queue = RolloutQueue.from_url(redis_url, queue_name, CFG)
    yield queue
    queue.close()


def _complete_all(q: RolloutQueue, worker: str = "w1") -> list[str]:
    w = q.worker(worker)
    done = []
    for r in w.reserve(16):
        w.complete(r.receipt, [Sample(i, [i + 1]) for i in range(r.group.n)])
        done.append(r.entry_id)
    return done


def _train_all(q: RolloutQueue, want: int) -> set[str]:
    lease = q.lease(want, partial=True)
    assert lease is not None, "the completed groups must be leasable"
    lease.commit()
    return {g.entry_id for g in lease.groups}


def _good(q: RolloutQueue, n: int = 2) -> list[str]:
    return q.submit([SourceGroup(f"good-{i}", f"prompt {i}", 2) for i in range(n)])


# -- garbage in the indexes: a ghost is dropped, the good groups go through -----------------------


def test_non_id_members_in_ready_are_dropped_not_an_xpending_error(q: RolloutQueue, r: redis.Redis) -> None:
    ids = _good(q)
    r.zadd(q.keys["ready"], {"abc": 0, b"\xff": 1, "1-1": 2})
    assert sorted(_complete_all(q)) == sorted(ids)
    assert _train_all(q, 2) == set(ids)
    assert r.zcard(q.keys["ready"]) == 0


def test_non_id_members_in_the_buffer_do_not_block_leases(q: RolloutQueue, r: redis.Redis) -> None:
    ids = _good(q)
    _complete_all(q)
    for key in ("buffer", "bufver"):
        r.zadd(q.keys[key], {"abc": 0, "1-1": 0})
    assert _train_all(q, 2) == set(ids)
    assert r.zcard(q.keys["buffer"]) == 0 and r.zcard(q.keys["bufver"]) == 0


def test_a_buffer_member_owned_by_a_worker_is_a_ghost_not_a_bug(q: RolloutQueue, r: redis.Redis) -> None:
    ids = _good(q, 3)
    w = q.worker("w1")
    first, second, third = w.reserve(3)
    w.complete(first.receipt, [Sample(0, [1]), Sample(1, [1])])
    r.zadd(q.keys["buffer"], {third.entry_id: 0})  # executing, but indexed as completed by hand
    r.zadd(q.keys["bufver"], {third.entry_id: 0})
    lease = q.lease(2, partial=True)
    assert lease is not None and [g.entry_id for g in lease.groups] == [first.entry_id]
    lease.commit()
    w.complete(third.receipt, [Sample(0, [1]), Sample(1, [1])])  # still the worker's to settle
    w.complete(second.receipt, [Sample(0, [1]), Sample(1, [1])])
    assert _train_all(q, 2) == {second.entry_id, third.entry_id}
    assert q.stats().committed == len(ids)


def test_garbage_in_kept_never_deletes_or_steals_a_live_group(q: RolloutQueue, r: redis.Redis) -> None:
    ids = _good(q, 2)
    w = q.worker("w1")
    live = w.reserve(1)[0]
    r.zadd(q.keys["kept"], {"abc": 0, live.entry_id: 0, ids[1]: 0})  # executing, backlog, not an ID
    assert q.checkpoint(5) == 0
    assert q.restore(5) == 0
    w.complete(live.receipt, [Sample(0, [1]), Sample(1, [1])])  # still owned, payload intact
    _complete_all(q)
    assert _train_all(q, 2) == set(ids)


def test_holds_nobody_could_have_opened_do_not_close_admission(q: RolloutQueue, r: redis.Redis) -> None:
    ids = _good(q)
    r.zadd(q.keys["holds"], {"forever": float("inf"), b"\xff bad id": 9e15})
    assert sorted(_complete_all(q)) == sorted(ids)
    assert _train_all(q, 2) == set(ids)


def test_queue_owner_names_in_workers_never_count_failures(q: RolloutQueue, r: redis.Redis) -> None:
    ids = _good(q)
    w = q.worker("w1")
    for res in w.reserve(2):
        w.abort(res.receipt)  # both groups now owned by @ready
    r.zadd(q.keys["workers"], {"@ready": 0, "@done": 0, "": 0})
    assert q.reap().lost == 0
    assert sorted(_complete_all(q, "w2")) == sorted(ids)  # reserve's opportunistic reaping skips them too
    assert q.stats().terminals["lost"] == 0
    assert _train_all(q, 2) == set(ids)


def test_reaper_passes_names_that_are_not_utf8(q: RolloutQueue, r: redis.Redis) -> None:
    ids = _good(q)
    r.zadd(q.keys["workers"], {b"\xffw": 0})
    r.zadd(q.keys["leases"], {b"\xfe lease": 0})
    report = q.reap()
    assert report.lost == 0 and report.expired == 0
    assert r.zcard(q.keys["workers"]) == 0 and r.zcard(q.keys["leases"]) == 0
    _complete_all(q)
    assert _train_all(q, 2) == set(ids)


# -- corrupt meta: a ROLLOUTQ error that names the field, not a Lua runtime error ------------------


@pytest.mark.parametrize("field,value", [("max_completed_groups", "abc"), ("worker_timeout_ms", "")])
def test_corrupt_meta_is_a_rolloutq_error_naming_the_field(q: RolloutQueue, r: redis.Redis, field: str,
                                                           value: str) -> None:
    _good(q)
    key = q.keys[counter_home(field)]
    before = r.hget(key, field)
    r.hset(key, field, value)
    for call in (lambda: q.worker("w1").reserve(1), q.reap, lambda: q.lease(1), q.stats):
        with pytest.raises(ScriptError, match=f"ROLLOUTQ corrupt .*{field}"):
            call()
    r.hset(key, field, before) if before is not None else r.hdel(key, field)
    assert len(_complete_all(q)) == 2


@pytest.mark.parametrize("field,value", [("executing_samples", "1.5"), ("retained", "x")])
def test_a_corrupt_counter_is_reset_and_counted_not_fatal(q: RolloutQueue, r: redis.Redis, field: str,
                                                          value: str) -> None:
    """The counters hash is the worker role's to write (data layout 4), so garbage there must not stop
    every script of every role as garbage in meta's config does: the next script resets it to 0 and
    counts it in counters_repaired (load_config.lua)."""
    _good(q)
    key = q.keys[counter_home(field)]
    assert key == q.keys["counters"]
    r.hset(key, field, value)
    q.stats()  # a read-only role's script leaves the repair to the next writer, and still answers
    q.worker("w1").reserve(1)
    assert r.hget(key, field) is not None and r.hget(key, field).lstrip(b"-").isdigit()
    assert r.hget(key, "counters_repaired") == b"1"
    assert len(_complete_all(q)) >= 1


def test_a_script_error_after_a_noscript_reload_is_typed(q: RolloutQueue, r: redis.Redis) -> None:
    r.hset(q.keys["meta"], "max_completed_groups", "abc")
    r.script_flush()  # the next call reloads the script, and that retried call fails
    with pytest.raises(ScriptError, match="ROLLOUTQ"):
        q.worker("w1").reserve(1)
    r.hset(q.keys["meta"], "max_completed_groups", str(CFG.max_completed_groups))


def test_a_plain_read_of_a_key_of_the_wrong_type_is_typed(q: RolloutQueue, r: redis.Redis) -> None:
    r.set(q.keys["dlq"], "not a stream")
    with pytest.raises(ScriptError, match="WRONGTYPE"):
        q.dead_letters()
    r.delete(q.keys["dlq"])


# -- lenient views over garbage written by hand --------------------------------------------------


def test_dead_letters_and_stats_read_garbage_leniently(q: RolloutQueue, r: redis.Redis) -> None:
    r.xadd(q.keys["dlq"], {"attempt": "abc", "entry_id": b"\xff", "history": '{"h": 5}', "reason": b"\xfe"})
    r.hset(q.keys["meta"], mapping={"zzz": b"\xff"})
    r.hset(q.keys["counters"], mapping={"filtered_reason:x": "\u00b2"})
    (letter,) = q.dead_letters()
    assert (letter.attempt, letter.history, letter.group) == (0, (), None)
    assert q.stats().filtered_by_reason == {}


# -- text that is not UTF-8 through the public API ------------------------------------------------


def test_text_that_is_not_utf8_is_invalid_input_or_escaped(q: RolloutQueue) -> None:
    with pytest.raises(InvalidInput, match="source_id"):
        SourceGroup("s\udcff", "prompt", 2)
    with pytest.raises(InvalidInput, match="prompt"):
        SourceGroup("s", "bad \udcff", 2)
    with pytest.raises(InvalidInput, match="finish_reason"):
        Sample(0, [1], finish_reason="\udcff")
    with pytest.raises(InvalidInput, match="weights_uri"):
        q.publish_version(1, "s3://\udcff")
    (eid,) = _good(q, 1)
    w = q.worker("w1")
    (res,) = w.reserve(1)
    assert w.fail(res.receipt, "engine said \udcff") == "ready"  # a reason is escaped, never refused
    (again,) = w.reserve(1)
    assert again.entry_id == eid



# -- a lease record edited by hand ---------------------------------------------------------------


def test_a_lease_deadline_that_is_not_a_number_means_expired(q: RolloutQueue, r: redis.Redis) -> None:
    ids = _good(q)
    _complete_all(q)
    lease = q.lease(2)
    r.hset(q.keys.lease(lease.lease_id), "deadline", "junk")
    with pytest.raises(LeaseLost, match="expired"):
        lease.commit()
    with pytest.raises(LeaseLost, match="expired"):
        lease.extend(5)
    assert q.reap().expired == 0  # no nil compare: it is due by its index score, not yet
    assert lease.rollback() == 2
    _complete_all(q)
    assert _train_all(q, 2) == set(ids)


def test_a_lease_record_naming_other_members_is_corrupt_state(q: RolloutQueue, r: redis.Redis) -> None:
    ids = _good(q)
    _complete_all(q)
    lease = q.lease(2)
    r.hset(q.keys.lease(lease.lease_id), "members", f"{ids[0]},1-1")
    with pytest.raises(ScriptError, match="ROLLOUTQ corrupt lease record"):
        lease.commit()
    assert lease.rollback() == 2  # nothing was written: the PEL still gives both groups to the lease
    _complete_all(q)
    assert _train_all(q, 2) == set(ids)


@pytest.mark.parametrize("deadline", ["inf", "99999999999999", "nan"])
def test_a_lease_record_edited_to_never_expire_still_expires_by_its_index(q: RolloutQueue, r: redis.Redis,
                                                                          deadline: str) -> None:
    ids = _good(q)
    _complete_all(q)
    lease = q.lease(2, timeout_s=0.2)
    r.hset(q.keys.lease(lease.lease_id), "deadline", deadline)
    wait_until(lambda: q.reap().expired == 2, timeout=5.0, message="the lease expired by its index score")
    _complete_all(q)
    assert _train_all(q, 2) == set(ids)


def test_an_active_lease_missing_from_the_index_is_an_orphan_due_now(q: RolloutQueue, r: redis.Redis) -> None:
    ids = _good(q)
    _complete_all(q)
    lease = q.lease(2)
    r.zrem(q.keys["leases"], lease.lease_id)
    report = q.reap()
    assert (report.orphans, report.expired) == (0, 2)  # found as an @lease consumer with no index entry
    _complete_all(q)
    assert _train_all(q, 2) == set(ids)
