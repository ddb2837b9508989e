"""The history checker on hand-written histories: it passes a clean one and names every kind of damage.

A checker that passes everything proves nothing, so each test starts from one clean history (two
groups submitted, completed, leased and committed), breaks it the way a bug would, and expects the
violation. No Redis here: the Redis truth is a hand-built ``Truth``.
"""

from __future__ import annotations

import copy
from typing import Any

import pytest

from rollout_queue import Receipt, Reservation, SourceGroup
from rollout_queue.demo.walkthrough import test_engine_generate as engine_generate
from rollout_queue.devtools.chaos.checker import Spec, _up_s, check
from rollout_queue.devtools.chaos.roles import prompt_of, source_id, weights_uri
from rollout_queue.devtools.chaos.samples import ENGINE_TOKENS, MAX_TOKENS, TRAJECTORY_TOKENS, sample_record
from rollout_queue.workers.attempt import sampling_for
from rollout_queue.workers.engines.base import SamplingConfig
from rollout_queue.workers.engines.scripted import ScriptedEngine
from rollout_queue.workers.trajectory import _turn_params
from rollout_queue.devtools.chaos.truth import Truth

SEED = 9
E0, E1 = "100-0", "100-1"
S0, S1 = source_id(SEED, 0), source_id(SEED, 1)
W = "chaos-w0:1:aa"


def rec(op: str, t: float, role: str, **fields: Any) -> dict[str, Any]:
    return {"op": op, "t": t, "role": role, "pid": 1, **fields}


def clean_history() -> tuple[list[dict[str, Any]], Truth]:
    records = [
        rec("start", 0.0, "producer"), rec("start", 0.0, "worker", worker=W), rec("start", 0.0, "trainer"),
        rec("submit_ok", 1.0, "producer", sids=[S0, S1], ids=[E0, E1]),
        rec("done", 1.1, "producer", groups=2),
        rec("reserve_ok", 2.0, "worker", grants=[[E0, 1, S0], [E1, 1, S1]], worker=W),
        rec("complete_invoke", 2.1, "worker", eid=E0, attempt=1, worker=W, late=False),
        rec("complete_ok", 2.2, "worker", eid=E0, attempt=1, worker=W, late=False, result="buffered"),
        rec("complete_invoke", 2.3, "worker", eid=E1, attempt=1, worker=W, late=False),
        rec("complete_ok", 2.4, "worker", eid=E1, attempt=1, worker=W, late=False, result="buffered"),
        rec("lease_ok", 3.0, "trainer", lease="L1", members=[[E0, 1, S0, 0], [E1, 1, S1, 0]]),
        rec("commit_invoke", 3.1, "trainer", lease="L1", ids=[E0, E1], step=1),
        rec("commit_ok", 3.2, "trainer", lease="L1", ids=[E0, E1], step=1),
    ]
    truth = Truth(
        pel={}, stream_ids=[], last_delivered=E1, ready=[], buffer=[], leases=[], lease_records={},
        ledger={E0: f"s|committed|1|{W}|L1|1", E1: f"s|committed|1|{W}|L1|1"},
        ids={S0: E0, S1: E1}, commits=[{"lease": "L1", "ids": f"{E0},{E1}", "step": "1"}], dlq=[],
        meta={"committed": "2", "dead": "0", "retained": "0", "executing_groups": "0",
              "executing_samples": "0", "leased": "0"},
    )
    return records, truth


SPEC = Spec(groups=2, seed=SEED, poison_every=0, lease_timeout_s=4.0)


def violations(records: list[dict[str, Any]], truth: Truth) -> list[str]:
    return check(records, truth, SPEC).violations


def test_a_clean_history_passes() -> None:
    records, truth = clean_history()
    report = check(records, truth, SPEC)
    assert report.violations == []
    assert (report.committed, report.lost, report.trained_twice, report.stuck) == (2, 0, 0, 0)


def test_a_group_neither_committed_nor_dead_is_lost() -> None:
    records, truth = clean_history()
    truth.commits = [{"lease": "L1", "ids": E0, "step": "1"}]
    records[-1]["ids"] = records[-2]["ids"] = [E0]
    records[-3]["members"] = [records[-3]["members"][0]]
    truth.ledger[E1] = f"a|1|{W}|completed"
    truth.meta["committed"] = "1"
    report = check(records, truth, SPEC)
    assert report.lost == 1 and any("lost" in v for v in report.violations)


def test_a_group_in_two_committed_leases_is_trained_twice() -> None:
    records, truth = clean_history()
    records += [rec("lease_ok", 4.0, "trainer", lease="L2", members=[[E0, 1, S0, 0]]),
                rec("commit_invoke", 4.1, "trainer", lease="L2", ids=[E0], step=2),
                rec("commit_ok", 4.2, "trainer", lease="L2", ids=[E0], step=2)]
    truth.commits.append({"lease": "L2", "ids": E0, "step": "2"})
    report = check(records, truth, SPEC)
    assert report.trained_twice == 1 and any("trained in 2 leases" in v for v in report.violations)


