"""Contract of save_partial.lua, and of progress records wherever they are written, handed out or
dropped (abort.lua's optional progress, reserve's attach_partials, the settlements' drop_partials).

Header outcomes: {'ok', 'saved' | 'replay'}, {'stale_receipt', owner, count} and
{'partial_too_large', size, limit} (both: nothing written). DESIGN: Partial rollouts: a record is
written only by the receipt's owner, replaces that entry's earlier one, is bounded by
max_partial_bytes, handed to the next attempt with its reservation, and dropped when the group
completes or settles.
"""

from __future__ import annotations

from dataclasses import replace

import pytest
import redis

from rollout_queue import PartialTooLarge, QueueConfig, Sample, StaleReceipt
from rollout_queue.core.codec import decode_partial, encode_partial
from tests.contract.conftest import snapshot
from tests.contract.worker_support import call, counter, group, keys, samples

CFG = QueueConfig(max_attempts=2, max_staleness=1, max_partial_bytes=4096)


def prefix(slots: tuple[int, ...] = (0, 1), tokens: int = 3, version: int = 0) -> list[Sample]:
    """The samples so far of an attempt cut short: a few tokens per slot, with logprobs."""
    return [Sample(slot=s, token_ids=tuple(range(10 * s, 10 * s + tokens)), logprobs=(-0.25,) * tokens,
                   version=version, finish_reason="abort") for s in slots]


def records(raw: redis.Redis, queue_name: str) -> tuple[dict[bytes, bytes], dict[bytes, bytes]]:
    k = keys(queue_name)
    return raw.hgetall(k["partial"]), raw.hgetall(k["partial_head"])


def no_records(raw: redis.Redis, queue_name: str) -> bool:
    return records(raw, queue_name) == ({}, {}) and counter(raw, queue_name, "partial_bytes") == 0


def test_saved_progress_goes_to_the_next_attempt_with_its_reservation(open_queue, raw: redis.Redis,
                                                                      queue_name: str) -> None:
    q = open_queue(CFG)
    [eid] = q.submit([group("sp", n=2)])
    w1, w2 = q.worker("w1"), q.worker("w2")
    [res] = w1.reserve(1)
    assert res.progress == ()
    assert w1.save_partial(res.receipt, prefix()) == "saved"
    body, head = records(raw, queue_name)
    record = encode_partial(prefix())
    assert body == {eid.encode(): record}
    assert head == {eid.encode(): f"1|6|0|{len(record)}|w1".encode()}
    assert counter(raw, queue_name, "partial_bytes") == len(record)
    assert w1.abort(res.receipt, "weight update") == "ready"
    [again] = w2.reserve(1)
    assert again.receipt.attempt == 2 and again.progress == tuple(prefix())
    assert counter(raw, queue_name, "partial_continued") == 6
    assert q.stats().partial_records == 1


def test_abort_with_progress_stores_it_in_the_same_call(open_queue, raw: redis.Redis, queue_name: str) -> None:
    q = open_queue(CFG)
    [eid] = q.submit([group("ab", n=3)])
    w = q.worker("w1")
    [res] = w.reserve(1)
    assert w.abort(res.receipt, "worker drained", progress=prefix((0, 2), tokens=2)) == "ready"
    assert records(raw, queue_name)[1][eid.encode()].startswith(b"1|4|0|")
    [again] = w.reserve(1)
    assert [s.slot for s in again.progress] == [0, 2]
    # A resent abort (its reply was lost) is a replay and writes nothing, progress or not.
    before = snapshot(raw, queue_name, exclude=("workers", "reserves"))
    assert w.abort(res.receipt, "worker drained", progress=prefix((0,), tokens=5)) == "replay"
    assert snapshot(raw, queue_name, exclude=("workers", "reserves")) == before


def test_a_newer_attempts_progress_replaces_the_older_one(open_queue, raw: redis.Redis, queue_name: str) -> None:
    q = open_queue(CFG)
    [eid] = q.submit([group("nw", n=2)])
    w = q.worker("w1")
    [res] = w.reserve(1)
    w.abort(res.receipt, "hold", progress=prefix(tokens=2))
    [res2] = w.reserve(1)
    longer = prefix(tokens=5)
    assert w.save_partial(res2.receipt, longer) == "saved"
    body, head = records(raw, queue_name)
    assert decode_partial(body[eid.encode()], 2) == {s.slot: s for s in longer}
    assert head[eid.encode()].startswith(b"2|10|0|")
    assert counter(raw, queue_name, "partial_bytes") == len(encode_partial(longer))


