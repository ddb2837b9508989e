"""Contract of push_join.lua: a live worker joins the joinable round and learns its rank.

Header outcomes: {'ok', epoch, rank, ...}; {'closed', epoch}; {'not_live', epoch} (WorkerNotLive).
Invariant: ranks are 1..n without gaps, none after the seal; only a worker live at the instant it
joins takes a rank (issue 29 item 1: any id used to take one, so an id that never heartbeat sealed a
round alone, the live worker was refused and the round failed at its deadline); a worker push_open
left out is not admitted; the script never writes the ``push`` hash (the worker role only reads it).
"""

from __future__ import annotations

import pytest
import redis

from rollout_queue.core.errors import WorkerNotLive
from rollout_queue.core.models import PushSeal
from tests.contract.conftest import snapshot
from tests.contract.push_support import live, members, open_round, silent


def test_an_id_that_never_heartbeat_neither_takes_a_rank_nor_seals_the_round(open_queue, raw: redis.Redis,
                                                                             queue_name: str) -> None:
    q = open_queue()
    live(q, "w1")
    epoch = open_round(q)
    before = snapshot(raw, queue_name)
    with pytest.raises(WorkerNotLive, match="'ghost' is not a live worker"):
        q.worker("ghost").join_push(epoch)
    with pytest.raises(WorkerNotLive):
        q.worker("ghost").join_push(0)
    assert snapshot(raw, queue_name) == before  # refused: nothing written
    assert q.seal_push(epoch) == (0, 1)  # still waiting for the one live worker
    ticket = q.worker("w1").join_push(epoch)
    assert ticket is not None and ticket.rank == 1
    assert q.seal_push(epoch) == PushSeal(epoch, 2, {"w1": 1})


def test_a_silent_or_closed_worker_is_refused_until_it_heartbeats_again(open_queue, raw: redis.Redis,
                                                                        queue_name: str) -> None:
    q = open_queue()
    live(q, "quiet", "gone")
    silent(raw, queue_name, "quiet")
    q.worker("gone").close()
    epoch = open_round(q)
    for w in ("quiet", "gone"):
        with pytest.raises(WorkerNotLive):
            q.worker(w).join_push(epoch)
    assert members(raw, queue_name) == {}
    live(q, "gone")
    assert q.worker("gone").join_push(epoch).rank == 1


def test_a_member_that_went_silent_gets_its_own_rank_again(open_queue, raw: redis.Redis, queue_name: str) -> None:
    """Joining twice answers the same rank (a resend is a replay), live or not by then."""
    q = open_queue()
    live(q, "w1", "w2")
    epoch = open_round(q)
    first = q.worker("w1").join_push(epoch)
    assert q.worker("w2").join_push(epoch).rank == 2
    silent(raw, queue_name, "w1")
    again = q.worker("w1").join_push(epoch)
    assert again is not None and (again.epoch, again.rank) == (first.epoch, first.rank) == (epoch, 1)
    assert members(raw, queue_name) == {"w1": 1, "w2": 2}


def test_a_worker_push_open_left_out_is_not_admitted(open_queue, raw: redis.Redis, queue_name: str) -> None:
    q = open_queue()
    live(q, "w1", "w2")
    epoch = open_round(q, unreached=["w2"])
    before = snapshot(raw, queue_name)
    assert q.worker("w2").join_push(epoch) is None
    assert q.worker("w2").join_push(0) is None
    assert snapshot(raw, queue_name) == before
    assert q.worker("w1").join_push(epoch).rank == 1
    assert q.seal_push(epoch, 1) == PushSeal(epoch, 2, {"w1": 1})


def test_joining_never_writes_the_round_record(open_queue, raw: redis.Redis, queue_name: str) -> None:
    q = open_queue()
    live(q, "w1")
    epoch = open_round(q)
    record = raw.hgetall(q.keys["push"])
    q.worker("w1").join_push(epoch)
    with pytest.raises(WorkerNotLive):
        q.worker("ghost").join_push(epoch)
    assert raw.hgetall(q.keys["push"]) == record
