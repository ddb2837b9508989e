"""rollback.lua: leased -> ready, against real servers over both transports.

Proves the header's outcomes ('rolled_back', 'replay', 'lease_lost' for unknown / token / committed /
expired) with byte-identical keys on every refusal, and DESIGN: the members go back to ready under
the same entry ID with the pristine payload, in submission order, not counted toward max_attempts.
"""

from __future__ import annotations

import orjson
import pytest

from rollout_queue import LeaseLost, QueueConfig
from tests.contract.conftest import snapshot
from tests.contract.lifecycle import (
    check_header,
    complete_all,
    fill_buffer,
    keys,
    ledger,
    make_groups,
    meta,
    payload_keys,
    pel,
    reserve_all,
    wait_past,
    zmembers,
)


def test_header_matches_builder() -> None:
    check_header("rollback", ["src", "meta", "ready", "leases", "history", "ledger", "dlq", "wake_work"],
                 ["lease_id", "token", "count"])


def test_rollback_requeues_the_same_entries_pristine(open_queue, raw, queue_name) -> None:
    q = open_queue()
    groups = make_groups(3)
    ids = q.submit(groups)
    w = q.worker("w-a")
    complete_all(w, reserve_all(w, 3))
    lease = q.lease(3)
    assert payload_keys(raw, queue_name) == {keys(queue_name).payload(e, 1) for e in ids}  # kept while leased
    assert lease.rollback() == 3
    assert lease.closed == "rolled_back"
    # Same entry IDs, owned by @ready, in submission order; the delivery count is kept.
    assert {e: pel(raw, queue_name)[e] for e in ids} == {e: ("@ready", 1) for e in ids}
    assert zmembers(raw, queue_name, "ready") == ids
    assert payload_keys(raw, queue_name) == set()  # the completions are dropped with the lease
    for entry_id in ids:
        # The ledger still names the attempt that completed: its worker's retry of complete replays.
        assert ledger(raw, queue_name, entry_id) == "a|1|w-a|completed"
        assert orjson.loads(raw.hget(keys(queue_name)["history"], entry_id))["f"] == 0
    record = keys(queue_name).lease(lease.lease_id)
    assert raw.hget(record, "state") == b"rolled_back" and raw.pttl(record) > 0
    assert raw.zscore(keys(queue_name)["leases"], lease.lease_id) is None
    m = meta(raw, queue_name)
    assert (m["leased"], m["rolled_back"], m["retained"]) == ("0", "3", "3")
    # The next attempt sees the original reservation, at attempt 2.
    again = w.reserve(max_groups=3)
    assert [r.entry_id for r in again] == ids
    assert [r.receipt.attempt for r in again] == [2, 2, 2]
    assert [r.group for r in again] == groups


def test_rollbacks_do_not_count_toward_max_attempts(open_queue, raw, queue_name) -> None:
    q = open_queue(QueueConfig(max_attempts=1))
    [entry_id] = fill_buffer(q, 1)
    w = q.worker("w-fill")
    for attempt in (2, 3):
        q.lease(1).rollback()
        [res] = w.reserve(1)
        assert (res.entry_id, res.receipt.attempt) == (entry_id, attempt)
        complete_all(w, [res])
    assert q.stats().dead == 0
    q.lease(1).commit()
    assert q.stats().committed == 1


def test_rollback_replay_returns_zero_and_writes_nothing(open_queue, raw, queue_name) -> None:
    q = open_queue()
    fill_buffer(q, 2)
    lease = q.lease(2)
    assert lease.rollback() == 2
    before = snapshot(raw, queue_name)
    assert lease.rollback() == 0
    assert snapshot(raw, queue_name) == before


@pytest.mark.parametrize("field,value,state", [("lease_id", "no-such-lease", "unknown"),
                                               ("token", "wrong-token", "token")])
def test_rollback_unknown_lease_or_wrong_token_is_lost(open_queue, raw, queue_name, field, value, state) -> None:
    q = open_queue()
    fill_buffer(q, 1)
    lease = q.lease(1)
    setattr(lease, field, value)
    before = snapshot(raw, queue_name)
    with pytest.raises(LeaseLost) as err:
        lease.rollback()
    assert err.value.state == state
    assert snapshot(raw, queue_name) == before


def test_rollback_after_commit_is_lost(open_queue, raw, queue_name) -> None:
    q = open_queue()
    fill_buffer(q, 1)
    lease = q.lease(1)
    lease.commit()
    before = snapshot(raw, queue_name)
    with pytest.raises(LeaseLost) as err:
        lease.rollback()
    assert err.value.state == "committed"
    assert snapshot(raw, queue_name) == before


def test_rollback_after_the_reaper_expired_it_is_lost(open_queue, raw, queue_name) -> None:
    q = open_queue()
    fill_buffer(q, 1)
    lease = q.lease(1, timeout_s=0.05)
    wait_past(raw, lease.deadline_ms)
    assert q.reap().expired == 1
    before = snapshot(raw, queue_name)
    with pytest.raises(LeaseLost) as err:
        lease.rollback()
    assert err.value.state == "expired"
    assert snapshot(raw, queue_name) == before


def test_rolled_back_work_goes_ahead_of_the_backlog(open_queue, raw, queue_name) -> None:
    q = open_queue()
    ids = fill_buffer(q, 2)
    q.lease(2).rollback()
    later = q.submit(make_groups(2))
    got = q.worker("w-b").reserve(max_groups=4)
    assert [r.entry_id for r in got] == ids + later
    assert [r.receipt.attempt for r in got] == [2, 2, 1, 1]


def test_rollback_in_batches_fences_the_lease_from_the_first_call(open_queue, raw, queue_name) -> None:
    from rollout_queue.core import protocol as p
    from tests.contract.lifecycle import execute, owners

    q = open_queue()
    ids = fill_buffer(q, 3)
    lease = q.lease(3)
    call = p.build(q.keys, "rollback", lease_id=lease.lease_id, token=lease.token, count=1)
    assert [p.s(x) if isinstance(x, bytes) else x for x in execute(q, call)] == ["ok", "rolled_back", 1, 0]
    assert owners(raw, queue_name, ids) == ["@ready"] + [f"@lease:{lease.lease_id}"] * 2
    # A commit after the first batch is refused: the record already says rolled_back.
    before = snapshot(raw, queue_name)
    with pytest.raises(LeaseLost) as err:
        lease.commit()
    assert err.value.state == "rolled_back"
    assert snapshot(raw, queue_name) == before
    assert [p.s(x) if isinstance(x, bytes) else x for x in execute(q, call)] == ["ok", "replay", 1, 0]
    # The trainer dies here; the reaper finishes the rollback under the same terminal.
    q.reap()
    assert owners(raw, queue_name, ids) == ["@ready"] * 3
    m = meta(raw, queue_name)
    assert (m["leased"], m["rolled_back"], m.get("expired", "0")) == ("0", "3", "0")
    assert raw.zscore(keys(queue_name)["leases"], lease.lease_id) is None
