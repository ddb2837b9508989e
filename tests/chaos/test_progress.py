"""The progress watchdog on hand-written timelines: what counts as a change, when a stall is called.

No Redis and no processes: records and stream lines are built by hand, times are made up, so
nothing here depends on the machine's speed.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rollout_queue.devtools.chaos.oplog import LogTail, OpLog
from rollout_queue.devtools.chaos.progress import Progress, bound_for, replay, stream_time

S0, E0 = "chaos-1-000000", "100-0"


def rec(op: str, t: float, **fields: Any) -> dict[str, Any]:
    return {"op": op, "t": t, "role": "x", "pid": 1, **fields}


def test_the_bound_allows_a_dead_owner_the_post_outage_grace_and_the_longest_outage() -> None:
    # worker silence (2) + 2 worker timeouts of grace after an outage = 6 > lease 4; + outage 6 + slack 15.
    assert bound_for(2.0, 4.0, 6.0, 15.0) == 27.0
    assert bound_for(2.0, 10.0, 0.0, 1.0) == 11.0  # a long lease timeout dominates


def test_a_stall_is_reported_once_while_open_and_judged_when_it_closes() -> None:
    p = Progress(bound_s=5.0)
    p.feed(rec("submit_ok", 10.0, sids=[S0], ids=[E0]))
    assert p.tick(14.0) == [] and p.oldest_open(14.0) == 4.0
    (gap,) = p.tick(16.0)
    assert (gap.sid, gap.state, gap.end) == (S0, "backlog", None)
    assert p.tick(17.0) == []  # the same gap is not reported again
    p.feed(rec("reserve_ok", 18.0, grants=[[E0, 1, S0, 4]]))
    assert [(s.state, s.length) for s in p.stalls] == [("backlog", 8.0)]
    assert p.tick(19.0) == []


def test_a_replayed_reserve_is_no_progress_but_each_new_attempt_is() -> None:
    p = Progress(bound_s=5.0)
    p.feed(rec("submit_ok", 0.0, sids=[S0], ids=[E0]))
    p.feed(rec("reserve_ok", 1.0, grants=[[E0, 1, S0, 4]]))
    p.feed(rec("reserve_ok", 7.0, grants=[[E0, 1, S0, 4]]))  # the same grant replayed
    assert p.groups[S0].last == 1.0
    p.feed(rec("reserve_ok", 7.5, grants=[[E0, 2, S0, 4]]))
    assert p.groups[S0].last == 7.5 and [s.length for s in p.stalls] == [6.5]


def test_a_commit_only_redis_knows_settles_the_group() -> None:
    """The trainer died after commit and before logging commit_ok: the commits stream says it."""
    p = Progress(bound_s=5.0)
    p.feed(rec("submit_ok", 0.0, sids=[S0], ids=[E0]))
    p.feed(rec("reserve_ok", 0.5, grants=[[E0, 1, S0, 2]]))
    p.feed(rec("complete_ok", 0.6, eid=E0, sid=S0))
    p.feed(rec("lease_ok", 1.0, lease="L", members=[[E0, 1, S0, 0]]))
    p.settle_line("commits", "1200-0", {"lease": "L", "ids": E0})
    assert p.groups[S0].settled == "committed" and p.unsettled == 0
    assert p.tick(100.0) == [] and p.stalls == []
    assert stream_time("1200-3") == 1.2


def test_a_dead_letter_settles_and_an_unknown_entry_waits_for_its_mapping() -> None:
    p = Progress(bound_s=5.0)
    p.feed(rec("submit_ok", 0.0, sids=[S0, "s1"], ids=[E0, "100-1"]))
    p.settle_line("dlq", "2000-0", {"entry_id": E0, "source_id": S0})
    p.settle_line("commits", "2500-0", {"lease": "L", "ids": "100-9"})  # no log named 100-9 yet
    assert p.groups[S0].settled == "dead" and p.unmapped
    p.map_ids({"s9": "100-9"})
    assert p.groups["s9"].settled == "committed" and not p.unmapped


def test_finish_closes_open_gaps_at_the_end_of_the_run() -> None:
    p = replay([rec("submit_ok", 0.0, sids=[S0], ids=[E0])], [], [], {}, bound_s=5.0, end=9.0)
    assert [(s.sid, s.end, s.length) for s in p.stalls] == [(S0, None, 9.0)]
    assert p.summary()["worst_s"] == 9.0 and p.summary()["unsettled"] == 1


def test_the_log_tail_returns_each_whole_line_once(tmp_path: Path) -> None:
    log = OpLog(tmp_path / "a.jsonl", "worker")
    tail = LogTail(tmp_path)
    log.write("one")
    assert [r["op"] for r in tail.read()] == ["one"]
    with open(tmp_path / "a.jsonl", "ab") as fh:
        fh.write(b'{"t": 1, "op": "torn"')  # a writer in mid-line: not yet a record
    assert tail.read() == []
    with open(tmp_path / "a.jsonl", "ab") as fh:
        fh.write(b', "role": "w", "pid": 1}\n')
    OpLog(tmp_path / "b.jsonl", "trainer").write("two")
    assert sorted(r["op"] for r in tail.read()) == ["torn", "two"]


def test_a_long_backlog_draining_in_order_is_queueing_not_a_stall() -> None:
    """Issue 12 follow-up: 30 groups submitted at once, granted one per 2 s in submit order; the last
    waits 58 s, but the backlog moved up to it every 2 s: no stall under a 5 s bound."""
    p = Progress(bound_s=5.0)
    sids, ids = [f"s{i:02d}" for i in range(30)], [f"100-{i}" for i in range(30)]
    p.feed(rec("submit_ok", 0.0, sids=sids, ids=ids))
    for i, (sid, eid) in enumerate(zip(sids, ids)):
        t = 2.0 * (i + 1)
        assert p.tick(t - 0.01) == []
        p.feed(rec("reserve_ok", t, grants=[[eid, 1, sid, 1]]))
        p.feed(rec("complete_ok", t + 0.5, sid=sid))
        p.settle_line("commits", f"{int((t + 1.0) * 1000)}-0", {"ids": eid})
    assert p.stalls == [] and p.worst.length <= 2.0


def test_a_backlog_group_skipped_while_newer_ones_are_granted_is_a_stall() -> None:
    """The starvation of issue 12 item 2: newer entries granted past an old one are no progress for it."""
    p = Progress(bound_s=5.0)
    p.feed(rec("submit_ok", 0.0, sids=["big", "a", "b", "c"], ids=["100-0", "100-1", "100-2", "100-3"]))
    for i, (sid, eid) in enumerate([("a", "100-1"), ("b", "100-2"), ("c", "100-3")]):
        p.feed(rec("reserve_ok", 2.0 * (i + 1), grants=[[eid, 1, sid, 1]]))
    (gap,) = p.tick(7.0)
    assert (gap.sid, gap.state, gap.start) == ("big", "backlog", 0.0)
    p.feed(rec("reserve_ok", 20.0, grants=[["100-0", 1, "big", 8]]))
    assert [(s.sid, s.length) for s in p.stalls] == [("big", 20.0)]


def test_a_retried_attempt_does_not_move_the_backlog() -> None:
    p = Progress(bound_s=5.0)
    p.feed(rec("submit_ok", 0.0, sids=["old", "new"], ids=["100-0", "100-1"]))
    p.feed(rec("reserve_ok", 1.0, grants=[["100-0", 1, "old", 1]]))
    p.feed(rec("fail_ok", 2.0, sid="old"))
    p.feed(rec("reserve_ok", 4.0, grants=[["100-0", 2, "old", 1]]))  # a retry: not the backlog moving
    assert p.tick(5.9) == [] and abs(p.oldest_open(5.9) - 4.9) < 1e-9  # 'new' last moved at 1.0
    assert [g.sid for g in p.tick(6.5)] == ["new"]


def test_a_shipped_worker_s_grant_and_abort_are_changes_of_the_group_its_submit_named() -> None:
    """A shipped worker's events name the entry, never the source id (shipped.py): the submit did."""
    p = Progress(bound_s=5.0)
    p.feed(rec("submit_ok", 10.0, sids=[S0], ids=[E0]))
    p.feed(rec("reserve_ok", 14.0, grants=[[E0, 1, None, 2]], shipped=True))
    p.feed(rec("abort_ok", 18.0, eid=E0, attempt=1, shipped=True))
    p.feed(rec("reserve_ok", 22.0, grants=[[E0, 2, None, 2]], shipped=True))
    assert p.tick(26.0) == [] and p.oldest_open(26.0) == 4.0  # each was a change: no gap over 5 s
    assert p.groups[S0].state == "executing"
