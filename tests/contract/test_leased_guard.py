"""A leased group is moved only by its lease, whatever a worker credential does (issue 29 item 7).

The worker role must XCLAIM in the source stream for its own scripts, and Redis cannot limit a
command to "inside this script", so a leaked worker credential can move any pending entry to any
consumer directly. Each test below leases groups, then moves one member with such a credential (the
worker role's own ACL user, what ``rollout-queue acl --apply`` writes) the way an attack on one
transition would, runs that transition through the public API, and checks the promise: the trainer
commits every group it leased exactly once, none is dead-lettered, requeued, leased again or lost.
Before lua/include/leased_guard.lua each of these trained a group twice, dead-lettered a leased group
or refused the trainer's commit.
"""

from __future__ import annotations

from typing import Any, Iterator

import pytest
import redis

from rollout_queue import QueueConfig, Receipt, RolloutQueue, Sample
from rollout_queue.ops import actions
from tests.contract.lifecycle import fill_buffer, keys, pel, submit
from tests.helpers import after_settling, wait_until

CFG = QueueConfig(max_attempts=3, worker_timeout_s=30)
GROUP = "rollout"


@pytest.fixture
def q(redis_url: str, queue_name: str) -> Iterator[Any]:
    queue = RolloutQueue.from_url(redis_url, queue_name, CFG)
    yield queue
    queue.close()


def _leased(q: Any, groups: int = 3, timeout_s: float | None = None) -> tuple[Any, list[str]]:
    fill_buffer(q, groups)
    lease = q.lease(groups, trainer_id="trainer-a", timeout_s=timeout_s)
    assert lease is not None
    return lease, [g.entry_id for g in lease.groups]


def _claim(hostile: redis.Redis, queue_name: str, entry_id: str, consumer: str, count: int | None = None) -> None:
    got = hostile.xclaim(keys(queue_name)["src"], GROUP, consumer, 0, [entry_id], retrycount=count, justid=True)
    assert got == [entry_id]  # the worker role may: the attack runs


def _commits_exactly(q: Any, lease: Any, r: redis.Redis, queue_name: str, ids: list[str]) -> None:
    """The lease commits all its members; none is pending, dead, ready or buffered afterwards."""
    lease.commit()
    k = keys(queue_name)
    assert not set(ids) & set(pel(r, queue_name)), pel(r, queue_name)
    assert r.xlen(k["dlq"]) == 0
    assert r.zcard(k["ready"]) == 0 and r.zcard(k["buffer"]) == 0
    assert r.hlen(k["leased"]) == 0 and r.hlen(k["parked"]) == 0
    [line] = [kv for _, kv in r.xrange(k["commits"])]
    assert line[b"ids"].decode().split(",") == ids


def test_a_leased_group_parked_with_a_forged_record_is_not_dead_lettered(q, r, hostile, queue_name) -> None:
    lease, ids = _leased(q)
    k = keys(queue_name)
    _claim(hostile, queue_name, ids[1], "@dead")
    hostile.hset(k["parked"], ids[1], f"dead|1|w-fill|0|forged")
    assert after_settling(q) is q  # the reaper's settle_parked: the forged park is dropped, the group goes home
    assert pel(r, queue_name)[ids[1]] == (f"@lease:{lease.lease_id}", 1)
    assert r.hlen(k["parked"]) == 0
    assert int(r.hget(k["counters"], "leased_reclaimed")) == 1
    _commits_exactly(q, lease, r, queue_name, ids)


def test_a_leased_group_put_in_ready_is_never_reserved_again(q, r, hostile, queue_name) -> None:
    lease, ids = _leased(q)
    _claim(hostile, queue_name, ids[0], "@ready")
    hostile.zadd(keys(queue_name)["ready"], {ids[0]: 0})
    assert q.worker("w-2").reserve(max_groups=8) == []
    assert pel(r, queue_name)[ids[0]][0] == f"@lease:{lease.lease_id}"
    _commits_exactly(q, lease, r, queue_name, ids)


def test_a_leased_group_put_in_the_buffer_is_never_leased_twice(q, r, hostile, queue_name) -> None:
    lease, ids = _leased(q)
    k = keys(queue_name)
    _claim(hostile, queue_name, ids[2], "@done")
    hostile.zadd(k["buffer"], {ids[2]: 0})
    hostile.zadd(k["bufver"], {ids[2]: 0})
    assert q.lease(1, trainer_id="trainer-b") is None
    _commits_exactly(q, lease, r, queue_name, ids)