def test_anything_owned_at_the_end_is_stuck() -> None:
    records, truth = clean_history()
    truth.pel = {"100-5": ("chaos-w1:2:bb", 1)}
    truth.ready = ["100-6"]
    report = check(records, truth, SPEC)
    assert report.stuck == 2 and any("still owned" in v for v in report.violations)


def test_a_settlement_accepted_after_a_later_attempt_was_reserved_is_late() -> None:
    records, truth = clean_history()
    records.insert(6, rec("reserve_ok", 2.05, "worker", grants=[[E0, 2, S0]], worker="chaos-w1:2:bb"))
    assert any("late complete accepted" in v for v in violations(records, truth))


def test_an_acknowledged_commit_missing_from_redis_is_a_durability_violation() -> None:
    records, truth = clean_history()
    records += [rec("lease_ok", 4.0, "trainer", lease="L9", members=[[E0, 1, S0, 0]]),
                rec("commit_invoke", 4.1, "trainer", lease="L9", ids=[E0], step=2),
                rec("commit_ok", 4.2, "trainer", lease="L9", ids=[E0], step=2)]
    assert any("acknowledged commit is not in Redis" in v for v in violations(records, truth))


def test_the_same_loss_inside_an_everysec_window_is_explained_and_measured() -> None:
    records, truth = clean_history()
    records += [rec("lease_ok", 4.0, "trainer", lease="L9", members=[[E0, 1, S0, 0]]),
                rec("commit_invoke", 4.1, "trainer", lease="L9", ids=[E0], step=2),
                rec("commit_ok", 4.2, "trainer", lease="L9", ids=[E0], step=2),
                rec("redis_kill", 4.9, "harness", kill_t=4.9, loss_from=3.9)]
    report = check(records, truth, SPEC)
    assert report.violations == []
    assert report.trained_twice == 1
    (lost,) = report.lost_acks
    assert (lost["kind"], lost["explained"], lost["age_before_kill_s"]) == ("commit", True, 0.7)


def test_a_ledger_receipt_the_worker_was_refused_is_caught() -> None:
    records, truth = clean_history()
    records[7] = rec("complete_refused", 2.2, "worker", eid=E0, attempt=1, worker=W, late=True,
                     error="StaleReceipt")
    assert any("refused to its worker but trained" in v for v in violations(records, truth))


def test_an_accepted_settlement_the_ledger_does_not_show_is_caught() -> None:
    records, truth = clean_history()
    truth.ledger[E0] = "s|committed|1|chaos-w9:9:zz|L1|1"
    found = violations(records, truth)
    assert any("never sent by that worker" in v for v in found)
    assert any("acknowledged complete is not in Redis" in v for v in found)


def test_a_commit_line_without_a_logged_lease_is_caught() -> None:
    records, truth = clean_history()
    truth.commits.append({"lease": "L7", "ids": "", "step": "3"})
    assert any("does not match a lease the trainer logged" in v for v in violations(records, truth))


@pytest.mark.parametrize("op", ["crash", "payload_mismatch"])
def test_crashes_and_wrong_payloads_fail_the_run(op: str) -> None:
    records, truth = clean_history()
    records.append(rec(op, 5.0, "worker", error_type="ScriptError", error="boom", lease="L1", ids=[E0]))
    assert violations(records, truth)


@pytest.mark.parametrize("kind, paused, excused", [
    ("hang", True, True), ("hang_async", True, True), ("hang", False, False), ("oov", True, False)])
def test_a_hang_group_is_excused_only_when_its_shipped_worker_was_paused_across_it(
        kind: str, paused: bool, excused: bool) -> None:
    """A hanging tool call returns a valid step after 3 x the step deadline; a worker SIGSTOPped across
    it finds the step there at SIGCONT and completes a real trajectory. Nothing else is excused."""
    records, truth = clean_history()
    for r in records:
        if r["op"] in ("reserve_ok", "complete_ok"):
            r["shipped"] = True
    records.append(rec("payload_mismatch", 3.05, "trainer", lease="L1", ids=[E0],
                       why={E0: f"a hostile group ({kind}) was trained with a trajectory"}))
    if paused:
        records += [rec("signal", 2.05, "harness", slot="traj0", child=1, sig="SIGSTOP", kind="worker_pause"),
                    rec("signal", 2.15, "harness", slot="traj0", child=1, sig="SIGCONT", kind="worker_pause_end")]
    report = check(records, truth, SPEC)
    mismatch = [v for v in report.violations if "not what their attempt generated" in v]
    assert (mismatch == []) is excused and report.hang_after_pause == int(excused)


def test_counters_that_disagree_with_the_records_are_caught() -> None:
    records, truth = clean_history()
    truth = copy.deepcopy(truth)
    truth.meta["retained"] = "1"
    assert any("meta counter retained" in v for v in violations(records, truth))


# -- issue 12: dead letters, callers' bounds, downtime, liveness ---------------------------------------

PSPEC = Spec(groups=2, seed=SEED, poison_every=2, lease_timeout_s=4.0)  # group 1 is poison, group 0 is valid


