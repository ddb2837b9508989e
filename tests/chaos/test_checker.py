"""The history checker on hand-written histories: it passes a clean one and names every kind of damage.

A checker that passes everything proves nothing, so each test starts from one clean history (two
groups submitted, completed, leased and committed), breaks it the way a bug would, and expects the
violation. No Redis here: the Redis truth is a hand-built ``Truth``.
"""

from __future__ import annotations

import copy
from typing import Any

import pytest

from chaos.checker import Spec, check
from chaos.roles import source_id
from chaos.truth import Truth

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


SPEC = Spec(groups=2, seed=SEED, poison_every=0)


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


def test_counters_that_disagree_with_the_records_are_caught() -> None:
    records, truth = clean_history()
    truth = copy.deepcopy(truth)
    truth.meta["retained"] = "1"
    assert any("meta counter retained" in v for v in violations(records, truth))
