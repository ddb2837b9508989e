"""Contract of push_seal.lua: fix a round's world once enough live workers joined, or its window passed.

Header outcomes: {'waiting', joined, expected}; {'ok', world, worker, rank, ...}; {'closed', epoch}.
Invariant: only members live now count toward ``expect`` (issue 29 item 1: every joiner counted, so a
member that went silent sealed the round in a live worker's place); once sealed the members never
change and sealing again, or a resent seal, answers the same members; past its join window a round
seals whatever joined, so the trainer's wait ends.
"""

from __future__ import annotations

import redis

from rollout_queue.core.models import PushSeal
from tests.contract.conftest import snapshot
from tests.contract.push_support import live, lose_first_reply, open_round, silent


def test_a_member_that_went_silent_does_not_count_toward_the_seal(open_queue, raw: redis.Redis,
                                                                  queue_name: str) -> None:
    q = open_queue()
    live(q, "w1", "w2", "w3")
    epoch = open_round(q)
    q.worker("w1").join_push(epoch)
    q.worker("w2").join_push(epoch)
    silent(raw, queue_name, "w2")
    assert q.seal_push(epoch, 2) == (1, 2)  # w2 joined but is not live: w3 is still awaited
    assert q.seal_push(epoch) == (1, 2)  # every live worker: w1 and w3
    q.worker("w3").join_push(epoch)
    assert q.seal_push(epoch) == PushSeal(epoch, 4, {"w1": 1, "w2": 2, "w3": 3})  # w2 keeps its rank


def test_sealing_again_or_resending_answers_the_same_members(open_queue, raw: redis.Redis, queue_name: str) -> None:
    q = open_queue()
    live(q, "w1", "w2")
    epoch = open_round(q)
    q.worker("w1").join_push(epoch)
    lost = lose_first_reply(q, "push_seal")
    sealed = q.seal_push(epoch, 1)
    assert lost and sealed == PushSeal(epoch, 2, {"w1": 1})
    assert q.worker("w2").join_push(epoch) is None  # the world is fixed
    before = snapshot(raw, queue_name)
    assert q.seal_push(epoch, 5) == sealed == q.seal_push(epoch)
    assert snapshot(raw, queue_name) == before


def test_past_its_window_a_round_seals_with_whoever_joined(open_queue, raw: redis.Redis, queue_name: str) -> None:
    q = open_queue()
    live(q, "w1", "w2")
    epoch = open_round(q)
    q.worker("w1").join_push(epoch)
    silent(raw, queue_name, "w1")
    assert q.seal_push(epoch) == (0, 1)
    raw.hset(q.keys["push"], "join_until_ms", 1)  # the window passed
    assert q.seal_push(epoch) == PushSeal(epoch, 2, {"w1": 1})


def test_a_closed_or_superseded_round_is_not_sealed(open_queue, raw: redis.Redis, queue_name: str) -> None:
    q = open_queue()
    epoch = open_round(q)
    assert q.close_push(epoch, "empty", 0, 0)
    assert q.seal_push(epoch) is None
    later = open_round(q, version=2)
    assert q.seal_push(epoch) is None
    assert q.seal_push(later) == PushSeal(later, 1, {})  # no live worker to wait for
