"""expire_lease.lua: the reaper's rollback of a lease past its deadline, against real servers.

Proves the header's outcomes ('expired' for an overdue lease and for an @lease consumer with no
active record; 'not_due' for a live or settled lease, with every key byte-identical), that expiry is
not counted toward max_attempts, and the invariant: a commit racing the reaper either lands first or
raises LeaseLost and the reaper requeues the group, never both and never neither.
"""

from __future__ import annotations

import random
import threading

import orjson
import pytest

from rollout_queue import LeaseLost, QueueConfig, RolloutQueue
from rollout_queue.core import flows
from rollout_queue.core import protocol as p
from tests.contract.conftest import snapshot
from tests.contract.lifecycle import (
    check_header,
    complete_all,
    execute,
    fill_buffer,
    keys,
    ledger,
    meta,
    owners,
    payload_keys,
    pel,
    reserve_all,
    server_ms,
    submit,
    wait_past,
    zmembers,
)
from tests.helpers import wait_until


def test_header_matches_builder() -> None:
    check_header("expire_lease", ["src", "meta", "ready", "leases", "history", "ledger", "dlq", "parked", "settled", "wake_work", "counters", "leased"],
                 ["lease_id", "count"])


def _expire(q, lease_id: str, count: int = 200) -> list:
    reply = execute(q, p.build(q.keys, "expire_lease", lease_id=lease_id, count=count))
    return [p.s(x) if isinstance(x, bytes) else x for x in reply]


def test_a_live_lease_is_not_due(open_queue, raw, queue_name) -> None:
    q = open_queue()
    fill_buffer(q, 1)
    lease = q.lease(1, timeout_s=30)
    before = snapshot(raw, queue_name)
    assert _expire(q, lease.lease_id)[0] == "not_due"
    assert snapshot(raw, queue_name) == before


@pytest.mark.parametrize("settle", ["commit", "rollback"])
def test_a_settled_lease_is_not_due(open_queue, raw, queue_name, settle) -> None:
    q = open_queue()
    fill_buffer(q, 1)
    lease = q.lease(1, timeout_s=0.05)
    getattr(lease, settle)()
    wait_past(raw, lease.deadline_ms)
    before = snapshot(raw, queue_name)
    assert _expire(q, lease.lease_id)[0] == "not_due"
    assert _expire(q, "never-existed")[0] == "not_due"
    assert snapshot(raw, queue_name) == before


def test_an_overdue_lease_goes_back_to_ready(open_queue, raw, queue_name) -> None:
    q = open_queue(QueueConfig(max_attempts=1))
    ids = fill_buffer(q, 2)
    lease = q.lease(2, timeout_s=0.05)
    assert payload_keys(raw, queue_name) == {keys(queue_name).payload(e, 1) for e in ids}  # kept while leased
    wait_past(raw, lease.deadline_ms)
    report = q.reap()
    assert report.expired == 2 and report.dead == 0
    assert {e: pel(raw, queue_name)[e] for e in ids} == {e: ("@ready", 1) for e in ids}
    assert zmembers(raw, queue_name, "ready") == ids
    assert payload_keys(raw, queue_name) == set()  # the members' completions are dropped
    for entry_id in ids:
        h = orjson.loads(raw.hget(keys(queue_name)["history"], entry_id))
        assert h["f"] == 0 and [x["t"] for x in h["h"]] == ["expired"]
    record = keys(queue_name).lease(lease.lease_id)
    assert raw.hget(record, "state") == b"expired"
    assert raw.zscore(keys(queue_name)["leases"], lease.lease_id) is None
    m = meta(raw, queue_name)
    assert (m["leased"], m["expired"]) == ("0", "2")
    # A second pass finds nothing; the group is generated again (not dead at max_attempts=1).
    assert q.reap().expired == 0
    assert _expire(q, lease.lease_id)[0] == "not_due"
    assert [r.receipt.attempt for r in q.worker("w-b").reserve(2)] == [2, 2]


def test_an_lease_consumer_without_a_record_is_requeued(open_queue, raw, queue_name) -> None:
    q = open_queue()
    [entry_id] = fill_buffer(q, 1)
    lease = q.lease(1, timeout_s=30)
    # The record is lost (deleted by hand): the @lease consumer is an orphan the reaper recovers.
    raw.delete(keys(queue_name).lease(lease.lease_id))
    raw.zrem(keys(queue_name)["leases"], lease.lease_id)
    assert q.reap().expired == 1
    assert owners(raw, queue_name, [entry_id]) == ["@ready"]
    assert raw.exists(keys(queue_name).lease(lease.lease_id)) == 0
    assert q.stats().leased == 0
    assert _expire(q, lease.lease_id)[0] == "not_due"