def test_an_older_attempt_never_overwrites_a_newer_ones_progress(open_queue, raw: redis.Redis,
                                                                 queue_name: str) -> None:
    q = open_queue(CFG)
    q.submit([group("old", n=2)])
    w1, w2 = q.worker("w1"), q.worker("w2")
    [res1] = w1.reserve(1)
    w1.abort(res1.receipt, "weight update")
    [res2] = w2.reserve(1)
    w2.save_partial(res2.receipt, prefix(tokens=4))
    before = snapshot(raw, queue_name)
    with pytest.raises(StaleReceipt) as info:
        w1.save_partial(res1.receipt, prefix(tokens=1))
    assert (info.value.owner, info.value.delivery_count) == ("w2", 2)
    assert snapshot(raw, queue_name) == before


def test_a_save_resent_after_its_attempt_ended_is_a_replay(open_queue, raw: redis.Redis, queue_name: str) -> None:
    q = open_queue(CFG)
    q.submit([group("rs", n=2)])
    w = q.worker("w1")
    [res] = w.reserve(1)
    assert w.save_partial(res.receipt, prefix()) == "saved"
    w.abort(res.receipt, "drain")
    before = snapshot(raw, queue_name)
    assert w.save_partial(res.receipt, prefix()) == "replay"
    assert snapshot(raw, queue_name) == before


def test_a_save_resent_while_its_attempt_owns_the_entry_writes_and_counts_nothing(open_queue, raw: redis.Redis,
                                                                                  queue_name: str) -> None:
    """A lost reply's resend (the same attempt sending the same progress again) is a replay: nothing
    written, partial_saved not moved (rule 5). A record that differs, even by bytes only, is saved and
    counted; an abort carrying the record already stored ends the attempt without counting it again."""
    q = open_queue(CFG)
    [eid] = q.submit([group("ro", n=2)])
    w = q.worker("w1")
    [res] = w.reserve(1)
    assert w.save_partial(res.receipt, prefix()) == "saved"
    assert counter(raw, queue_name, "partial_saved") == 1
    before = snapshot(raw, queue_name)
    assert w.save_partial(res.receipt, prefix()) == "replay"
    assert snapshot(raw, queue_name) == before
    # The same head (attempt, tokens, version, length, worker), other bytes: a new record.
    shifted = [replace(s, token_ids=tuple(t + 1 for t in s.token_ids)) for s in prefix()]
    assert len(encode_partial(shifted)) == len(encode_partial(prefix()))
    assert w.save_partial(res.receipt, shifted) == "saved"
    assert records(raw, queue_name)[0] == {eid.encode(): encode_partial(shifted)}
    assert w.save_partial(res.receipt, prefix(tokens=5)) == "saved"
    assert counter(raw, queue_name, "partial_saved") == 3
    assert w.abort(res.receipt, "drain", progress=prefix(tokens=5)) == "ready"
    assert counter(raw, queue_name, "partial_saved") == 3
    assert counter(raw, queue_name, "partial_bytes") == len(encode_partial(prefix(tokens=5)))
    [again] = w.reserve(1)
    assert again.progress == tuple(prefix(tokens=5))


def test_a_record_over_the_bound_is_refused_whole(open_queue, raw: redis.Redis, queue_name: str) -> None:
    q = open_queue(CFG)  # max_partial_bytes=4096
    [eid] = q.submit([group("big", n=2)])
    w = q.worker("w1")
    [res] = w.reserve(1)
    big = prefix(tokens=400)
    before = snapshot(raw, queue_name)
    with pytest.raises(PartialTooLarge) as info:  # the flow refuses before sending
        w.save_partial(res.receipt, big)
    with pytest.raises(PartialTooLarge):
        w.abort(res.receipt, "drain", progress=big)
    assert info.value.limit == 4096 and info.value.size > 4096
    # A client that sends it anyway meets the stored bound: nothing written either.
    record = encode_partial(big)
    aborting = {"reason": "x", "progress": record, "discarded": 0}
    for name, extra in (("save_partial", {"record": record}), ("abort", aborting)):
        reply = call(q, name, entry_id=eid, attempt=1, worker_id="w1", tokens=800, min_version=0, **extra)
        assert reply == ["partial_too_large", len(record), 4096]
    assert snapshot(raw, queue_name) == before
    assert w.abort(res.receipt, "drain") == "ready"  # still owned: abort without progress


def test_max_partial_bytes_zero_keeps_no_progress(open_queue, raw: redis.Redis, queue_name: str) -> None:
    q = open_queue(CFG.replace(max_partial_bytes=0))
    q.submit([group("off", n=2)])
    w = q.worker("w1")
    [res] = w.reserve(1)
    with pytest.raises(PartialTooLarge):
        w.abort(res.receipt, "drain", progress=prefix())
    assert w.abort(res.receipt, "drain") == "ready" and no_records(raw, queue_name)


