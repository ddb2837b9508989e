"""Contract of submit.lua: new source groups -> backlog, idempotent by source_id.

Header outcomes: {'ok', new_count, entry_id, ...} and {'payload_too_large', index, bytes, limit}
(nothing written). DESIGN rule 5: a source_id already submitted stores nothing and returns its
existing entry ID.
"""

from __future__ import annotations

import orjson
import pytest
import redis

from rollout_queue import PayloadTooLarge, QueueConfig, SourceGroup
from rollout_queue.core import protocol as p
from rollout_queue.core.codec import SCHEMA_VERSION, decode_group, encode_group
from tests.contract.conftest import snapshot
from tests.contract.worker_support import call, counter, group, keys

CFG = QueueConfig(max_payload_bytes=400)


def _entries(raw: redis.Redis, queue_name: str) -> list[tuple[str, dict[bytes, bytes]]]:
    return [(i.decode(), f) for i, f in raw.xrange(keys(queue_name)["src"])]


def test_batched_submit_backlogs_each_group_in_order(open_queue, raw: redis.Redis, queue_name: str) -> None:
    q = open_queue(CFG)
    groups = [group(f"s{i}", n=i + 1) for i in range(3)]
    ids = q.submit(groups)
    entries = _entries(raw, queue_name)
    assert [i for i, _ in entries] == ids and len(set(ids)) == 3
    assert [decode_group(f) for _, f in entries] == groups
    assert {k.decode(): v.decode() for k, v in raw.hgetall(keys(queue_name)["ids"]).items()} == {
        g.source_id: i for g, i in zip(groups, ids)}
    assert int(raw.hget(keys(queue_name)["intake"], "submitted") or 0) == 3
    stats = q.stats()
    assert (stats.backlog, stats.submitted, stats.retained) == (3, 3, 0)


def test_stream_fields_are_as_documented(open_queue, raw: redis.Redis, queue_name: str) -> None:
    q = open_queue(CFG)
    g = SourceGroup("doc-1", "a prompt", 3, {"lang": "en"}, (1, 2, 3))
    q.submit([g])
    [(_, fields)] = _entries(raw, queue_name)
    assert list(fields) == [b"v", b"sid", b"n", b"p", b"g"]
    assert fields[b"v"] == str(SCHEMA_VERSION).encode()
    assert (fields[b"sid"], fields[b"n"]) == (b"doc-1", b"3")
    assert orjson.loads(fields[b"p"]) == [{"slot": i, "uid": f"doc-1/{i}"} for i in range(3)]
    assert orjson.loads(fields[b"g"]) == {"prompt": "a prompt", "metadata": {"lang": "en"},
                                          "prompt_token_ids": [1, 2, 3]}
    assert (fields[b"p"], fields[b"g"]) == encode_group(g)


def test_a_known_source_id_returns_its_entry_id_and_stores_nothing(open_queue, raw: redis.Redis,
                                                                  queue_name: str) -> None:
    q = open_queue(CFG)
    [first] = q.submit([group("dup")])
    before = snapshot(raw, queue_name)
    again = q.submit([SourceGroup("dup", "a different prompt", 5)])
    assert again == [first]
    assert snapshot(raw, queue_name) == before  # not even a wake event
    [(_, fields)] = _entries(raw, queue_name)
    assert decode_group(fields) == group("dup")  # the pristine first copy


def test_a_source_id_twice_in_one_batch_is_stored_once(open_queue, raw: redis.Redis, queue_name: str) -> None:
    q = open_queue(CFG)
    ids = q.submit([group("a"), group("b"), SourceGroup("a", "other", 1), group("b")])
    assert ids[0] == ids[2] and ids[1] == ids[3] and ids[0] != ids[1]
    assert len(_entries(raw, queue_name)) == 2
    assert int(raw.hget(keys(queue_name)["intake"], "submitted") or 0) == 2
    reply = call(q, "submit", groups=[x for g in [group("c"), group("c")] for x in (
        g.source_id, g.n, *encode_group(g), SCHEMA_VERSION)])
    assert reply[:2] == ["ok", 1] and reply[2] == reply[3]


def test_a_known_source_id_in_a_batch_does_not_hide_the_new_ones(open_queue, raw: redis.Redis,
                                                                 queue_name: str) -> None:
    q = open_queue(CFG)
    [old] = q.submit([group("old")])
    ids = q.submit([group("old"), group("new")])
    assert ids[0] == old and ids[1] != old
    assert int(raw.hget(keys(queue_name)["intake"], "submitted") or 0) == 2


