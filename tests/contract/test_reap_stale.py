"""reap_stale.lua: completed -> ready for buffered groups that became stale, against real servers.

Proves the header's outcomes ('ok' with evicted / done, batch by batch; nothing before a version is
published) and DESIGN: after publish_version the reaper evicts exactly the stale buffered groups to
ready ahead of lease (ReapReport.stale), not counted toward max_attempts; fresh ones stay buffered.
"""

from __future__ import annotations

import orjson

from rollout_queue import QueueConfig
from rollout_queue.core import protocol as p
from tests.contract.conftest import snapshot
from tests.contract.lifecycle import (
    check_header,
    complete_all,
    execute,
    fill_buffer,
    keys,
    meta,
    owners,
    payload_keys,
    pel,
    reserve_all,
    submit,
    zmembers,
)


def test_header_matches_builder() -> None:
    check_header("reap_stale", ["src", "meta", "ready", "buffer", "bufver", "history", "ledger", "dlq", "parked", "settled", "wake_work", "counters"],
                 ["count"])


def test_reaper_evicts_stale_groups_and_keeps_fresh_ones(open_queue, raw, queue_name) -> None:
    q = open_queue(QueueConfig(max_staleness=1, max_attempts=1))
    ids = fill_buffer(q, 4, versions=[0, 2, 1, 3])
    assert q.reap().stale == 0, "nothing is stale before a version is published"
    q.publish_version(3)  # floor 2: the v0 and v1 groups are stale
    assert q.stats().staleness_max == 3
    report = q.reap()
    assert (report.stale, report.dead) == (2, 0)
    stale, fresh = [ids[0], ids[2]], [ids[1], ids[3]]
    assert owners(raw, queue_name, stale) == ["@ready", "@ready"]
    assert zmembers(raw, queue_name, "ready") == stale
    assert owners(raw, queue_name, fresh) == ["@done", "@done"]
    assert zmembers(raw, queue_name, "buffer") == fresh
    # The stale groups' payloads are dropped, the fresh ones' kept.
    assert payload_keys(raw, queue_name) == {keys(queue_name).payload(e, 1) for e in fresh}
    for entry_id in stale:
        h = orjson.loads(raw.hget(keys(queue_name)["history"], entry_id))
        assert h["f"] == 0 and [(x["t"], x["r"]) for x in h["h"]] == [("stale", "stale")]
    s = q.stats()
    assert (s.completed, s.ready, s.evictions["stale"], s.staleness_max) == (2, 2, 2, 1)
    assert q.reap().stale == 0
    # Evicted groups are generated again (not dead at max_attempts=1): attempt 2 on fresh weights.
    assert [(r.entry_id, r.receipt.attempt, r.version) for r in q.worker("w-b").reserve(2)] == \
        [(e, 2, 3) for e in stale]


def test_strictly_on_policy_evicts_everything_older_than_the_version(open_queue, raw, queue_name) -> None:
    q = open_queue(QueueConfig(max_staleness=None))
    ids = fill_buffer(q, 3, versions=[0, 1, 2])
    q.publish_version(2)
    assert q.reap().stale == 2
    assert zmembers(raw, queue_name, "buffer") == [ids[2]]


def test_reap_stale_before_any_version_writes_nothing(open_queue, raw, queue_name) -> None:
    q = open_queue(QueueConfig(max_staleness=0))
    fill_buffer(q, 2)
    before = snapshot(raw, queue_name)
    assert [p.s(x) if isinstance(x, bytes) else x for x in execute(q, p.build(q.keys, "reap_stale", count=10))] == \
        ["ok", 0, 1]
    assert snapshot(raw, queue_name) == before


def test_reap_stale_works_in_batches(open_queue, raw, queue_name) -> None:
    q = open_queue(QueueConfig(max_staleness=0))
    fill_buffer(q, 3, versions=[0, 0, 1])
    q.publish_version(1)
    call = p.build(q.keys, "reap_stale", count=1)
    replies = [[int(x) for x in execute(q, call)[1:]] for _ in range(3)]
    assert replies == [[1, 0], [1, 0], [0, 1]]
    assert int(meta(raw, queue_name)["evicted_stale"]) == 2
    assert q.stats().completed == 1


def test_one_stale_batch_keeps_attempts_and_drops_a_ghost(open_queue, raw, queue_name) -> None:
    q = open_queue(QueueConfig(max_staleness=0, max_attempts=5))
    a, b = submit(q, 2)
    w = q.worker("w-a")
    [first] = w.reserve(1)
    w.fail(first.receipt, "flaky")
    got = reserve_all(w, 2)
    assert [(r.entry_id, r.receipt.attempt) for r in got] == [(a, 2), (b, 1)]
    complete_all(w, got)
    assert payload_keys(raw, queue_name) == {keys(queue_name).payload(a, 2), keys(queue_name).payload(b, 1)}
    # A member no transition wrote (a stream ID pending nowhere) in the buffer indexes: a ghost.
    k = keys(queue_name)
    raw.zadd(k["buffer"], {"1-1": 0})
    raw.zadd(k["bufver"], {"1-1": 0})
    q.publish_version(1)
    reply = execute(q, p.build(q.keys, "reap_stale", count=64))
    assert [p.s(reply[0]), *(int(x) for x in reply[1:])] == ["ok", 3, 1]
    assert {e: pel(raw, queue_name)[e] for e in (a, b)} == {a: ("@ready", 2), b: ("@ready", 1)}
    assert zmembers(raw, queue_name, "ready") == [a, b]
    assert zmembers(raw, queue_name, "buffer") == [] and zmembers(raw, queue_name, "bufver") == []
    m = meta(raw, queue_name)
    assert (m["evicted_stale"], m["ghosts"]) == ("3", "1")
    ha, hb = (orjson.loads(raw.hget(k["history"], e)) for e in (a, b))
    assert ha["f"] == 1 and [(x["a"], x["t"]) for x in ha["h"]] == [(1, "failed"), (2, "stale")]
    assert hb["f"] == 0 and [(x["a"], x["t"]) for x in hb["h"]] == [(1, "stale")]
    assert payload_keys(raw, queue_name) == set()  # a's at attempt 2 and b's at attempt 1
    s = q.stats()
    assert (s.completed, s.ready, s.retained) == (0, 2, 2)
    assert [(r.entry_id, r.receipt.attempt) for r in q.worker("w-b").reserve(2)] == [(a, 3), (b, 2)]