def _dead(truth: Truth, eid: str, sid: str) -> None:
    truth.dlq.append({"entry_id": eid, "source_id": sid, "reason": "worker lost", "attempt": 6, "worker": W,
                      "history": [{"a": 1, "r": "lost"}], "stream_id": "5000-0"})
    truth.ledger[eid] = f"s|dead|1|{W}|worker lost"
    truth.meta["dead"] = str(len(truth.dlq))


def _only(records: list[dict[str, Any]], truth: Truth, eid: str) -> None:
    """Make the clean history commit only ``eid``."""
    for r in records:
        if r["op"] in ("commit_invoke", "commit_ok"):
            r["ids"] = [eid]
        if r["op"] == "lease_ok":
            r["members"] = [m for m in r["members"] if m[0] == eid]
    truth.commits = [{"lease": "L1", "ids": eid, "step": "1"}]
    truth.ledger = {eid: f"s|committed|1|{W}|L1|1"}
    truth.meta["committed"] = "1"


def test_a_poison_prompt_dead_lettered_is_expected() -> None:
    records, truth = clean_history()
    _only(records, truth, E0)
    _dead(truth, E1, S1)
    report = check(records, truth, PSPEC)
    assert report.violations == []
    assert (report.dead, report.dead_poison, report.dead_valid) == (1, 1, 0)


def test_a_valid_group_dead_lettered_fails_the_run() -> None:
    records, truth = clean_history()
    _only(records, truth, E1)
    _dead(truth, E0, S0)
    report = check(records, truth, PSPEC)
    assert report.dead_valid == 1
    assert any(f"valid group {S0}" in v and "worker lost" in v for v in report.violations)
    assert any("poison group" in v for v in report.violations)  # and the poison one was trained


def _grant(records: list[dict[str, Any]], cap: int, overcommit: int, sizes: list[int]) -> None:
    records[5] = rec("reserve_ok", 2.0, "worker", worker=W, max_samples=cap, overcommit=overcommit,
                     grants=[[e, 1, s, n] for (e, s), n in zip([(E0, S0), (E1, S1)], sizes)])


def test_a_worker_granted_more_samples_than_its_slots_is_caught() -> None:
    records, truth = clean_history()
    _grant(records, 4, 0, [3, 2])
    assert any("with 4 slots" in v for v in violations(records, truth))


def test_one_group_beyond_the_slots_of_a_worker_that_overcommits_is_allowed() -> None:
    records, truth = clean_history()
    _grant(records, 2, 1, [8])
    records[5]["grants"] = records[5]["grants"][:1]
    records.insert(6, rec("reserve_ok", 2.05, "worker", worker=W, max_samples=2, overcommit=1,
                          grants=[[E1, 1, S1, 2]]))
    report = check(records, truth, SPEC)
    assert report.violations == [] and report.oversize_grants == 1


def test_an_overcommitting_worker_granted_a_second_group_beyond_its_slots_is_caught() -> None:
    records, truth = clean_history()
    _grant(records, 2, 1, [8, 1])
    assert any("with 2 slots (overcommit=True)" in v for v in violations(records, truth))


def _outage(records: list[dict[str, Any]], start: float, end: float) -> None:
    records += [rec("redis_outage", start, "harness", how="stop", kill_t=start, down_s=end - start,
                    worker_timeout_s=1.0),
                rec("redis_restart", end, "harness", pid=2, outage="stop", down_s=end - start)]