def test_completion_drops_the_record(open_queue, raw: redis.Redis, queue_name: str) -> None:
    q = open_queue(CFG)
    q.submit([group("cp", n=2)])
    w = q.worker("w1")
    [res] = w.reserve(1)
    w.abort(res.receipt, "drain", progress=prefix())
    [res2] = w.reserve(1)
    assert w.complete(res2.receipt, samples(2, tokens=5)) == "buffered"
    assert no_records(raw, queue_name)
    with q.lease(1) as lease:
        assert len(lease.groups) == 1
    assert no_records(raw, queue_name)


def test_complete_many_drops_the_record(open_queue, raw: redis.Redis, queue_name: str) -> None:
    q = open_queue(CFG)
    q.submit([group("cm1", n=2), group("cm2", n=2)])
    w = q.worker("w1")
    for res in w.reserve(2):
        w.abort(res.receipt, "drain", progress=prefix())
    got = w.reserve(2)
    assert all(r.progress for r in got)
    assert w.complete_many([(r.receipt, samples(2)) for r in got]) == ["buffered", "buffered"]
    assert no_records(raw, queue_name)


def test_filter_drops_the_record(open_queue, raw: redis.Redis, queue_name: str) -> None:
    q = open_queue(CFG)
    q.submit([group("fl", n=2)])
    w = q.worker("w1")
    [res] = w.reserve(1)
    w.abort(res.receipt, "drain", progress=prefix())
    [res2] = w.reserve(1)
    w.save_partial(res2.receipt, prefix(tokens=4))
    assert w.filter(res2.receipt, "all rewards equal") == "filtered"
    assert no_records(raw, queue_name)


def test_dead_letter_drops_the_record(open_queue, raw: redis.Redis, queue_name: str) -> None:
    q = open_queue(CFG)  # max_attempts=2
    q.submit([group("dl", n=2)])
    w = q.worker("w1")
    [res] = w.reserve(1)
    w.save_partial(res.receipt, prefix())
    assert w.fail(res.receipt, "boom") == "ready"
    assert records(raw, queue_name)[0]  # a failed attempt keeps the earlier progress for the next one
    [res2] = w.reserve(1)
    assert res2.progress
    assert w.fail(res2.receipt, "boom") == "dead"
    assert no_records(raw, queue_name)


def test_a_lost_worker_leaves_its_saved_progress_to_the_next_attempt(open_queue, raw: redis.Redis,
                                                                    queue_name: str) -> None:
    q = open_queue(CFG)
    q.submit([group("lw", n=2)])
    w1 = q.worker("w1")
    [res] = w1.reserve(1)
    w1.save_partial(res.receipt, prefix())
    assert w1.close("aborted", "drain") == (1, 0)  # close_worker, as a drain without progress does
    [res2] = q.worker("w2").reserve(1)
    assert res2.progress == tuple(prefix())


def test_a_prefix_already_stale_is_dropped_at_reserve(open_queue, raw: redis.Redis, queue_name: str) -> None:
    q = open_queue(CFG.replace(staleness_mode="drop", max_stale_evictions=0))  # max_staleness=1
    q.publish_version(1)
    q.submit([group("stale", n=2)])
    w = q.worker("w1")
    [res] = w.reserve(1)
    w.abort(res.receipt, "weight update", progress=prefix(version=1))
    q.publish_version(2)  # 2 - 1 <= 1: still within the bound
    [res2] = w.reserve(1)
    assert res2.progress
    w.abort(res2.receipt, "weight update")
    q.publish_version(3)  # 3 - 1 > 1: a group continued from it would be stale at lease
    [res3] = w.reserve(1)
    assert res3.progress == () and no_records(raw, queue_name)
    assert counter(raw, queue_name, "partial_stale") == 6 and counter(raw, queue_name, "partial_continued") == 6


def test_a_garbage_record_is_ignored_and_the_attempt_starts_from_the_prompt(open_queue, raw: redis.Redis,
                                                                            queue_name: str) -> None:
    q = open_queue(CFG)
    [eid] = q.submit([group("gb", n=2)])
    w = q.worker("w1")
    [res] = w.reserve(1)
    w.abort(res.receipt, "drain", progress=prefix())
    raw.hset(keys(queue_name)["partial"], eid, b"RQC2 not a blob")
    [res2] = w.reserve(1)
    assert res2.receipt.attempt == 2 and res2.progress == ()
    raw.hset(keys(queue_name)["partial_head"], eid, b"garbage")
    w.abort(res2.receipt, "drain")
    [res3] = w.reserve(1)  # a garbage head: the record is forgotten
    assert res3.progress == () and records(raw, queue_name) == ({}, {})
