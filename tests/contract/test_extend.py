"""extend.lua: move an active lease's deadline, against real servers over both transports.

Proves the header's outcomes: 'ok' with the new deadline (server clock), and 'lease_lost' for an
expired, unknown, wrong-token or settled lease with every key byte-identical; and that an extended
lease outlives its first deadline (the reaper leaves it alone, the commit lands).
"""

from __future__ import annotations

import pytest

from rollout_queue import LeaseLost
from tests.contract.conftest import snapshot
from tests.contract.lifecycle import check_header, fill_buffer, keys, owners, pel, server_ms, wait_past


def test_header_matches_builder() -> None:
    check_header("extend", ["meta", "leases"], ["lease_id", "token", "ms"])


def test_extend_moves_the_deadline(open_queue, raw, queue_name) -> None:
    q = open_queue()
    [entry_id] = fill_buffer(q, 1)
    lease = q.lease(1, timeout_s=0.2)
    first = lease.deadline_ms
    before = server_ms(raw)
    new = lease.extend(30)
    after = server_ms(raw)
    assert before + 30_000 <= new <= after + 30_000
    assert lease.deadline_ms == new > first
    assert int(raw.hget(keys(queue_name).lease(lease.lease_id), "deadline")) == new
    assert raw.zscore(keys(queue_name)["leases"], lease.lease_id) == new
    # Past the first deadline the lease is still alive: the reaper and the opportunistic sweep leave it.
    wait_past(raw, first)
    assert q.reap().expired == 0
    assert q.lease(1) is None
    assert owners(raw, queue_name, [entry_id]) == [f"@lease:{lease.lease_id}"]
    lease.commit()
    assert entry_id not in pel(raw, queue_name)


def test_extend_refuses_after_expiry(open_queue, raw, queue_name) -> None:
    q = open_queue()
    fill_buffer(q, 1)
    lease = q.lease(1, timeout_s=0.05)
    wait_past(raw, lease.deadline_ms)
    before = snapshot(raw, queue_name)
    with pytest.raises(LeaseLost) as err:
        lease.extend(30)
    assert err.value.state == "expired"
    assert snapshot(raw, queue_name) == before, "an expired lease stays the reaper's"
    assert q.reap().expired == 1


@pytest.mark.parametrize("field,value,state", [("lease_id", "no-such-lease", "unknown"),
                                               ("token", "wrong-token", "token")])
def test_extend_unknown_lease_or_wrong_token_is_lost(open_queue, raw, queue_name, field, value, state) -> None:
    q = open_queue()
    fill_buffer(q, 1)
    lease = q.lease(1)
    setattr(lease, field, value)
    before = snapshot(raw, queue_name)
    with pytest.raises(LeaseLost) as err:
        lease.extend(30)
    assert err.value.state == state
    assert snapshot(raw, queue_name) == before


@pytest.mark.parametrize("settle,state", [("commit", "committed"), ("rollback", "rolled_back")])
def test_extend_a_settled_lease_is_lost(open_queue, raw, queue_name, settle, state) -> None:
    q = open_queue()
    fill_buffer(q, 1)
    lease = q.lease(1)
    getattr(lease, settle)()
    before = snapshot(raw, queue_name)
    with pytest.raises(LeaseLost) as err:
        lease.extend(30)
    assert err.value.state == state
    assert snapshot(raw, queue_name) == before