def test_new_groups_wake_blocked_reservers(open_queue, raw: redis.Redis, queue_name: str) -> None:
    q = open_queue(CFG)
    wake = keys(queue_name)["wake_work"]
    q.submit([group("w1"), group("w2")])
    assert raw.xlen(wake) == 1  # one event per call, not per group
    q.submit([group("w1")])
    assert raw.xlen(wake) == 1


def test_payload_over_the_limit_raises_and_writes_nothing(open_queue, raw: redis.Redis, queue_name: str) -> None:
    q = open_queue(CFG)
    q.submit([group("before")])
    before = snapshot(raw, queue_name)
    big = SourceGroup("big", "x" * 500, 1)
    with pytest.raises(PayloadTooLarge) as info:
        q.submit([group("fits"), big])
    parents, body = encode_group(big)
    assert (info.value.size, info.value.limit) == (len("big") + len(parents) + len(body), 400)
    assert snapshot(raw, queue_name) == before  # not even the group that fits


def test_the_script_refuses_an_oversized_payload_itself(open_queue, raw: redis.Redis, queue_name: str) -> None:
    """A client that skips its own size check (an older build) still cannot write past the limit."""
    q = open_queue(CFG)
    before = snapshot(raw, queue_name)
    flat: list[p.Arg] = []
    for g in (group("fits"), SourceGroup("big", "x" * 500, 1)):
        flat += [g.source_id, g.n, *encode_group(g), SCHEMA_VERSION]
    reply = call(q, "submit", groups=flat)
    parents, body = encode_group(SourceGroup("big", "x" * 500, 1))
    assert reply == ["payload_too_large", 1, len("big") + len(parents) + len(body), 400]
    assert snapshot(raw, queue_name) == before
    with pytest.raises(PayloadTooLarge):
        p.check(reply, ("ok",), {"what": "source group"})


def test_an_empty_batch_is_a_no_op(open_queue, raw: redis.Redis, queue_name: str) -> None:
    q = open_queue(CFG)
    before = snapshot(raw, queue_name)
    assert q.submit([]) == []
    assert snapshot(raw, queue_name) == before


def test_repeats_and_known_source_ids_interleaved_in_one_batch(open_queue, raw: redis.Redis,
                                                               queue_name: str) -> None:
    """The known source_ids are read once for the batch and the new pairs written once after it:
    a source_id named again later in the same batch still gets its first mention's entry ID."""
    q = open_queue(CFG)
    [old] = q.submit([group("old")])
    ids = q.submit([group("x"), group("old"), group("x"), group("y"), group("old"), group("x")])
    x, y = ids[0], ids[3]
    assert ids == [x, old, x, y, old, x] and len({old, x, y}) == 3
    assert [i for i, _ in _entries(raw, queue_name)] == [old, x, y]
    assert {k.decode(): v.decode() for k, v in raw.hgetall(keys(queue_name)["ids"]).items()} == {
        "old": old, "x": x, "y": y}
    assert int(raw.hget(keys(queue_name)["intake"], "submitted") or 0) == 3


def test_a_batch_larger_than_one_command_chunk_is_idempotent(open_queue, raw: redis.Redis,
                                                             queue_name: str) -> None:
    """1001 groups cross the 1000-item chunks of the ids HMGET and HSET; sent again, every one is known."""
    q = open_queue(CFG)
    groups = [group(f"big-{i}", n=1) for i in range(1001)]
    ids = q.submit(groups)
    assert len(set(ids)) == 1001
    assert [i for i, _ in _entries(raw, queue_name)] == ids
    stored = {k.decode(): v.decode() for k, v in raw.hgetall(keys(queue_name)["ids"]).items()}
    assert stored == {g.source_id: i for g, i in zip(groups, ids)}
    # DUMP of a hash this large is not stable on valkey (lookups move its incremental rehash along), so
    # the ids hash is compared by content and every other key byte for byte.
    before = snapshot(raw, queue_name, exclude=("ids",))
    assert q.submit(groups[::-1]) == ids[::-1]
    assert snapshot(raw, queue_name, exclude=("ids",)) == before
    assert {k.decode(): v.decode() for k, v in raw.hgetall(keys(queue_name)["ids"]).items()} == stored
