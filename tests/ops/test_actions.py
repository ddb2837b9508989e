"""Contracts of the operator's scripts (requeue, config_set, drain, dlq_purge), against real servers:
each outcome in the header, refusals that leave every key byte-identical, replays, and the header
KEYS/ARGV against the builder."""

from __future__ import annotations

import time
from typing import Any

import pytest
import redis

from rollout_queue import ConfigMismatch, QueueConfig, Receipt, RolloutQueue, StaleReceipt
from rollout_queue.ops import actions, views
from rollout_queue.core import protocol as p
from rollout_queue.core.scripts import SCRIPTS
from tests.ops.conftest import ALIVE, SILENT, KnownState, samples


def dump(r: redis.Redis, st: KnownState) -> dict[bytes, Any]:
    return {k: r.dump(k) for k in r.scan_iter(f"{st.prefix}:*") if not k.endswith((b":wake:work", b":clock"))}


@pytest.mark.parametrize("name, keys, argv", [
    ("requeue", ("src", "meta", "ready", "workers", "history", "ledger", "dlq", "parked", "settled", "wake_work",
                 "counters"),
     ("entry_id", "attempt", "worker_id", "mode", "terminal", "reason")),
    ("config_set", ("meta", "counters"), ("library", "*fields")),
    ("drain", ("meta", "holds", "wake_work", "wake_done"), ("action", "timeout_ms", "reason")),
    ("dlq_purge", ("meta", "dlq", "settled", "counters"), ("count", "until_id", "*dlq_ids")),
])
def test_headers_define_the_calls(name: str, keys: tuple[str, ...], argv: tuple[str, ...]) -> None:
    from tests.contract.lifecycle import check_header

    check_header(name, keys, argv)
    assert {"KEYS:", "ARGV:", "Returns:", "Invariant:"} <= set(SCRIPTS[name].header.split())


def test_requeue_fences_the_exact_receipt(known_state: KnownState, r: redis.Redis) -> None:
    st, keys = known_state, known_state.q.keys
    entry_id = st.ids[6]  # executing on silent host-b, attempt 1
    before = dump(r, st)
    for attempt, worker in ((2, SILENT), (1, ALIVE)):  # a receipt that is not the current attempt
        call = p.build(keys, "requeue", entry_id=entry_id, attempt=attempt, worker_id=worker, mode="force",
                       terminal="aborted", reason="x")
        with pytest.raises(StaleReceipt):
            st.q.run(_checked(call, p.receipt_context(Receipt(entry_id, attempt, worker))))
    assert dump(r, st) == before, "a refused requeue wrote something"
    receipt, outcome = st.q.run(actions.requeue(keys, entry_id))
    assert (receipt.attempt, receipt.worker_id, outcome) == (1, SILENT, "ready")
    call = p.build(keys, "requeue", entry_id=entry_id, attempt=1, worker_id=SILENT, mode="silent",
                   terminal="lost", reason="requeued by operator")
    assert p.s(st.q.run(_raw(call))[1]) == "replay"  # a retry after a lost reply
    with pytest.raises(StaleReceipt):
        st.workers[SILENT].complete(receipt, samples(2, 3))


def _raw(call: p.Call) -> Any:
    return (yield call)


def _checked(call: p.Call, context: dict[str, Any]) -> Any:
    reply = yield call
    return p.check(reply, ("ok",), context)


def test_requeue_silent_mode_refuses_a_heartbeating_worker(known_state: KnownState, r: redis.Redis) -> None:
    st = known_state
    st.refresh()
    before = dump(r, st)
    with pytest.raises(actions.OperatorRefused, match="still heartbeats"):
        st.q.run(actions.requeue(st.q.keys, st.ids[5]))
    assert dump(r, st) == before
    receipt, outcome = st.q.run(actions.requeue(st.q.keys, st.ids[5], force=True, counted=True, reason="hung"))
    assert outcome == "ready" and receipt.worker_id == ALIVE
    entry = st.q.run(views.entry(st.q.keys, st.ids[5]))
    assert entry.counted_failures == 1 and entry.history[-1].terminal == "failed" and entry.history[-1].reason == "hung"


def test_config_set_compares_every_field_before_writing(known_state: KnownState, r: redis.Redis) -> None:
    st, keys = known_state, known_state.q.keys
    flow = actions.set_config(keys, {"max_attempts": 4})
    op = next(flow)                                         # the flow read the stored config ...
    reply = st.q.driver.execute(op)
    st.q.run(actions.set_config(keys, {"lease_timeout_s": 5.0}))   # ... someone changes it meanwhile ...
    before = dump(r, st)
    op = flow.send(reply)
    with pytest.raises(actions.ConfigChanged, match="lease_timeout_ms"):
        flow.send(st.q.driver.execute(op))              # ... so the write is refused whole
    assert dump(r, st) == before
    old, new, changed = st.q.run(actions.set_config(keys, {"max_attempts": 4}))
    assert (old["max_attempts"], new.max_attempts, changed) == (2, 4, 1)
    assert RolloutQueue(st.q.client, st.queue).config == QueueConfig(
        worker_timeout_s=0.5, max_attempts=4, max_staleness=2, lease_timeout_s=5.0)
    with pytest.raises(ValueError, match="max_attempts"):
        st.q.run(actions.set_config(keys, {"max_attempts": -1}))
    triples = [x for k, v in QueueConfig().to_meta().items() for x in (k, v, v)]
    with pytest.raises(ConfigMismatch):
        st.q.run(_checked(p.build(keys, "config_set", library="0.old", fields=triples), {"queue": st.queue}))


def test_drain_start_extends_stop_is_idempotent_and_the_reaper_ends_it(known_state: KnownState) -> None:
    st, keys = known_state, known_state.q.keys
    first, executing = st.q.run(actions.drain_start(keys, 60, "upgrade"))
    second, _ = st.q.run(actions.drain_start(keys, 120, ""))
    assert executing == 2 and second > first
    status = st.q.run(views.drain_status(keys))
    assert status.active and status.reason == "upgrade" and status.deadline_ms == second
    assert st.q.run(actions.drain_stop(keys)) == 0 and st.q.run(actions.drain_stop(keys)) == 0
    assert not st.q.run(views.drain_status(keys)).active
    st.q.run(actions.drain_start(keys, 0.001, "short"))
    time.sleep(0.01)  # the hold is due once the server clock passes its deadline, not within the same ms
    st.q.reap()
    assert st.q.stats().active_holds == 0 and not st.q.run(views.drain_status(keys)).active


def test_dlq_purge_keeps_dead_equal_to_the_dlq_length(known_state: KnownState, r: redis.Redis) -> None:
    st, keys = known_state, known_state.q.keys
    assert st.q.run(actions.purge_dead_letters(keys, ["1-0"])) == 0
    assert st.q.run(actions.purge_dead_letters(keys, [st.dlq_id])) == 1
    assert st.q.run(actions.purge_dead_letters(keys, [st.dlq_id])) == 0   # a retry is harmless
    assert st.q.stats().dead == 0 == r.xlen(keys["dlq"])
    assert st.q.run(actions.purge_all_dead_letters(keys)) == 0