def _refuse_e0(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """E0's complete refused (StaleReceipt) at 2.2; attempt 2 of another worker commits it."""
    w2 = "chaos-w1:2:bb"
    records[7] = rec("complete_refused", 2.2, "worker", eid=E0, attempt=1, worker=W, late=True,
                     error="StaleReceipt", sid=S0)
    records.insert(8, rec("reserve_ok", 2.25, "worker", grants=[[E0, 2, S0]], worker=w2, pid=2))
    records.insert(9, rec("complete_invoke", 2.26, "worker", eid=E0, attempt=2, worker=w2, late=False))
    records.insert(10, rec("complete_ok", 2.27, "worker", eid=E0, attempt=2, worker=w2, late=False))
    for r in records:
        if r["op"] == "lease_ok":
            r["members"][0][1] = 2
    return records


def _refused_truth(truth: Truth) -> Truth:
    truth.ledger[E0] = "s|committed|2|chaos-w1:2:bb|L1|1"
    return truth


def test_a_receipt_refused_to_a_live_worker_across_an_outage_is_downtime_counted_against_it() -> None:
    records, truth = clean_history()
    records = _refuse_e0(records)
    _outage(records, 2.05, 2.15)
    report = check(records, _refused_truth(truth), SPEC)
    assert report.refused_across_outage == 1
    assert any("downtime was counted against it" in v for v in report.violations)
    assert [(o["how"], o["longer_than_worker_timeout"]) for o in report.outages] == [("stop", False)]


def test_a_receipt_refused_to_a_worker_paused_while_it_held_it_is_expected() -> None:
    records, truth = clean_history()
    records = _refuse_e0(records)
    _outage(records, 2.05, 2.15)
    records += [rec("signal", 2.01, "harness", slot="worker0", child=1, sig="SIGSTOP", kind="worker_pause"),
                rec("signal", 2.19, "harness", slot="worker0", child=1, sig="SIGCONT", kind="worker_pause_end")]
    report = check(records, _refused_truth(truth), SPEC)
    assert report.violations == [] and report.refused_paused == 1


def test_a_refused_grant_acknowledged_in_an_everysec_loss_window_is_explained() -> None:
    """A simulated host crash dropped the grant itself: the group was granted again, legitimately."""
    records, truth = clean_history()
    records = _refuse_e0(records)
    records += [rec("redis_kill", 2.1, "harness", kill_t=2.1, loss_from=1.95),
                rec("redis_restart", 2.15, "harness", pid=2)]
    report = check(records, _refused_truth(truth), SPEC)
    assert report.violations == [] and report.refused_lost_write == 1


def test_a_pause_inside_the_reserve_call_explains_the_refusal() -> None:
    """Paused after Redis granted but before the reply was read: the grant is logged after SIGCONT."""
    records, truth = clean_history()
    records = _refuse_e0(records)
    records[5]["sent"] = 1.5
    records += [rec("signal", 1.6, "harness", slot="worker0", child=1, sig="SIGSTOP", kind="worker_pause"),
                rec("signal", 1.99, "harness", slot="worker0", child=1, sig="SIGCONT", kind="worker_pause_end")]
    report = check(records, _refused_truth(truth), SPEC)
    assert report.violations == [] and report.refused_paused == 1


def test_a_refusal_with_neither_pause_nor_outage_is_counted_not_failed() -> None:
    records, truth = clean_history()
    report = check(_refuse_e0(records), _refused_truth(truth), SPEC)
    assert report.violations == [] and report.refused_unexplained == 1


def test_a_live_trainers_lease_expiring_across_an_outage_is_caught() -> None:
    records, truth = clean_history()
    records += [rec("lease_ok", 4.0, "trainer", lease="L2", members=[[E0, 1, S0, 0]]),
                rec("commit_invoke", 4.1, "trainer", lease="L2", ids=[E0], step=2),
                rec("commit_refused", 9.0, "trainer", lease="L2", ids=[E0], state="expired")]
    assert not violations(records, truth)  # a lease that expired with Redis up: the trainer was slow
    _outage(records, 4.2, 8.0)
    assert any("expired across a Redis outage" in v for v in violations(records, truth))


def test_a_lease_that_expired_after_its_whole_timeout_of_up_time_is_no_violation() -> None:
    """Redis was down in the lease's life, but the trainer then held it for more than
    lease_timeout_s of up-time: the queue clock rightly expired it."""
    records, truth = clean_history()
    records += [rec("lease_ok", 4.0, "trainer", lease="L2", members=[[E0, 1, S0, 0]]),
                rec("commit_invoke", 4.1, "trainer", lease="L2", ids=[E0], step=2),
                rec("commit_refused", 10.0, "trainer", lease="L2", ids=[E0], state="expired")]
    _outage(records, 4.2, 5.5)  # 6.0 s of which 4.7 s up: past the 4 s timeout
    assert not violations(records, truth)


def test_a_hold_lost_across_an_outage_is_caught() -> None:
    records, truth = clean_history()
    records += [rec("publish_invoke", 4.0, "trainer", hold_timeout_s=5.0),
                rec("publish_refused", 9.0, "trainer", hold="H1")]
    assert not violations(records, truth)
    _outage(records, 4.2, 8.0)
    assert any("admission hold H1" in v for v in violations(records, truth))


def test_a_hold_lost_after_its_whole_timeout_of_up_time_is_counted_not_failed() -> None:
    """Found in CI: an update invoked as Redis came back from a 5.4 s outage (the harness logs the
    restart after clients may already use it) was refused 6.6 s later, on a loaded machine. Its
    hold had lived its 5 s of up-time: losing it was right."""
    records, truth = clean_history()
    invoked = rec("publish_invoke", 8.9, "trainer", hold_timeout_s=5.0)
    records += [invoked, rec("publish_refused", 15.5, "trainer", hold="H1")]
    _outage(records, 3.6, 9.0)
    report = check(records, truth, SPEC)
    assert report.violations == [] and report.holds_lost == 1
    invoked["hold_timeout_s"] = 8.0  # a longer hold lost as early would have had downtime counted
    assert any("admission hold H1" in v for v in check(records, truth, SPEC).violations)


def test_up_time_leaves_out_every_outage_once() -> None:
    down = [(2.0, 3.0, {}), (2.5, 4.0, {}), (6.0, float("inf"), {})]
    assert _up_s(down, 0.0, 10.0) == pytest.approx(2.0 + 2.0)
    assert _up_s(down, 2.2, 3.5) == 0.0
    assert _up_s([], 1.0, 2.5) == 1.5


def test_refused_checkpoints_are_counted_not_failed() -> None:
    records, truth = clean_history()
    records += [rec("checkpoint_refused", 4.0, "trainer", step=10, error="LeasesOpen", leased=3),
                rec("checkpoint_refused", 4.1, "trainer", step=10, error="CheckpointRegression", checkpoint=20),
                rec("checkpoint_ok", 4.2, "trainer", step=30, dropped=2)]
    report = check(records, truth, SPEC)
    assert report.violations == []
    assert (report.checkpoints, report.checkpoints_refused) == (1, {"LeasesOpen": 1, "CheckpointRegression": 1})


@pytest.mark.parametrize("op", ["lease_probe_answered", "lease_unsatisfiable"])
def test_a_lease_bound_answered_wrongly_is_caught(op: str) -> None:
    records, truth = clean_history()
    records.append(rec(op, 4.0, "trainer", groups=65, got=None, bound="max_completed_groups", limit=64))
    assert any("lease of" in v for v in violations(records, truth))


def test_a_group_without_progress_for_longer_than_the_bound_fails_the_run() -> None:
    from rollout_queue.devtools.chaos.progress import replay

    records, truth = clean_history()
    lines = [("3500-0", {"lease": "L1", "ids": f"{E0},{E1}"})]
    fast = replay(records, lines, [], truth.ids, bound_s=1.5, end=4.0)
    assert check(records, truth, SPEC, fast).violations == []
    slow = replay(records, lines, [], truth.ids, bound_s=0.5, end=4.0)  # 2.4 -> 3.0 and 1.0 -> 2.0 ...
    found = check(records, truth, SPEC, slow).violations
    assert any(f"group {S0} made no progress for 1.0s (bound 0.5s) while backlog" in v for v in found), found


def test_a_stall_inside_an_everysec_loss_window_is_explained() -> None:
    from rollout_queue.devtools.chaos.progress import replay

    records, truth = clean_history()
    records.append(rec("redis_kill", 1.95, "harness", kill_t=1.95, loss_from=0.95))
    slow = replay(records, [("3500-0", {"lease": "L1", "ids": f"{E0},{E1}"})], [], truth.ids, bound_s=0.9, end=4.0)
    assert slow.stalls  # submit at 1.0 -> grant at 2.0 is over 0.9 s, but inside the window's reach
    assert check(records, truth, SPEC, slow).violations == []


# -- issue 29: counted failures charged to their groups, shipped workers, pushes, the adversary -------

T = "chaos-t0:7:cc"  # a shipped worker (pid 7)
HSPEC = Spec(groups=2, seed=SEED, poison_every=0, lease_timeout_s=4.0, hostile_every=2)  # group 1: "hang"


def shipped(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The clean history with a shipped worker process that started (and did nothing else)."""
    return records + [{**rec("spawned", 0.5, "traj", worker=T, shipped=True), "pid": 7},
                      {**rec("start", 0.6, "traj", worker=T, shipped=True, version=0), "pid": 7}]


def attempt(truth: Truth, eid: str, *items: tuple[int, str, str, str]) -> Truth:
    """Give ``eid`` a history of (attempt, worker, terminal, reason) records, as the queue writes it."""
    truth.history[eid] = {"f": 0, "h": [{"a": a, "w": w, "t": t, "r": r, "ms": 1000} for a, w, t, r in items]}
    return truth


HANG = "environment step exceeded its 1 s deadline"


def test_a_hostile_group_failing_its_own_way_on_a_shipped_worker_is_charged_to_it() -> None:
    records, truth = clean_history()
    report = check(shipped(records), attempt(truth, E1, (1, T, "failed", HANG)), HSPEC)
    assert report.violations == [] and report.charges == {"hang": 1}


@pytest.mark.parametrize("eid,worker,terminal,reason", [
    (E0, T, "failed", HANG),                      # a healthy group: nothing of its own made it fail
    (E1, W, "failed", HANG),                      # a test-engine worker ignores hostility
    (E1, T, "failed", "environment step raised RuntimeError('x')"),  # not the way this group breaks
    (E1, T, "malformed", "outputs do not cover the slots"),  # no group is designed to be malformed
    (E0, T, "lost", "fatal worker error: OverflowError('int too large to convert to float')"),  # issue 29's
    (E0, T, "lost", "worker silent past worker_timeout"),  # a live worker's group, nothing explains it
])
def test_a_counted_failure_of_a_group_that_did_not_cause_it_fails_the_run(eid: str, worker: str, terminal: str,
                                                                          reason: str) -> None:
    records, truth = clean_history()
    report = check(shipped(records), attempt(truth, eid, (2, worker, terminal, reason)), HSPEC)
    found = [v for v in report.violations if "counted failure charged to a group that did not cause it" in v]
    assert len(found) == 1 and report.charges == {"innocent": 1}, report.violations
    assert all(x in found[0] for x in (f"entry {eid}", "attempt 2", worker, f"terminal {terminal}", reason[:20]))


def test_a_poison_prompt_failing_in_either_engine_is_charged_to_it() -> None:
    records, truth = clean_history()
    _only(records, truth, E0)
    _dead(truth, E1, S1)
    attempt(truth, E1, (1, W, "failed", "test engine: poison prompt"),
            (2, T, "failed", "request failed: scripted failure: the prompt contains '<poison>'"))
    report = check(shipped(records), truth, PSPEC)
    assert report.violations == [] and report.charges == {"poison": 2}


@pytest.mark.parametrize("how", ["kill", "pause", "outage", "uncounted"])
def test_a_lost_attempt_is_explained_by_what_happened_to_its_worker(how: str) -> None:
    records, truth = shipped(clean_history()[0]), clean_history()[1]
    reason = "worker silent past worker_timeout"
    if how in ("kill", "pause"):
        records.append(rec("signal", 3.0, "harness", slot="traj0", child=7, sig="SIGKILL" if how == "kill" else "SIGSTOP"))
    elif how == "outage":
        _outage(records, 3.0, 5.0)  # reaped 1 s after Redis came back: within the grace
        truth.reaped = [{"worker": T, "ids": E0, "terminal": "lost", "stream_id": "6000-0"}]
    else:
        reason = "worker did not come back after a Redis outage (not counted)"
    report = check(records, attempt(truth, E0, (1, T, "lost", reason)), HSPEC)
    assert report.violations == []
    assert report.charges == ({} if how == "uncounted" else {f"lost:{how}": 1})


def test_a_hostile_group_may_be_dead_lettered_a_healthy_one_may_not() -> None:
    records, truth = clean_history()
    _only(records, truth, E0)
    _dead(truth, E1, S1)
    report = check(shipped(records), truth, HSPEC)
    assert report.violations == [] and (report.dead, report.dead_hostile, report.dead_valid) == (1, 1, 0)


@pytest.mark.parametrize("code,killed,fails", [(0, False, False), (-9, True, False), (-15, False, False),
                                               (-9, False, True), (1, False, True), (3, False, True)])
def test_a_shipped_worker_ends_only_drained_or_killed(code: int, killed: bool, fails: bool) -> None:
    records = shipped(clean_history()[0])
    if killed:
        records.append(rec("signal", 3.0, "harness", slot="traj0", child=7, sig="SIGKILL", kind="worker_kill"))
    records.append(rec("exit", 3.1, "harness", slot="traj0", child=7, code=code))
    found = [v for v in violations(records, clean_history()[1]) if "shipped worker traj0" in v]
    assert bool(found) == fails, found


def test_a_fatal_error_of_a_shipped_worker_fails_the_run() -> None:
    records = shipped(clean_history()[0]) + [{**rec("fatal", 3.0, "traj", worker=T, error="OverflowError()"),
                                              "pid": 7}]
    assert any("stopped on a fatal error" in v for v in violations(records, clean_history()[1]))


def pushes(*extra: dict[str, Any], seconds: float = 1.0, applied: int = 1) -> list[dict[str, Any]]:
    """The clean history with one pushed version 1 (one round, done) that worker T applied."""
    uri = "file:///chaos/weights/v1"
    out = shipped(clean_history()[0]) + [
        rec("push_invoke", 4.0, "pusher", version=1, uri=uri, deadline_s=2.0),
        rec("push_ok", 4.0 + seconds, "pusher", version=1, acked=[T], dropped=[], rounds=[
            {"epoch": 1, "outcome": "done", "seconds": seconds, "members": [T], "acked": [T], "unreached": [],
             "error": None}]),
        rec("publish_record", 5.5, "pusher", version=1, uri=uri),
        {**rec("push_received", 5.0, "traj", worker=T, version=1, epoch=1), "pid": 7},
        {**rec("weights_applied", 5.6, "traj", worker=T, version=applied, uri=f"file:///chaos/weights/v{applied}"),
         "pid": 7},
        rec("final_version", 9.0, "harness", version=1, live=[7], waited_s=0.1)]
    return out + list(extra)


def test_a_clean_push_passes() -> None:
    report = check(pushes(), clean_history()[1], SPEC)
    assert report.violations == [] and report.pushes["rounds"] == {"done": 1}


@pytest.mark.parametrize("history,expected", [
    (lambda: pushes(seconds=6.0), "past its 2.0 s deadline"),
    (lambda: pushes(applied=2), "which no publisher asked the queue to record"),
    (lambda: pushes(rec("push_invented_joined", 4.5, "pushfault", worker="chaos-invented:x", epoch=1, rank=2)),
     "only live workers may take a rank"),
    (lambda: pushes(rec("publish_record", 8.0, "pusher", version=2, uri="file:///chaos/weights/v2"),
                    rec("final_version", 9.5, "harness", version=2, live=[7], waited_s=20)),
     "is on version 1; the queue recorded 2"),
    (lambda: pushes(rec("push_invoke", 8.0, "pusher", version=2, uri="u", deadline_s=2.0)), "never returned"),
])
def test_push_rules_fail_the_run(history: Any, expected: str) -> None:
    found = violations(history(), clean_history()[1])
    assert any(expected in v for v in found), found


def test_a_retry_round_that_admits_an_unreached_member_fails_the_run() -> None:
    records = pushes()
    records[-5]["rounds"] = [
        {"epoch": 1, "outcome": "failed", "seconds": 2.0, "members": [T, "g"], "acked": [], "unreached": ["g"],
         "error": "timeout"},
        {"epoch": 2, "outcome": "failed", "seconds": 2.0, "members": [T, "g"], "acked": [], "unreached": ["g"],
         "error": "timeout"}]
    assert any("which never reached the trainer" in v for v in violations(records, clean_history()[1]))


def adv(line: list[str], predicted: str, outcome: str, ids: list[str], scope: str = "entry") -> dict[str, Any]:
    return rec("adv_cmd", 2.5, "adversary", sent=2.5, command=line[0].lower(), key="src", line=line,
               predicted=predicted, outcome=outcome, detail="", ids=ids, scope=scope)


def test_a_command_the_rules_refuse_that_ran_fails_the_run_and_one_refused_passes() -> None:
    records, truth = clean_history()
    refused = check(records + [adv(["XACK", "src", "rollout", E0], "refused", "refused", [E0])], truth, SPEC)
    assert refused.violations == [] and refused.adversary["refused"] == 1
    ran = check(records + [adv(["XACK", "src", "rollout", E0], "refused", "ran", [E0])], truth, SPEC)
    assert any("which role_rules refuses" in v for v in ran.violations)


def test_a_violation_about_an_entry_an_adversary_command_touched_names_the_command() -> None:
    """XACK of an entry a worker owns (what a worker credential may do on main): the group is lost,
    and the checker says which command did it."""
    records, truth = clean_history()
    _only(records, truth, E0)
    truth.ledger[E1] = f"a|1|{W}|executing"
    report = check(records + [adv(["XACK", "rollout:{q}:src", "rollout", E1], "allowed", "ran", [E1])], truth, SPEC)
    lost = [v for v in report.violations if f"group {S1} was neither committed nor dead-lettered" in v]
    assert lost and "[the adversary's XACK rollout:{q}:src rollout" in lost[0]
    assert report.adversary["violations_blamed"] >= 1


# -- partial rollouts: what is trained, token by token (samples.py) -----------------------------------


def _test_sample(sid: str, i: int, attempt: int, slot: int = 0, version: int = 0) -> dict[str, Any]:
    """The test engine's sample for (group i, slot, attempt), as the trainer logs it."""
    probe = Reservation(Receipt("0-0", attempt, W), SourceGroup(sid, prompt_of(SEED, i), n=1), version)
    return sample_record(engine_generate(probe, slot))


def _trajectory(sid: str, i: int, versions: tuple[int, ...], slot: int = 0) -> dict[str, Any]:
    """A healthy shipped worker's trajectory of group ``i`` (1 + i % 3 model turns, ``<oK>`` after
    model turn K), model turn K generated under ``versions[K]``: what the scripted engine gives."""
    eng = ScriptedEngine("", tokens=ENGINE_TOKENS)
    base = sampling_for(SamplingConfig(max_tokens=MAX_TOKENS, seed=SEED), sid, slot)
    context, tokens, turns, segments = eng.encode(prompt_of(SEED, i)), [], [], []
    for k in range(1 + i % 3):
        eng.weights_uri = weights_uri(versions[k]) if versions[k] else ""
        out = list(eng.tokens_for("", eng.decode(context), _turn_params(base, k, TRAJECTORY_TOKENS - len(tokens))))
        if not segments or segments[-1][1] != versions[k]:
            segments.append([len(tokens), versions[k]])
        turns.append(["model", len(out), versions[k]])
        tokens += out
        if k < i % 3:
            obs = list(eng.encode_continuation(f"<o{k}>"))
            turns.append(["observation", len(obs), 0])
            tokens += obs
        context = eng.encode(prompt_of(SEED, i)) + tokens
    return {"slot": slot, "tokens": tokens, "version": versions[0], "versions": sorted(set(versions)),
            "segments": segments if len(segments) > 1 else [], "turns": turns, "finish": "stop"}


def _trained(records: list[dict[str, Any]], *groups: list[Any]) -> list[dict[str, Any]]:
    return records + [rec("trained", 3.0, "trainer", lease="L1", groups=list(groups))]


def _sample_violations(records: list[dict[str, Any]], truth: Truth) -> list[str]:
    return [v for v in violations(records, truth) if "trained sample" in v or "progress record" in v]


def _shipped_attempt(records: list[dict[str, Any]], eid: str, versions_applied: tuple[tuple[float, int], ...]
                     ) -> list[dict[str, Any]]:
    """Shipped worker T reserved ``eid`` (attempt 1) at t=2.0 and applied these (t, version)s; the
    publishers recorded each version 0.1 s before it was applied."""
    out = shipped(records) + [{**rec("reserve_ok", 2.0, "traj", worker=T, shipped=True,
                                     grants=[[eid, 1, None, 1]]), "pid": 7}]
    for t, v in versions_applied:
        out += [rec("publish_record", t - 0.1, "pusher", version=v, uri=weights_uri(v)),
                {**rec("weights_applied", t, "traj", worker=T, shipped=True, version=v, uri=weights_uri(v)), "pid": 7}]
    return out


def test_trained_samples_that_are_what_their_engines_generated_pass() -> None:
    records, truth = clean_history()
    records = _shipped_attempt(records, E1, ((2.5, 1),))
    found = _sample_violations(_trained(records, [E0, 1, S0, [_test_sample(S0, 0, 1)]],
                                        [E1, 1, S1, [_trajectory(S1, 1, (0, 1))]]), truth)
    assert found == []


def test_a_continuation_that_repeats_its_prefix_is_tokens_trained_twice() -> None:
    records, truth = clean_history()
    records = _shipped_attempt(records, E1, ())
    good = _trajectory(S1, 1, (0, 0))
    first = good["turns"][0][1] + good["turns"][1][1]  # model turn 0 and its observation: the checkpoint
    repeated = {**good, "tokens": good["tokens"][:first] * 2 + good["tokens"][first:],
                "turns": good["turns"][:2] * 2 + good["turns"][2:]}
    found = _sample_violations(_trained(records, [E1, 1, S1, [repeated]]), truth)
    assert any("trained twice" in v for v in found), found
    # A test-engine sample with a prefix repeated, and one longer than the engine's output.
    one = _test_sample(S0, 0, 1)
    for tokens in (one["tokens"][:3] + one["tokens"], one["tokens"] + one["tokens"][:2]):
        found = _sample_violations(_trained(clean_history()[0], [E0, 1, S0, [{**one, "tokens": tokens}]]), truth)
        assert any("trained twice" in v or "beyond what the engine generated" in v for v in found), found


def test_a_model_turn_longer_than_max_tokens_fails() -> None:
    records, truth = clean_history()
    good = _trajectory(S1, 1, (0, 0))
    n0 = good["turns"][0][1]
    long = {**good, "tokens": good["tokens"][:n0] * 2 + good["tokens"][n0:],
            "turns": [["model", 2 * n0, 0]] + good["turns"][1:]}
    found = _sample_violations(_trained(records, [E1, 1, S1, [long]]), truth)
    assert any("more than max_tokens" in v for v in found), found


def test_versions_a_sample_could_not_have_run_under_fail() -> None:
    records, truth = clean_history()
    # Version 3 was never published: its tokens replay the same (its weights URI is named), its version does not.
    never = _trajectory(S1, 1, (0, 3))
    found = _sample_violations(_trained(_shipped_attempt(records, E1, ((2.5, 1),)), [E1, 1, S1, [never]]), truth)
    assert any("claims version 3, which was never published" in v for v in found), found
    # Published after the lease: too late for any attempt of it.
    late = _shipped_attempt(records, E1, ((2.5, 1),)) + [rec("publish_record", 3.5, "pusher", version=2, uri="x")]
    found = _sample_violations(_trained(late, [E1, 1, S1, [_trajectory(S1, 1, (0, 2))]]), truth)
    assert any("claims version 2, which was only published at 3.500" in v for v in found), found
    # Published in time, but the worker holding the attempt never loaded it.
    unloaded = _shipped_attempt(records, E1, ()) + [rec("publish_record", 2.2, "pusher", version=1, uri="x")]
    found = _sample_violations(_trained(unloaded, [E1, 1, S1, [_trajectory(S1, 1, (0, 1))]]), truth)
    assert any("that no shipped worker holding an attempt of it had loaded" in v for v in found), found
    # Stamped with the new version though generated under the old one: the replay tells them apart.
    stamped = {**_trajectory(S1, 1, (0, 0)), "version": 1, "versions": [1]}
    stamped["turns"] = [[role, n, 1 if role == "model" else 0] for role, n, _ in stamped["turns"]]
    found = _sample_violations(_trained(_shipped_attempt(records, E1, ((1.9, 1),)), [E1, 1, S1, [stamped]]), truth)
    assert any("not the scripted engine's output after its prefix under version 1" in v for v in found), found
    # A test-engine sample at another version than its reservation's.
    reserved = [{**r, "version": 0} if r["op"] == "reserve_ok" else r for r in records]
    found = _sample_violations(_trained(reserved + [rec("publish_record", 1.5, "trainer", version=1, uri="x")],
                                        [E0, 1, S0, [_test_sample(S0, 0, 1, version=1)]]), truth)
    assert any("its test-engine attempt was reserved at version 0" in v for v in found), found


@pytest.mark.parametrize("segments,why", [([[0, 1], [3, 0]], "goes back from version 1 to 0"),
                                          ([[2, 0]], "offsets must rise from 0"),
                                          ([[0, 0], [99, 1]], "offsets must rise from 0"),
                                          ([[0, 1]], "is not its version 0")])
def test_malformed_segments_fail(segments: list[list[int]], why: str) -> None:
    records, truth = clean_history()
    records += [rec("publish_record", 1.0, "trainer", version=1, uri="x")]
    forged = {**_test_sample(S0, 0, 1), "segments": segments}
    found = _sample_violations(_trained(records, [E0, 1, S0, [forged]]), truth)
    assert any(why in v for v in found), found


def test_a_progress_record_left_after_its_group_settled_fails() -> None:
    records, truth = clean_history()
    truth.partial_heads = {E0: f"1|6|0|120|{T}"}
    found = _sample_violations(records, truth)
    assert any(f"progress record of {E0}" in v and "left after its group was committed" in v for v in found), found
    truth.partial_heads = {}
    assert _sample_violations(records, truth) == []