def test_commit_racing_the_reaper_is_exactly_one_outcome(open_queue, raw, queue_name, redis_url) -> None:
    rounds = 10
    q = open_queue()
    # Spares: a 30 ms lease can expire before the flow's second round trip reads its payloads (a
    # loaded machine, this process's reaper thread holding the GIL); the reaper requeues the member,
    # the flow finds its payload gone and leases the next group (trainer.lease). CI met it once.
    filled = len(fill_buffer(q, rounds + 10))
    reaper = RolloutQueue.from_url(redis_url, queue_name)
    stop = threading.Event()

    def reap_forever() -> None:
        while not stop.is_set():
            reaper.reap()

    t = threading.Thread(target=reap_forever)
    t.start()
    rng = random.Random(7)
    outcomes = []
    try:
        for _ in range(rounds):
            lease = q.lease(1, timeout_s=0.03)
            assert lease is not None, q.stats()
            [entry_id] = [g.entry_id for g in lease.groups]
            # Commit around the deadline (server clock), on either side of it.
            aim = lease.deadline_ms + rng.randint(-6, 6)
            wait_until(lambda: server_ms(raw) >= aim, timeout=5, interval=0.001)
            try:
                lease.commit()
                committed = True
            except LeaseLost as err:
                assert err.state == "expired"
                committed = False
                # The reaper, not the trainer, requeues it.
                wait_until(lambda: owners(raw, queue_name, [entry_id]) == ["@ready"], timeout=5)
            lines = [kv for _, kv in raw.xrange(keys(queue_name)["commits"])]
            in_commits = any(kv[b"lease"].decode() == lease.lease_id for kv in lines)
            ready = entry_id in zmembers(raw, queue_name, "ready")
            state = raw.hget(keys(queue_name).lease(lease.lease_id), "state")
            if committed:
                assert in_commits and not ready and entry_id not in pel(raw, queue_name)
                assert state == b"committed"
                assert ledger(raw, queue_name, entry_id).startswith("s|committed|")
            else:
                assert ready and not in_commits and state == b"expired"
            outcomes.append(committed)
    finally:
        stop.set()
        t.join()
        reaper.close()
    s = q.stats()
    assert s.committed == outcomes.count(True)
    assert s.ready >= outcomes.count(False)  # plus any requeued before its payloads were read
    assert s.committed + s.ready + s.completed == filled and s.leased == 0  # nothing lost, none owned


def test_expiry_in_batches(open_queue, raw, queue_name) -> None:
    q = open_queue()
    ids = fill_buffer(q, 2)
    lease = q.lease(2, timeout_s=0.05)
    wait_past(raw, lease.deadline_ms)
    assert _expire(q, lease.lease_id, count=1) == ["ok", "expired", 1, 0]
    assert owners(raw, queue_name, ids) == ["@ready", f"@lease:{lease.lease_id}"]
    with pytest.raises(LeaseLost) as err:
        lease.commit()
    assert err.value.state == "expired"
    assert _expire(q, lease.lease_id, count=1) == ["ok", "expired", 1, 0]
    assert _expire(q, lease.lease_id, count=1)[0] == "not_due"
    assert owners(raw, queue_name, ids) == ["@ready", "@ready"]
    assert raw.zscore(keys(queue_name)["leases"], lease.lease_id) is None
    assert q.stats().leased == 0


def test_one_expiry_batch_keeps_each_members_attempt_and_history(open_queue, raw, queue_name) -> None:
    q = open_queue(QueueConfig(max_attempts=5))
    ids = submit(q, 3)
    w = q.worker("w-a")
    [first] = w.reserve(1)
    w.fail(first.receipt, "flaky")  # ids[0] has a history (one counted failure) and will be attempt 2
    got = reserve_all(w, 3)
    assert [(r.entry_id, r.receipt.attempt) for r in got] == [(ids[0], 2), (ids[1], 1), (ids[2], 1)]
    complete_all(w, got)
    assert payload_keys(raw, queue_name) == {keys(queue_name).payload(e, a) for e, a in zip(ids, (2, 1, 1))}
    lease = q.lease(3, timeout_s=0.05)
    wait_past(raw, lease.deadline_ms)
    assert _expire(q, lease.lease_id, count=flows.BATCH) == ["ok", "expired", 3, 1]
    assert {e: pel(raw, queue_name)[e] for e in ids} == {ids[0]: ("@ready", 2), ids[1]: ("@ready", 1),
                                                         ids[2]: ("@ready", 1)}
    assert zmembers(raw, queue_name, "ready") == ids
    h = [orjson.loads(raw.hget(keys(queue_name)["history"], e)) for e in ids]
    assert h[0]["f"] == 1 and [(x["a"], x["t"], x["r"]) for x in h[0]["h"]] == [(1, "failed", "flaky"),
                                                                               (2, "expired", "expired")]
    assert all(x["f"] == 0 and [(y["a"], y["t"]) for y in x["h"]] == [(1, "expired")] for x in h[1:])
    assert payload_keys(raw, queue_name) == set()  # each member's, at its own attempt (2, 1, 1)
    assert [ledger(raw, queue_name, e) for e in ids] == ["a|2|w-a|completed", "a|1|w-a|completed", "a|1|w-a|completed"]
    s = q.stats()
    assert (s.leased, s.ready, s.retained, s.terminals["expired"], s.terminals["failed"]) == (0, 3, 3, 3, 1)
    assert [r.receipt.attempt for r in q.worker("w-b").reserve(3)] == [3, 2, 2]


def test_expiry_of_exactly_one_batch(open_queue, raw, queue_name) -> None:
    # A full batch may leave more members: the lease stays due until a call finds the @lease
    # consumer empty, deletes it and takes the lease out of the deadline index.
    q = open_queue()
    ids = fill_buffer(q, flows.BATCH, n=1)
    lease = q.lease(flows.BATCH, timeout_s=0.05)
    wait_past(raw, lease.deadline_ms)
    assert _expire(q, lease.lease_id, count=flows.BATCH) == ["ok", "expired", flows.BATCH, 0]
    assert raw.zscore(keys(queue_name)["leases"], lease.lease_id) == 0
    assert _expire(q, lease.lease_id, count=flows.BATCH)[0] == "not_due"
    assert raw.zscore(keys(queue_name)["leases"], lease.lease_id) is None
    assert pel(raw, queue_name) == {e: ("@ready", 1) for e in ids}
    assert sorted(zmembers(raw, queue_name, "ready")) == sorted(ids)
    s = q.stats()
    assert (s.leased, s.ready, s.terminals["expired"]) == (0, flows.BATCH, flows.BATCH)
