"""commit.lua: leased -> settled(committed), against real servers over both transports.

Proves the header's outcomes ('committed', 'replay', 'lease_lost' for unknown / token / expired /
rolled_back) and that every refusal leaves every key byte-identical; that a commit XACKs and XDELs
each member, writes one commits line, the ledger and the counters; and that commit(step=k) keeps
the pristine entries for restore until a checkpoint covers k.
"""

from __future__ import annotations

import pytest

from rollout_queue import LeaseLost
from tests.contract.conftest import snapshot
from tests.contract.lifecycle import (
    check_header,
    fill_buffer,
    keys,
    ledger,
    meta,
    owners,
    payload_keys,
    pel,
    stream_ids,
    wait_past,
)


def test_header_matches_builder() -> None:
    check_header("commit", ["src", "meta", "leases", "ledger", "commits", "kept", "wake_work", "settled", "counters",
                           "leased", "ready", "history", "parked"],
                 ["lease_id", "token", "step"])


def _commits(raw, queue_name) -> list[dict[str, str]]:
    return [{k.decode(): v.decode() for k, v in kv.items()} for _, kv in raw.xrange(keys(queue_name)["commits"])]


def test_commit_settles_every_member(open_queue, raw, queue_name) -> None:
    q = open_queue()
    ids = fill_buffer(q, 3)
    lease = q.lease(2, trainer_id="trainer-a")
    assert payload_keys(raw, queue_name) == {keys(queue_name).payload(e, 1) for e in ids}  # kept while leased
    commit_id = lease.commit()
    members = ids[:2]
    # XACK + XDEL: not pending, not in the stream; the completion payload is gone (no key of any
    # attempt of a member; the unleased group keeps its own).
    assert set(pel(raw, queue_name)) == {ids[2]}
    assert stream_ids(raw, queue_name) == [ids[2]]
    assert payload_keys(raw, queue_name) == {keys(queue_name).payload(ids[2], 1)}
    for entry_id in members:
        assert payload_keys(raw, queue_name, entry_id) == set()
        assert ledger(raw, queue_name, entry_id) == f"s|committed|1|w-fill|{lease.lease_id}|"
    # One commits line naming the lease, the trainer, the entry IDs and the step.
    [(line_id, _)] = raw.xrange(keys(queue_name)["commits"])
    assert line_id.decode() == commit_id
    [line] = _commits(raw, queue_name)
    assert line["lease"] == lease.lease_id and line["trainer"] == "trainer-a"
    assert line["ids"] == ",".join(members) and line["step"] == ""
    m = meta(raw, queue_name)
    assert (m["committed"], m["leased"], m["retained"]) == ("2", "0", "1")
    # The lease record is closed and expires; the @lease consumer is gone.
    record = keys(queue_name).lease(lease.lease_id)
    assert raw.hget(record, "state") == b"committed" and raw.pttl(record) > 0
    assert raw.zscore(keys(queue_name)["leases"], lease.lease_id) is None
    consumers = {c["name"].decode() if isinstance(c["name"], bytes) else c["name"]
                 for c in raw.xinfo_consumers(keys(queue_name)["src"], "rollout")}
    assert f"@lease:{lease.lease_id}" not in consumers
    s = q.stats()
    assert (s.committed, s.leased, s.completed, s.retained, s.backlog) == (2, 0, 1, 1, 0)


def test_commit_again_returns_the_same_commit(open_queue, raw, queue_name) -> None:
    q = open_queue()
    fill_buffer(q, 2)
    lease = q.lease(2)
    first = lease.commit(step=4)
    before = snapshot(raw, queue_name)
    assert lease.commit(step=4) == first
    assert lease.commit() == first, "the replay answers from the record, whatever step it names"
    assert snapshot(raw, queue_name) == before
    assert len(_commits(raw, queue_name)) == 1


def test_commit_after_rollback_is_lost(open_queue, raw, queue_name) -> None:
    q = open_queue()
    fill_buffer(q, 1)
    lease = q.lease(1)
    lease.rollback()
    before = snapshot(raw, queue_name)
    with pytest.raises(LeaseLost) as err:
        lease.commit()
    assert err.value.state == "rolled_back" and err.value.lease_id == lease.lease_id
    assert snapshot(raw, queue_name) == before


def test_commit_after_the_deadline_is_lost_and_changes_nothing(open_queue, raw, queue_name) -> None:
    q = open_queue()
    [entry_id] = fill_buffer(q, 1)
    lease = q.lease(1, timeout_s=0.05)
    wait_past(raw, lease.deadline_ms)
    before = snapshot(raw, queue_name)
    with pytest.raises(LeaseLost) as err:
        lease.commit(step=1)
    assert err.value.state == "expired"
    assert snapshot(raw, queue_name) == before
    # The group is still the lease's until the reaper rolls it back; then it is ready again.
    assert owners(raw, queue_name, [entry_id]) == [f"@lease:{lease.lease_id}"]
    assert q.reap().expired == 1
    assert owners(raw, queue_name, [entry_id]) == ["@ready"]
    with pytest.raises(LeaseLost) as again:
        lease.commit()
    assert again.value.state == "expired"


@pytest.mark.parametrize("field,value,state", [("lease_id", "no-such-lease", "unknown"),
                                               ("token", "wrong-token", "token")])
def test_commit_unknown_lease_or_wrong_token_is_lost(open_queue, raw, queue_name, field, value, state) -> None:
    q = open_queue()
    [entry_id] = fill_buffer(q, 1)
    lease = q.lease(1)
    real = getattr(lease, field)
    setattr(lease, field, value)
    before = snapshot(raw, queue_name)
    with pytest.raises(LeaseLost) as err:
        lease.commit()
    assert err.value.state == state
    assert snapshot(raw, queue_name) == before
    setattr(lease, field, real)
    lease.commit()
    assert entry_id not in pel(raw, queue_name)


def test_commit_with_step_keeps_the_entry_until_a_checkpoint(open_queue, raw, queue_name) -> None:
    q = open_queue()
    ids = fill_buffer(q, 2)
    lease = q.lease(2)
    lease.commit(step=7)
    # XACKed (not pending), but the pristine entry stays in the stream, indexed in kept by step.
    assert pel(raw, queue_name) == {}
    assert stream_ids(raw, queue_name) == ids
    assert [(m.decode(), s) for m, s in raw.zrange(keys(queue_name)["kept"], 0, -1, withscores=True)] == \
        [(ids[0], 7.0), (ids[1], 7.0)]
    assert _commits(raw, queue_name)[0]["step"] == "7"
    assert ledger(raw, queue_name, ids[0]).endswith(f"|{lease.lease_id}|7")
    s = q.stats()
    assert (s.kept, s.committed, s.retained, s.backlog) == (2, 2, 0, 0)
    assert q.checkpoint(7) == 2
    assert stream_ids(raw, queue_name) == []
    assert q.stats().kept == 0


def test_commit_at_a_step_a_checkpoint_already_covers_keeps_nothing(open_queue, raw, queue_name) -> None:
    q = open_queue()
    fill_buffer(q, 1)
    q.checkpoint(5)
    q.lease(1).commit(step=5)
    assert stream_ids(raw, queue_name) == [] and raw.zcard(keys(queue_name)["kept"]) == 0
    assert q.stats().kept == 0
