"""revoke_lease.lua: an operator rolls a lease back by its id alone, against real servers over both
transports (ops/actions.revoke_lease, what `rollout-queue leases rollback` runs).

Proves the header's outcomes ('rolled_back', then 'replay' for a rollback already under way;
'lease_lost' for an unknown, committed or expired lease, with every key byte-identical), and the
invariant: from the first call the holder's commit is refused (nothing it trained is committed), the
groups go back to ready not counted, and a revoke cut short after its first batch is finished by the
reaper.
"""

from __future__ import annotations

import pytest

from rollout_queue import LeaseLost, NotFound
from rollout_queue.core import protocol as p
from rollout_queue.ops import actions
from tests.contract.conftest import snapshot
from tests.contract.lifecycle import check_header, execute, fill_buffer, history, keys, meta, owners, wait_past


def test_header_matches_builder() -> None:
    check_header("revoke_lease", ["src", "meta", "ready", "leases", "history", "ledger", "dlq", "parked", "settled",
                                  "wake_work", "counters", "leased"], ["lease_id", "reason", "count"])


def test_a_revoked_lease_goes_back_to_ready_and_its_holder_cannot_commit(open_queue, raw, queue_name) -> None:
    q = open_queue()
    ids = fill_buffer(q, 3)
    lease = q.lease(3)
    assert q.run(actions.revoke_lease(q.keys, lease.lease_id, "trainer host is down")) == ("rolled_back", 3)
    assert owners(raw, queue_name, ids) == ["@ready"] * 3
    record = keys(queue_name).lease(lease.lease_id)
    assert raw.hget(record, "state") == b"rolled_back" and raw.hget(record, "revoked") == b"trainer host is down"
    assert all(not any(h.get("t") in ("failed", "lost") for h in history(raw, queue_name, e)) for e in ids)
    assert meta(raw, queue_name).get("rolled_back") == "3"
    with pytest.raises(LeaseLost) as err:
        lease.commit(step=1)
    assert err.value.state == "rolled_back"
    assert q.stats().committed == 0
    # Asked again: the rollback is done, and says so without moving anything.
    assert q.run(actions.revoke_lease(q.keys, lease.lease_id)) == ("replay", 0)


@pytest.mark.parametrize("settle", ["commit", "expire"])
def test_a_committed_or_expired_lease_is_refused_and_nothing_is_written(open_queue, raw, queue_name, settle) -> None:
    q = open_queue()
    fill_buffer(q, 1)
    lease = q.lease(1, timeout_s=0.2, beat=False)
    if settle == "commit":
        lease.commit()
    else:
        wait_past(raw, lease.deadline_ms)
        q.reap()
    before = snapshot(raw, queue_name)
    with pytest.raises(actions.OperatorRefused, match="nothing to roll back"):
        q.run(actions.revoke_lease(q.keys, lease.lease_id))
    assert snapshot(raw, queue_name) == before


def test_an_unknown_lease_is_not_found(open_queue, raw, queue_name) -> None:
    q = open_queue()
    fill_buffer(q, 1)
    before = snapshot(raw, queue_name)
    with pytest.raises(NotFound, match="lease no-such-lease not found"):
        q.run(actions.revoke_lease(q.keys, "no-such-lease"))
    with pytest.raises(ValueError, match="not a lease id"):
        q.run(actions.revoke_lease(q.keys, "bad id!"))
    assert snapshot(raw, queue_name) == before


def test_a_revoke_cut_after_its_first_batch_is_fenced_and_the_reaper_finishes_it(open_queue, raw,
                                                                                 queue_name) -> None:
    q = open_queue()
    ids = fill_buffer(q, 3)
    lease = q.lease(3)
    reply = execute(q, p.build(q.keys, "revoke_lease", lease_id=lease.lease_id, reason="cut", count=1))
    assert p.parse_revoke_lease(reply, lease.lease_id) == ("rolled_back", 1, False)
    with pytest.raises(LeaseLost):
        lease.commit()
    assert q.reap().expired == 2  # the rest, finished plain by expire_lease
    assert owners(raw, queue_name, ids) == ["@ready"] * 3
