"""Contract of push_open.lua: open a round of a weights push; a resend of the same round id is a replay.

Header outcomes: {'ok', epoch}; {'version_regression', current}. Invariant: epochs only grow, one open
makes one round whatever the resends (issue 29 item 2: each resend used to bump the epoch and drop
the members, so a worker that joined the first run waited on a dead round until its deadline), and
the workers named ``unreached`` are not admitted to the round it opens.
"""

from __future__ import annotations

import pytest
import redis

from rollout_queue import InvalidInput, RolloutQueue, ScriptError, VersionRegression
from rollout_queue.core import flows
from tests.contract.conftest import snapshot
from tests.contract.push_support import ADDR, live, lose_first_reply, members, open_round, round_field
from tests.contract.worker_support import call, keys


def _open(q, round_id: str, version: int = 1, unreached: list[str] | None = None) -> list:
    return call(q, "push_open", round_id=round_id, version=version, uri=f"/w/v{version}", addr=ADDR, backend="gloo",
                join_ms=30_000, deadline_ms=60_000, unreached=unreached or [])


def test_an_open_whose_reply_was_lost_is_resent_as_a_replay_of_its_round(open_queue, raw: redis.Redis, redis_url: str,
                                                                          queue_name: str) -> None:
    """The public call, its first reply lost after the script ran: a worker joins the round in the
    gap; the transport's resend answers that round's epoch and keeps its member (before: a second
    round, and the member waited on the first until its deadline)."""
    q = open_queue()
    worker_side = RolloutQueue.from_url(redis_url, queue_name)
    try:
        live(worker_side, "w1")
        joined = []
        lost = lose_first_reply(q, "push_open", lambda: joined.append(worker_side.worker("w1").join_push(0)))
        announcements = raw.pubsub()
        announcements.subscribe(keys(queue_name).versions_channel)
        announcements.get_message(timeout=5)  # the subscription's own confirmation
        epoch = open_round(q)
        assert lost and joined[0] is not None  # the first run happened, and w1 joined its round
        assert joined[0].epoch == epoch and joined[0].rank == 1
        assert round_field(raw, queue_name, "epoch") == str(epoch) == "1"
        assert members(raw, queue_name) == {"w1": 1}
        heard = [m["data"] for m in iter(lambda: announcements.get_message(timeout=0.5), None)
                 if m["type"] == "message"]
        assert heard == [b"push|1|1"]  # announced once
        announcements.close()
    finally:
        worker_side.close()


def test_a_resend_writes_nothing_and_answers_the_same_epoch(open_queue, raw: redis.Redis, queue_name: str) -> None:
    q = open_queue()
    live(q, "w1")
    assert _open(q, "round-a") == ["ok", 1]
    assert q.worker("w1").join_push(1).rank == 1
    before = snapshot(raw, queue_name)
    assert _open(q, "round-a") == ["ok", 1]
    assert _open(q, "round-a", unreached=["w1"]) == ["ok", 1]  # a replay changes nothing, whatever it carries
    assert snapshot(raw, queue_name) == before
    assert _open(q, "round-b") == ["ok", 2]  # a new id: the next round, the last one's members forgotten
    assert members(raw, queue_name) == {}


def test_a_new_round_replaces_the_last_record_and_its_left_out_workers(open_queue, raw: redis.Redis,
                                                                       queue_name: str) -> None:
    q = open_queue()
    live(q, "w1", "w2")
    epoch = open_round(q)
    q.worker("w1").join_push(epoch)
    assert q.close_push(epoch, "failed", 0, 1)
    retry = open_round(q, unreached=["w1"])
    record = raw.hgetall(keys(queue_name)["push"])
    assert retry == epoch + 1 and record[b"unreached:w1"] == b"1" and b"closed_ms" not in record
    assert q.worker("w1").join_push(retry) is None  # not admitted
    assert q.worker("w2").join_push(retry).rank == 1
    later = open_round(q, version=2)
    assert raw.hget(keys(queue_name)["push"], "unreached:w1") is None
    assert q.worker("w1").join_push(later).rank == 1


def test_a_version_at_or_below_the_policy_s_is_refused_and_writes_nothing(open_queue, raw: redis.Redis,
                                                                          queue_name: str) -> None:
    q = open_queue()
    q.publish_version(3)
    before = snapshot(raw, queue_name)
    with pytest.raises(VersionRegression):
        open_round(q, version=3)
    assert snapshot(raw, queue_name) == before
    assert open_round(q, version=4) == 1


def test_bad_arguments_are_refused_before_anything_is_written(open_queue, raw: redis.Redis, queue_name: str) -> None:
    q = open_queue()
    before = snapshot(raw, queue_name)
    for bad in ("", "has space", "x" * 65, None):
        with pytest.raises(InvalidInput, match="push round id"):
            q.run(flows.push_open(q.keys, bad, 1, "/w", ADDR, "gloo", 1, 2))
    for unreached in (["@ready"], "w1", [""], [f"w{i}" for i in range(4097)]):
        with pytest.raises(InvalidInput):
            q.run(flows.push_open(q.keys, "r1", 1, "/w", ADDR, "gloo", 1, 2, unreached))
    with pytest.raises(ScriptError, match="bad push round id"):
        _open(q, "bad id")
    with pytest.raises(ScriptError, match="bad worker id"):
        _open(q, "r2", unreached=["@done"])
    assert snapshot(raw, queue_name) == before
    assert _open(q, "r3", unreached=[f"w{i}" for i in range(4096)]) == ["ok", 1]  # the cap itself: fine
    assert raw.hlen(keys(queue_name)["push"]) == 4096 + 13  # the round's 13 fields and one mark each