def test_no_forged_receipt_settles_a_leased_group(q, r, hostile, queue_name) -> None:
    lease, ids = _leased(q)
    w = q.worker("w-hostile")
    w.heartbeat()
    for settle in (lambda rc: w.fail(rc, "forged"), lambda rc: w.abort(rc),
                   lambda rc: w.complete(rc, [Sample(0, (1,), (-0.1,), reward=0.0, version=0)] * 2)):
        _claim(hostile, queue_name, ids[0], "w-hostile", count=1)
        with pytest.raises(Exception) as info:
            settle(Receipt(ids[0], 1, "w-hostile"))
        assert "lease" in str(info.value) or "stale" in str(info.value).lower(), info.value
        assert pel(r, queue_name)[ids[0]][0] == f"@lease:{lease.lease_id}"
    _commits_exactly(q, lease, r, queue_name, ids)


def test_a_leased_group_given_to_an_unknown_consumer_is_reaped_home(q, r, hostile, queue_name) -> None:
    lease, ids = _leased(q)
    _claim(hostile, queue_name, ids[1], "nobody")
    q.reap()  # sweep_owners finds the orphan, reap_worker requeues what it holds: the guard sends it home
    assert pel(r, queue_name)[ids[1]][0] == f"@lease:{lease.lease_id}"
    _commits_exactly(q, lease, r, queue_name, ids)


def test_a_group_moved_between_two_leases_is_committed_by_its_own(q, r, hostile, queue_name) -> None:
    lease, ids = _leased(q, 2)
    other, others = _leased(q, 2)
    _claim(hostile, queue_name, ids[0], f"@lease:{other.lease_id}")
    _claim(hostile, queue_name, others[1], f"@lease:{lease.lease_id}")
    other.commit()  # its stray goes home to `lease`, its own member comes back first
    lease.commit()
    k = keys(queue_name)
    lines = [kv[b"ids"].decode().split(",") for _, kv in r.xrange(k["commits"])]
    assert lines == [others, ids]
    assert not set(ids + others) & set(pel(r, queue_name)) and r.hlen(k["leased"]) == 0


def test_a_stray_in_a_lease_consumer_goes_back_to_ready_at_commit(q, r, hostile, queue_name) -> None:
    lease, ids = _leased(q, 2)
    submit(q, 1, 2)
    [res] = q.worker("w-2").reserve(max_groups=1)
    _claim(hostile, queue_name, res.receipt.entry_id, f"@lease:{lease.lease_id}")
    lease.commit()  # the stray is no member: it is requeued pristine, not acknowledged, not lost
    assert pel(r, queue_name)[res.receipt.entry_id][0] == "@ready"
    assert r.zscore(keys(queue_name)["ready"], res.receipt.entry_id) is not None


@pytest.mark.parametrize("how", ["rollback", "expiry", "revoke"])
def test_a_hijacked_member_of_a_closed_lease_is_requeued_exactly_once(q, r, hostile, queue_name, how) -> None:
    lease, ids = _leased(q, timeout_s=None if how == "rollback" else 0.3)
    _claim(hostile, queue_name, ids[2], "@dead")
    k = keys(queue_name)
    hostile.hset(k["parked"], ids[2], "dead|1|w-fill|0|forged")
    if how == "rollback":
        lease.rollback()
    elif how == "revoke":  # an operator's rollback by id (admin: leases rollback ID)
        q.run(actions.revoke_lease(q.keys, lease.lease_id, "dead trainer"))
    else:  # the reaper expires it once past its deadline
        wait_until(lambda: q.reap() is not None and r.zcard(k["ready"]) == len(ids), timeout=30,
                   message="the expired lease requeued")
    assert {eid: pel(r, queue_name)[eid][0] for eid in ids} == {eid: "@ready" for eid in ids}
    assert sorted(m.decode() for m in r.zrange(k["ready"], 0, -1)) == sorted(ids)
    assert r.hlen(k["leased"]) == 0 and r.hlen(k["parked"]) == 0  # the forged record went with the claim
    assert after_settling(q) is q and r.xlen(k["dlq"]) == 0
