"""Contract of reject.lua: executing -> settled(dead): the worker found the reservation undecodable.

Header outcomes: {'ok', 'dead' | 'replay'} and {'stale_receipt', owner, count} (nothing written).
DESIGN rule 3: a reservation that is not a well-formed group is settled dead with its reason and its
pristine payload; it never reaches generation and never blocks the entries behind it.
"""

from __future__ import annotations

import pytest
import redis

from rollout_queue import QueueConfig, StaleReceipt
from rollout_queue.core import flows
from tests.contract.conftest import snapshot
from tests.contract.worker_support import call, group, keys, ledger, pel
from tests.helpers import after_settling

CFG = QueueConfig()
REASON = "malformed_reservation: test"


def test_reject_settles_the_reservation_dead(open_queue, raw: redis.Redis, queue_name: str) -> None:
    q = open_queue(CFG)
    [eid] = q.submit([group("rj", n=3)])
    pristine = {k.decode(): v for k, v in raw.xrange(keys(queue_name)["src"])[0][1].items()}
    [res] = q.worker("w1").reserve(1)
    reply = call(q, "reject", entry_id=eid, attempt=1, worker_id="w1", reason=REASON)
    assert reply == ["ok", b"dead"]
    [dead] = after_settling(q).dead_letters()
    assert (dead.entry_id, dead.source_id, dead.reason, dead.attempt, dead.worker_id) == (eid, "rj", REASON, 1, "w1")
    assert dead.fields == {k.encode(): v for k, v in pristine.items()} and dead.group == res.group
    assert pel(raw, queue_name) == {} and raw.xlen(keys(queue_name)["src"]) == 0
    assert ledger(raw, queue_name, eid) == f"s|dead|1|w1|{REASON}"
    stats = q.stats()
    assert (stats.dead, stats.retained, stats.executing_groups, stats.executing_samples) == (1, 0, 0, 0)


def test_a_repeated_reject_is_a_replay(open_queue, raw: redis.Redis, queue_name: str) -> None:
    q = open_queue(CFG)
    [eid] = q.submit([group("rp")])
    q.worker("w1").reserve(1)
    assert call(q, "reject", entry_id=eid, attempt=1, worker_id="w1", reason=REASON) == ["ok", b"dead"]
    before = snapshot(raw, queue_name)
    assert call(q, "reject", entry_id=eid, attempt=1, worker_id="w1", reason=REASON) == ["ok", b"replay"]
    assert snapshot(raw, queue_name) == before


def test_a_stale_reject_changes_nothing(open_queue, raw: redis.Redis, queue_name: str) -> None:
    q = open_queue(CFG)
    q.submit([group("st")])
    [res] = q.worker("w1").reserve(1)
    before = snapshot(raw, queue_name)
    stale = res.receipt.__class__(res.entry_id, 2, "w1")
    with pytest.raises(StaleReceipt) as info:
        q.run(flows.reject(q.keys, stale, REASON))
    assert (info.value.owner, info.value.delivery_count) == ("w1", 1)
    assert snapshot(raw, queue_name) == before
    assert pel(raw, queue_name) == {res.entry_id: ("w1", 1)}


def test_reserve_rejects_a_body_that_is_not_orjson(open_queue, raw: redis.Redis, queue_name: str) -> None:
    """The script validates the parents; the body is the client's to decode, and to reject."""
    q = open_queue(CFG)
    bad = raw.xadd(keys(queue_name)["src"], {"v": "1", "sid": "x", "n": "1", "p": '[{"slot":0,"uid":"x/0"}]',
                                            "g": b"\xff not json"}).decode()
    bad_prompt = raw.xadd(keys(queue_name)["src"], {"v": "1", "sid": "y", "n": "1", "p": '[{"slot":0,"uid":"y/0"}]',
                                                   "g": '{"prompt": 7}'}).decode()
    [good] = q.submit([group("good")])
    assert [r.entry_id for r in q.worker("w1").reserve(3)] == [good]
    dead = {d.entry_id: d for d in after_settling(q).dead_letters()}
    assert set(dead) == {bad, bad_prompt}
    assert all(d.reason.startswith("malformed_reservation") and d.worker_id == "w1" for d in dead.values())
    assert dead[bad].fields[b"g"] == b"\xff not json" and dead[bad].group is None
    assert ledger(raw, queue_name, bad).startswith("s|dead|1|w1|malformed_reservation")
    stats = q.stats()
    assert (stats.dead, stats.retained, stats.executing_groups, stats.executing_samples) == (2, 1, 1, 2)
