"""complete_many without Redis: the reply parser's per-item refusals and the flow's chunking (h11 style:
replies are fed to the flow by hand)."""

from __future__ import annotations

from typing import Any

import pytest

from rollout_queue import (
    InvalidInput,
    MalformedCompletion,
    PayloadTooLarge,
    ProtocolError,
    Receipt,
    Sample,
    StaleReceipt,
)
from rollout_queue.core import flows
from rollout_queue.core import protocol as p
from rollout_queue.core.codec import encode_completion
from rollout_queue.core.keys import QueueKeys

KEYS = QueueKeys("unit")
R1, R2, R3 = Receipt("1-0", 1, "w1"), Receipt("2-0", 2, "w1"), Receipt("3-0", 1, "w1")


def test_each_item_gets_its_outcome_or_its_typed_refusal() -> None:
    reply = [b"ok", [b"ok", b"buffered", b""], [b"stale_receipt", b"w2", 3],
             [b"malformed", b"1 of 2 slots have no output", b"dead"], [b"payload_too_large", 900, 600],
             [b"ok", b"evicted_self", b"4-0"]]
    r4, r5 = Receipt("4-0", 1, "w1"), Receipt("5-0", 1, "w1")
    got = p.parse_complete_many(reply, [R1, R2, R3, r4, r5])
    assert got[0] == "buffered" and got[4] == "evicted_self"
    assert isinstance(got[1], StaleReceipt) and (got[1].entry_id, got[1].attempt, got[1].owner,
                                                 got[1].delivery_count) == ("2-0", 2, "w2", 3)
    assert isinstance(got[2], MalformedCompletion) and (got[2].entry_id, got[2].requeued_to) == ("3-0", "dead")
    assert isinstance(got[3], PayloadTooLarge) and (got[3].size, got[3].limit) == (900, 600)
    assert "completion of 4-0" in str(got[3])


@pytest.mark.parametrize("reply", [
    [b"ok", [b"ok", b"buffered", b""]],                        # one item answered for two sent
    [b"ok", [b"ok", b"buffered", b""], [b"surprise", 1]],       # an unknown status is never per item
    [b"ok", [b"ok", b"buffered", b""], []],                     # an item that is not a status list
    [b"lease_lost", b"x"],                                      # not complete_many's reply at all
    b"ok",
])
def test_a_reply_of_the_wrong_shape_is_a_protocol_error(reply: Any) -> None:
    with pytest.raises(ProtocolError):
        p.parse_complete_many(reply, [R1, R2])


def _drive(items: list[tuple[Receipt, list[Sample]]], limit: int = 10_000) -> tuple[list[Any], list[p.Call]]:
    """Run the flow, answering every item 'buffered'."""
    flow = flows.complete_many(KEYS, "w1", items, limit)
    calls: list[p.Call] = []
    reply = None
    while True:
        try:
            call = flow.send(reply)
        except StopIteration as stop:
            return stop.value, calls
        assert isinstance(call, p.Call) and call.script.name == "complete_many" and call.idempotent
        calls.append(call)
        reply = [b"ok"] + [[b"ok", b"buffered", b""]] * ((len(call.args) - 1) // 6)


def test_items_are_sent_in_order_with_every_slot_and_the_oldest_version() -> None:
    out = [Sample(1, (1,), version=3), Sample(0, (2,), version=2), Sample(1, (3,), version=4)]
    got, [call] = _drive([(R1, out), (R2, [])])
    assert got == ["buffered", "buffered"]
    # each item names its payload's size; the payload itself is staged at the attempt's payload key
    # (SET in the call's MULTI); an item with no samples has size '' and stages nothing; the last value
    # of each item is its token count (every sample's token ids)
    assert call.args == ("w1", "1-0", 1, len(encode_completion(out)), "2:4", "1,0,1", 3, "2-0", 2, "", "0", "", 0)
    assert call.stage == ((KEYS.payload("1-0", 1), encode_completion(out)),)


def test_large_batches_are_chunked_by_count_and_by_bytes() -> None:
    many = [(Receipt(f"{i}-0", 1, "w1"), [Sample(0, (i,))]) for i in range(1, flows.COMPLETE_BATCH + 2)]
    got, calls = _drive(many)
    assert got == ["buffered"] * len(many)
    assert [(len(c.args) - 1) // 6 for c in calls] == [flows.COMPLETE_BATCH, 1]
    per_token = len(encode_completion([Sample(0, (7,) * 1000)])) / 1000
    big = [Sample(0, (7,) * int(0.6 * flows.COMPLETE_BATCH_BYTES / per_token))]  # over half the byte budget
    assert flows.COMPLETE_BATCH_BYTES / 2 < len(encode_completion(big)) < flows.COMPLETE_BATCH_BYTES
    got, calls = _drive([(R1, big), (R2, big), (R3, [Sample(0, (1,))])], limit=flows.COMPLETE_BATCH_BYTES)
    assert got == ["buffered"] * 3 and [(len(c.args) - 1) // 6 for c in calls] == [1, 2]
    # each chunk stages exactly its own items' payloads, in item order
    assert [[key for key, _ in c.stage] for c in calls] == [
        [KEYS.payload("1-0", 1)], [KEYS.payload("2-0", 2), KEYS.payload("3-0", 1)]]
    assert [sum(len(v) for _, v in c.stage) for c in calls][0] == len(encode_completion(big))


def test_an_oversized_item_is_refused_in_its_place_and_not_sent() -> None:
    got, [call] = _drive([(R1, [Sample(0, tuple(range(100)))]), (R2, [Sample(0, (1,))])], limit=50)
    assert isinstance(got[0], PayloadTooLarge) and got[1] == "buffered"
    assert call.args[1] == "2-0" and len(call.args) == 7
    assert call.stage == ((KEYS.payload("2-0", 2), encode_completion([Sample(0, (1,))])),)
    assert _drive([(R1, [Sample(0, tuple(range(100)))])], limit=50)[1] == []  # nothing left to send


def test_a_receipt_of_another_worker_is_refused_before_any_call() -> None:
    with pytest.raises(InvalidInput):
        next(flows.complete_many(KEYS, "w1", [(R1, []), (Receipt("9-0", 1, "w2"), [])], 10_000))
