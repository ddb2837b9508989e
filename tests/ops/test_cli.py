"""The ``rollout-queue`` CLI against a queue in a known state: what each command shows, what each
state-changing command does (and refuses), and the exit codes and log lines scripts rely on."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest
import redis

from rollout_queue import InvalidInput, Progress, QueueConfig, Receipt, ScriptError, StaleReceipt
from rollout_queue.cli import status
from rollout_queue.core.histograms import SECOND_BUCKETS, TOKEN_BUCKETS
from rollout_queue.devtools.local_server import pick_free_port
from tests.helpers import wait_until
from tests.ops.conftest import (ALIVE, PROGRESS, REAPED, SAMPLE_SECONDS, SAMPLE_TOKENS, SILENT, TRAINER, Cli,
                                KnownState, samples)


def docs(text: str) -> list[Any]:
    """Every JSON document in ``text`` (commands that print one per frame)."""
    out, i, dec = [], 0, json.JSONDecoder()
    while i < len(text):
        if text[i].isspace():
            i += 1
            continue
        value, i = dec.raw_decode(text, i)
        out.append(value)
    return out


def run(cli: Cli, st: KnownState, *args: str) -> tuple[int, str, str]:
    return cli(st.url, st.queue, *args)


# -- read-only views ---------------------------------------------------------------------------------


@pytest.mark.parametrize("resp", ["", "?protocol=2"], ids=["resp3", "resp2"])
def test_stats_json_counts_every_state(cli: Cli, shared_state: KnownState, resp: str) -> None:
    # host-a counts as alive for worker_timeout (0.5 s) after a heartbeat, and a CLI start on a loaded
    # machine takes longer than that: heartbeat all along the CLI's run, as a live worker does.
    stop = threading.Event()

    def heartbeat() -> None:
        while not stop.wait(0.1):
            shared_state.refresh()

    shared_state.refresh()
    beat = threading.Thread(target=heartbeat, daemon=True)
    beat.start()
    try:
        code, out, _ = cli(shared_state.url + resp, shared_state.queue, "stats", "--json")
    finally:
        stop.set()
        beat.join()
    assert code == 0
    s = json.loads(out)
    assert (s["backlog"], s["ready"], s["executing_groups"], s["completed"], s["leased"], s["committed"], s["dead"]) \
        == (2, 1, 2, 1, 1, 1, 1)
    assert s["executing_samples"] == 4 and s["retained"] == 5 and s["version"] == 3
    assert s["staleness_max"] == 1 and s["buffer_staleness"] == [[1, 1]]  # (staleness, groups)
    assert s["attempts"] == {"1": 5} and s["pel_states"] == {"executing": 2, "ready": 1, "completed": 1, "leased": 1}
    assert s["terminals"]["failed"] == 3
    assert {w["worker_id"]: w["alive"] for w in s["workers"]} == {ALIVE: True, SILENT: False}
    assert [(x["lease_id"], x["trainer"], x["groups"]) for x in s["leases"]] == [(shared_state.lease_id, TRAINER, 1)]
    assert s["drain"]["active"] is False


def test_stats_table_names_what_needs_attention(cli: Cli, shared_state: KnownState) -> None:
    code, out, _ = run(cli, shared_state, "stats")
    assert code == 0
    for text in ("groups by state", "attempts histogram", "buffer staleness", "max 1, mean 1.00", SILENT, "SILENT",
                 shared_state.lease_id, "evicted (stale)", "attempts ended failed"):
        assert text in out, text


@pytest.mark.parametrize("index, state, owner", [
    (0, "dead", None), (1, "committed", None), (2, "leased", "@lease:"), (3, "completed", "@done"),
    (4, "ready", "@ready"), (5, "executing", ALIVE), (6, "executing", SILENT), (7, "backlog", None),
])
def test_inspect_shows_state_owner_and_attempts(cli: Cli, shared_state: KnownState, index: int, state: str,
                                                owner: str | None) -> None:
    shared_state.refresh()
    entry_id = shared_state.ids[index]
    code, out, _ = run(cli, shared_state, "inspect", entry_id, "--json")
    assert code == 0
    e = json.loads(out)
    assert e["state"] == state and e["entry_id"] == entry_id
    assert (e["owner"] or "").startswith(owner) if owner else e["owner"] is None
    if index == 1:  # committed without a step: the pristine payload is gone, the ledger names the lease
        assert e["group"] is None and e["ledger"].startswith(f"s|committed|1|{ALIVE}|")
    else:
        assert e["source_id"] == f"prompt-{index}" and e["group"]["prompt"] == f"What is {index} + {index}?"
    if index == 0:
        assert e["dlq_id"] == shared_state.dlq_id and e["dead_reason"] == "max_attempts" and e["attempt"] == 2
    if index == 2:
        assert e["lease_id"] == shared_state.lease_id and e["lease_trainer"] == TRAINER and e["min_version"] == 3
    if index == 3:
        assert e["min_version"] == 2 and e["completion_bytes"] > 0
    if index == 4:
        assert [(a["attempt"], a["worker_id"], a["terminal"], a["reason"]) for a in e["history"]] == \
            [(1, ALIVE, "failed", "CUDA OOM")] and e["counted_failures"] == 1
    if index in (5, 6):
        assert e["worker_id"] == owner and e["worker_alive"] is (index == 5)
    code, out, _ = run(cli, shared_state, "inspect", entry_id)
    assert code == 0 and state in out


def test_inspect_unknown_entry_and_queue_exit_4(cli: Cli, shared_state: KnownState) -> None:
    code, _, err = run(cli, shared_state, "inspect", "1-0")
    assert code == 4 and "not in queue" in err
    code, _, err = cli(shared_state.url, "no-such-queue", "stats")
    assert code == 4 and "does not exist" in err
    code, _, err = run(cli, shared_state, "inspect", "not-an-id")
    assert code == 2 and "bad entry id" in err


def test_stragglers_are_the_oldest_executing_attempts_and_nothing_else(cli: Cli, shared_state: KnownState,
                                                                      r: object) -> None:
    """g5 and g6 execute (g6 on the silent host); ready, completed and leased PEL rows are not attempts."""
    st = shared_state
    code, out, _ = run(cli, st, "stragglers", "--json")
    found = json.loads(out)
    attempts = found["attempts"]
    assert code == 0 and not found["truncated"]
    assert {(a["entry_id"], a["worker_id"]) for a in attempts} == {(st.ids[5], ALIVE), (st.ids[6], SILENT)}
    assert [a["age_ms"] for a in attempts] == sorted((a["age_ms"] for a in attempts), reverse=True)
    # The ages are XPENDING's idle times of those entries (reset only when an attempt is reserved).
    pending = {row["message_id"].decode(): row for row in r.xpending_range(f"rollout:{{{st.queue}}}:src", "rollout",
                                                                         "-", "+", 100)}  # type: ignore[attr-defined]
    for a in attempts:
        assert a["age_ms"] <= pending[a["entry_id"]]["time_since_delivered"] + 5_000
        assert a["attempt"] == pending[a["entry_id"]]["times_delivered"]
    code, out, _ = run(cli, st, "stragglers", "--count", "1")
    assert code == 0 and out.count(attempts[0]["entry_id"]) == 1 and attempts[1]["entry_id"] not in out
    assert run(cli, st, "stragglers", "--count", "0")[0] == 2
    assert cli(st.url, st.queue + "-typo", "stragglers")[0] == 4


def test_at_risk_lists_the_entries_one_counted_failure_from_dead(cli: Cli, shared_state: KnownState) -> None:
    """max_attempts 2: g4 failed once ("CUDA OOM") and waits in ready: one more failure kills it. g0
    is already dead (its history is kept after settlement, but it is not at risk any more)."""
    st = shared_state
    code, out, _ = run(cli, st, "at-risk", "--json")
    found = json.loads(out)
    assert code == 0 and not found["truncated"]
    assert [(e["entry_id"], e["counted_failures"], e["left"]) for e in found["entries"]] == [(st.ids[4], 1, 1)]
    assert "CUDA OOM" in found["entries"][0]["last_reason"]
    code, out, _ = run(cli, st, "at-risk")
    assert code == 0 and st.ids[4] in out and st.ids[0] not in out
    assert run(cli, st, "at-risk", "--within", "0")[0] == 2


def test_workers_and_leases(cli: Cli, shared_state: KnownState) -> None:
    shared_state.refresh()
    code, out, _ = run(cli, shared_state, "workers", "--json")
    ws = {w["worker_id"]: w for w in json.loads(out)}
    assert code == 0 and ws[ALIVE]["alive"] and not ws[SILENT]["alive"] and ws[SILENT]["executing_groups"] == 1
    code, out, _ = run(cli, shared_state, "leases", "--json")
    (lease,) = json.loads(out)
    assert code == 0 and lease["lease_id"] == shared_state.lease_id and 0 < lease["remaining_ms"] <= 600_000
    code, out, _ = run(cli, shared_state, "workers")
    assert code == 0 and "SILENT" in out and "alive" in out


def test_workers_show_the_oldest_attempt_and_the_reported_speed(cli: Cli, shared_state: KnownState) -> None:
    """Not XINFO's idle (reset by any reserve): the age of each worker's oldest executing attempt, and
    groups/s and tokens/s from the progress its heartbeats carry."""
    shared_state.refresh()
    code, out, _ = run(cli, shared_state, "workers", "--json")
    ws = {w["worker_id"]: w for w in json.loads(out)}
    rows = shared_state.q.client.xpending_range(f"{shared_state.prefix}:src", "rollout", "-", "+", 20,
                                                consumername=ALIVE)
    assert code == 0 and [row["message_id"].decode() for row in rows] == [shared_state.ids[5]]
    # g5 was reserved before host-a's later heartbeats, reserves and settlements: its age is the oldest
    # attempt's, never reset by them (XINFO's idle is).
    assert ws[ALIVE]["oldest_attempt_ms"] >= ws[ALIVE]["idle_ms"] and ws[SILENT]["oldest_attempt_ms"] > 0
    assert ws[ALIVE]["progress"]["groups"] == PROGRESS.groups and ws[ALIVE]["progress"]["tokens"] == PROGRESS.tokens
    assert ws[SILENT]["progress"] is None
    code, out, _ = run(cli, shared_state, "workers")
    row = next(line for line in out.splitlines() if line.startswith(ALIVE))
    assert code == 0 and row.split()[-2:] == ["0.5", "250"]  # groups/s, tokens/s over 20 s of uptime


def test_reaped_lists_the_workers_the_queue_gave_up_on(cli: Cli, shared_state: KnownState) -> None:
    code, out, _ = run(cli, shared_state, "reaped", "--json")
    (line,) = json.loads(out)
    assert code == 0 and line["worker_id"] == REAPED and line["terminal"] == "lost" and line["done"]
    assert line["entry_ids"] == [] and line["requeued"] == 0 and line["heartbeat_ms"] > 0
    assert line["progress"]["groups"] == 4 and line["age_ms"] >= 0
    code, out, _ = run(cli, shared_state, "stats", "--json")
    assert json.loads(out)["counters"]["workers_reaped"] == 1
    code, out, _ = run(cli, shared_state, "reaped")
    assert code == 0 and REAPED in out and "worker silent past worker_timeout" in out
    assert run(cli, shared_state, "reaped", "--count", "0")[0] == 2


def test_a_reaped_worker_that_held_work_names_its_entries_and_its_counters_go(cli: Cli, known_state: KnownState,
                                                                              r: redis.Redis) -> None:
    st = known_state
    st.q.reap()  # host-b is silent: its attempt (g6) goes back to ready
    code, out, _ = run(cli, st, "reaped", "--json")
    newest = json.loads(out)[0]
    assert (newest["worker_id"], newest["entry_ids"], newest["requeued"]) == (SILENT, [st.ids[6]], 1)
    assert r.hget(f"{st.prefix}:progress", REAPED) is None and r.hexists(f"{st.prefix}:progress", ALIVE)
    st.workers[ALIVE].close()
    assert not r.hexists(f"{st.prefix}:progress", ALIVE)  # a clean close: deregistered, not reaped
    st.q.reap()  # deletes host-a's empty consumer: housekeeping, not a death
    assert [x["worker_id"] for x in json.loads(run(cli, st, "reaped", "--json")[1])] == [SILENT, REAPED]


def test_holds_name_the_holder_since_when_and_why(cli: Cli, known_state: KnownState) -> None:
    st = known_state
    assert json.loads(run(cli, st, "holds", "--json")[1]) == []
    hold = st.q.hold(timeout_s=60, holder=TRAINER, reason="weight update v4")
    code, out, _ = run(cli, st, "holds", "--json")
    (h,) = json.loads(out)
    assert code == 0 and (h["hold_id"], h["holder"], h["reason"]) == (hold.hold_id, TRAINER, "weight update v4")
    assert 0 < h["remaining_ms"] <= 60_000 and h["since_ms"] > 0
    code, out, _ = run(cli, st, "stats")
    assert f"HELD by 1 admission hold(s): {TRAINER} for" in out and "(weight update v4)" in out
    run(cli, st, "drain", "--reason", "node upgrade", "--yes")
    holders = {h["holder"]: h["reason"] for h in json.loads(run(cli, st, "holds", "--json")[1])}
    assert holders == {TRAINER: "weight update v4", "operator": "node upgrade"}
    hold.release()
    run(cli, st, "drain", "stop", "--yes")
    assert json.loads(run(cli, st, "holds", "--json")[1]) == []
    assert st.q.client.hlen(f"{st.prefix}:holders") == 0
    with pytest.raises(InvalidInput):
        st.q.hold(holder="a|b")


def test_stats_and_top_say_when_a_queue_has_no_admission_control(cli: Cli, known_state: KnownState) -> None:
    """Issue 30: a queue without admission control lets generation run ahead of training without
    bound; stats and top say so, until a trainer derives it (or the operator sets it)."""
    from rollout_queue.cli import status, top
    from rollout_queue.ops import views

    st = known_state  # CONFIG leaves batch_groups to the trainer: none yet

    def frame() -> str:
        snap = st.q.run(views.snapshot(st.q.layout.keys[0]))
        return "\n".join(top.top_lines(snap, status.rates(None, (0.0, {})), [], st.queue, 80, 24))

    code, out, _ = run(cli, st, "stats")
    assert code == 0 and "no admission control" in out
    assert "no admission control" in frame()
    assert json.loads(run(cli, st, "stats", "--json")[1])["counters"]["batch_groups"] == -1
    assert st.q.derive_admission(4) == 4
    code, out, _ = run(cli, st, "stats")
    assert "no admission control" not in out and "batch_groups 4: at most (version + max_staleness + 1) x 4" in out
    assert "admission control" not in frame()


def test_stats_and_top_show_where_the_generated_tokens_went(cli: Cli, known_state: KnownState) -> None:
    """Issue 30: generated, trained and discarded tokens (by reason), and generated per trained, in the
    concise stats frame and top (one line), stats --full (one row each) and stats --json (counters)."""
    from rollout_queue.cli import status, top
    from rollout_queue.ops import views

    st = known_state  # three groups completed (2 samples x 3 tokens each): committed, leased, buffered
    w = st.q.stats().waste
    assert (w.generated, w.trained, w.discarded_total) == (18, 6, 0), w
    rolled = st.lease.rollback()  # type: ignore[attr-defined]  # the open lease's group: 6 tokens thrown away
    assert rolled == 1
    snap = st.q.run(views.snapshot(st.q.layout.keys[0]))
    frame = top.top_lines(snap, status.rates(None, (0.0, {})), [], st.queue, 80, 24)
    assert "tokens  gen 18 · trained 6 (3.00 gen/trained) · discarded 6" in frame
    code, out, _ = run(cli, st, "stats", "--full")
    assert code == 0 and "discarded tokens (rolled_back)" in out and "3.000 (1.000 wastes nothing)" in out, out
    counters = json.loads(run(cli, st, "stats", "--json")[1])["counters"]
    assert (counters["tokens_generated"], counters["tokens_trained"], counters["tokens_rolled_back"]) == (18, 6, 6)


def _commit_history(r: redis.Redis, st: KnownState, gap_ms: int, count: int, last_ago_ms: int) -> None:
    """The commits a run leaves: ``count`` commit lines ``gap_ms`` apart, the last ``last_ago_ms`` ago
    (what commit.lua writes: a line per commit, and meta's last_commit_ms)."""
    from rollout_queue.core.keys import QueueKeys

    keys = QueueKeys(st.queue)
    sec, usec = r.time()
    last = int(sec) * 1000 + int(usec) // 1000 - last_ago_ms
    r.delete(keys["commits"])
    for i in range(count - 1, -1, -1):
        r.xadd(keys["commits"], {"lease": f"l{i}", "trainer": "t", "entries": "", "step": str(count - i)},
               id=f"{last - i * gap_ms}-0")
    r.hset(keys["meta"], "last_commit_ms", last)


def test_top_judges_a_stall_by_the_runs_own_step_times(known_state: KnownState, r: redis.Redis) -> None:
    """Issue 32 item 7: a run committing every 5 s that stops is stalled a minute later (10 steps, the
    floor 60 s), not after a fixed 10 minutes; a run of 2-minute steps is not stalled 3 minutes in."""
    from rollout_queue.cli import status, top
    from rollout_queue.ops import views

    st = known_state
    assert st.q.stats().completed > 0, "groups wait for the trainer"

    def frame() -> tuple[Any, str]:
        snap = st.q.run(views.snapshot(st.q.layout.keys[0]))
        return snap, "\n".join(top.top_lines(snap, status.rates(None, (0.0, {})), [], st.queue, 80, 24))

    _commit_history(r, st, gap_ms=5_000, count=13, last_ago_ms=180_000)
    snap, text = frame()
    assert snap.step_ms == 5_000 and snap.stall_after_ms == 60_000
    assert "! trainer stalled? last commit 3m00s ago (steps take 5.0s)" in text, text
    _commit_history(r, st, gap_ms=120_000, count=6, last_ago_ms=180_000)
    snap, text = frame()
    assert snap.step_ms == 120_000 and snap.stall_after_ms == 1_200_000
    assert "stalled" not in text, text
    # Until the run has three steps to judge by, the old 10 minutes stand.
    _commit_history(r, st, gap_ms=5_000, count=2, last_ago_ms=180_000)
    snap, text = frame()
    assert snap.step_ms is None and snap.stall_after_ms == 600_000 and "stalled" not in text


def test_leases_rollback_needs_yes_and_an_active_lease(cli: Cli, known_state: KnownState) -> None:
    st = known_state
    lease_id = st.lease_id
    assert run(cli, st, "leases", "rollback", lease_id)[0] == 2, "--yes confirms it"
    assert run(cli, st, "leases", "rollback", "--yes")[0] == 2, "which lease?"
    code, _, err = run(cli, st, "leases", "rollback", "no-such-lease", "--yes")
    assert code == 4 and "not found" in err
    code, out, err = cli(st.url, st.queue, "--json-logs", "leases", "rollback", lease_id, "--yes",
                         "--reason", "trainer host lost")
    assert code == 0 and re.fullmatch(rf"{lease_id}\trolled_back\t\d+\n", out), (out, err)
    assert '"action":"lease_rollback"' in err and "trainer host lost" in err
    code, out, _ = run(cli, st, "leases", "--json")
    assert lease_id not in out, "no longer an active lease"
    code, out, err = run(cli, st, "leases", "rollback", lease_id, "--yes")
    assert code == 0 and out == f"{lease_id}\treplay\t0\n", err


def test_an_expired_hold_takes_its_holder_line_with_it(known_state: KnownState, r: redis.Redis) -> None:
    st = known_state
    st.q.hold(timeout_s=0.05, holder=TRAINER)
    wait_until(lambda: st.q.stats().active_holds == 0, timeout=5, message="the hold to expire")
    st.q.reap()  # the reaper releases expired holds by id
    assert r.hlen(f"{st.prefix}:holders") == 0


def test_stats_show_the_longest_wait_of_each_state(cli: Cli, shared_state: KnownState) -> None:
    code, out, _ = run(cli, shared_state, "stats", "--json")
    oldest = json.loads(out)["oldest_ms"]
    assert code == 0 and all(oldest[s] is not None and oldest[s] >= 0 for s in
                             ("backlog", "ready", "executing", "completed", "leased"))
    # The backlog's oldest entry (g7) was submitted before anything was handed out: the longest wait.
    assert oldest["backlog"] >= oldest["ready"]


def test_stats_show_how_long_samples_are_and_take(cli: Cli, shared_state: KnownState) -> None:
    """The sample histograms host-a's heartbeat carries, summed over the registered workers (host-b
    reported none; reaped host-z's line had none and is gone): quantiles as bucket upper edges."""
    shared_state.refresh()
    code, out, _ = run(cli, shared_state, "stats", "--json")
    samples = json.loads(out)["samples"]
    assert code == 0
    assert samples["tokens"] == {"count": 20, "workers": 1, "p50": 256, "p90": 1024, "p99": 4096, "max": 4096,
                                 "edges": list(TOKEN_BUCKETS), "counts": list(SAMPLE_TOKENS)}
    assert samples["seconds"] == {"count": 20, "workers": 1, "p50": 5, "p90": 20, "p99": "+Inf", "max": "+Inf",
                                  "edges": list(SECOND_BUCKETS), "counts": list(SAMPLE_SECONDS)}
    ws = {w["worker_id"]: w for w in json.loads(out)["workers"]}
    assert ws[ALIVE]["progress"]["sample_tokens"] == list(SAMPLE_TOKENS)
    assert ws[ALIVE]["progress"]["sample_seconds"] == list(SAMPLE_SECONDS)
    code, out, _ = run(cli, shared_state, "stats")
    table = out[out.index("== samples"):]
    rows = {line.split()[0]: line.split()[1:] for line in table.splitlines()[2:4]}
    assert code == 0 and "reported by 1 worker(s)" in table.splitlines()[0]
    assert rows == {"tokens": ["20", "256", "1024", "4096", "4096"], "seconds": ["20", "5.0s", "20.0s", ">10m00s",
                                                                                   ">10m00s"]}
    code, out, _ = run(cli, shared_state, "top", "--once")
    assert code == 0 and "samples 20 · tokens p50/90/99 256/1024/4096 · seconds 5.0s/20.0s/>10m00s" in out
    frame = docs(run(cli, shared_state, "top", "--once", "--json")[1])[0]
    assert frame["samples"]["tokens"]["p90"] == 1024


def test_a_worker_that_closes_takes_its_samples_out_of_the_sum(cli: Cli, known_state: KnownState) -> None:
    st = known_state
    st.q.worker("host-c:gpu2").heartbeat(Progress(1, 10, 1000, (1,) + (0,) * 12, (0,) * 12 + (3,)))
    samples = json.loads(run(cli, st, "stats", "--json")[1])["samples"]
    assert (samples["tokens"]["count"], samples["tokens"]["workers"], samples["tokens"]["counts"][0]) == (21, 2, 1)
    assert samples["seconds"]["count"] == 23 and samples["seconds"]["p50"] == 10 and samples["seconds"]["p90"] == "+Inf"
    st.q.worker("host-c:gpu2").close()
    st.workers[ALIVE].close()
    samples = json.loads(run(cli, st, "stats", "--json")[1])["samples"]
    assert samples["tokens"] == {"count": 0, "workers": 0, "p50": None, "p90": None, "p99": None, "max": None,
                                 "edges": list(TOKEN_BUCKETS), "counts": [0] * 13}
    code, out, _ = run(cli, st, "stats")
    assert code == 0 and "reported by 0 worker(s)" in out
    assert "samples " not in run(cli, st, "top", "--once")[1]  # no line before any sample


def test_top_prints_frames_with_rates(cli: Cli, shared_state: KnownState) -> None:
    code, out, _ = run(cli, shared_state, "top", "--iterations", "2", "--interval", "0.01")
    assert code == 0 and out.count("(Ctrl-C quits)") == 2 and out.count("rates   in ") == 2
    code, out, _ = run(cli, shared_state, "top", "--once", "--json")
    (frame,) = docs(out)
    assert code == 0 and frame["rates"]["in/s (submitted)"] is None and frame["backlog"] == 2
    assert status.rates((0.0, {"submitted": 10, "committed": 1}), (2.0, {"submitted": 30, "committed": 5})) == \
        {"in/s (submitted)": 10.0, "completed/s": 0.0, "out/s (committed)": 2.0}


def test_config_show(cli: Cli, shared_state: KnownState) -> None:
    code, out, _ = run(cli, shared_state, "config", "show", "--json")
    cfg = json.loads(out)
    assert code == 0 and cfg["max_attempts"] == 2 and cfg["worker_timeout_s"] == 0.5 and cfg["max_staleness"] == 2


# -- state changes ---------------------------------------------------------------------------------


def test_requeue_refuses_a_live_worker_then_force_fences_its_receipt(cli: Cli, known_state: KnownState,
                                                                     r: redis.Redis) -> None:
    st = known_state
    st.refresh()
    before = {k: r.dump(k) for k in r.scan_iter(f"{st.prefix}:*") if not k.endswith(b":clock")}
    code, out, err = run(cli, st, "requeue", st.ids[5], "--yes")
    assert code == 5 and "still heartbeats" in err and out == ""
    assert {k: r.dump(k) for k in r.scan_iter(f"{st.prefix}:*") if not k.endswith(b":clock")} == before, "a refusal wrote something"
    code, out, err = run(cli, st, "requeue", st.ids[5], "--yes", "--force", "--reason", "engine hung")
    assert code == 0 and out == f"{st.ids[5]}\tready\n"
    # The worker wakes up and hands in its result: the exact receipt no longer holds.
    with pytest.raises(StaleReceipt):
        st.workers[ALIVE].complete(Receipt(st.ids[5], 1, ALIVE), samples(2, 3))
    code, out, _ = run(cli, st, "inspect", st.ids[5], "--json")
    e = json.loads(out)
    assert e["state"] == "ready" and e["history"][-1]["terminal"] == "aborted" and e["counted_failures"] == 0


def test_requeue_of_a_silent_workers_attempt_is_lost_and_counted(cli: Cli, known_state: KnownState) -> None:
    st = known_state
    code, out, err = cli(st.url, st.queue, "--json-logs", "requeue", st.ids[6], "--yes")
    assert code == 0 and out == f"{st.ids[6]}\tready\n"
    (line,) = [json.loads(x) for x in err.splitlines() if x.startswith("{")]
    assert line["action"] == "requeue" and line["queue"] == st.queue and line["entry_id"] == st.ids[6]
    assert line["attempt"] == 1 and line["worker_id"] == SILENT and line["outcome"] == "ready"
    e = json.loads(run(cli, st, "inspect", st.ids[6], "--json")[1])
    assert e["history"][-1]["terminal"] == "lost" and e["counted_failures"] == 1
    code, out, _ = run(cli, st, "requeue", st.ids[6], "--yes")  # already back in ready
    assert code == 0 and out.endswith("\talready_ready\n")


@pytest.mark.parametrize("index, code, text", [(3, 5, "completed"), (2, 5, "leased"), (1, 5, "committed"),
                                               (0, 5, "dead"), (7, 5, "backlog")])
def test_requeue_refuses_entries_that_are_not_executing(cli: Cli, shared_state: KnownState, index: int, code: int,
                                                        text: str) -> None:
    got, out, err = run(cli, shared_state, "requeue", shared_state.ids[index], "--yes")
    assert (got, out) == (code, "") and text in err


def test_destructive_commands_need_yes(cli: Cli, shared_state: KnownState) -> None:
    for args in (["requeue", shared_state.ids[6]], ["dlq", "requeue", shared_state.dlq_id], ["dlq", "purge", "--all"],
                 ["drain"], ["drain", "stop"], ["config", "set", "max_attempts=3"]):
        code, out, err = run(cli, shared_state, *args)
        assert code == 2 and "--yes" in err and out == "", args
    assert json.loads(run(cli, shared_state, "stats", "--json")[1])["dead"] == 1


def test_config_set_validates_and_stores_atomically(cli: Cli, known_state: KnownState) -> None:
    st = known_state
    code, out, err = run(cli, st, "config", "set", "max_attempts=5", "lease_timeout_s=30", "max_staleness=none", "--yes")
    assert code == 0 and "max_attempts\t2\t5" in out and "config changed" in err
    cfg = json.loads(run(cli, st, "config", "show", "--json")[1])
    assert (cfg["max_attempts"], cfg["lease_timeout_s"], cfg["max_staleness"]) == (5, 30.0, None)
    for bad, why in (("max_attempts=0", "positive integer"), ("buffer_order=random", "fifo"),
                     ("nope=1", "unknown config field"), ("max_attempts=x", "not a number"), ("max_attempts", "name=value")):
        code, _, err = run(cli, st, "config", "set", bad, "--yes")
        assert code == 2 and why in err, bad
    assert json.loads(run(cli, st, "config", "show", "--json")[1])["max_attempts"] == 5


@pytest.mark.parametrize("field", ["max_staleness", "batch_groups"])
def test_a_bool_bound_is_refused_and_config_set_none_repairs_a_stored_one(cli: Cli, known_state: KnownState,
                                                                         r: redis.Redis, field: str) -> None:
    """Issue 12 item 11: QueueConfig(max_staleness=True) was stored as "True" and bricked the queue (every
    script failed "corrupt config", and `config set max_staleness=none` failed too)."""
    st = known_state
    with pytest.raises(InvalidInput, match=field):
        QueueConfig(**{field: True})
    r.hset(f"{st.prefix}:meta", field, "True")  # what an older build stored, or a hand edit
    with pytest.raises(ScriptError, match="corrupt config"):
        st.workers[ALIVE].reserve(1)
    code, out, _ = run(cli, st, "config", "show")
    assert code == 0 and "CORRUPT" in out and "'True'" in out
    code, _, err = run(cli, st, "config", "set", "max_attempts=4", "--yes")  # the corrupt field is named
    assert code == 2 and field in err and "config set" in err
    code, out, err = run(cli, st, "config", "set", f"{field}=none", "--yes")
    assert code == 0 and out.startswith(f"{field}\t'True'\tnone"), (out, err)
    cfg = json.loads(run(cli, st, "config", "show", "--json")[1])
    assert cfg[field] is None and "corrupt" not in cfg
    st.workers[ALIVE].heartbeat()
    assert st.workers[ALIVE].reserve(1)  # the queue works again


def test_config_set_none_for_every_optional_field_and_a_clear_error_otherwise(cli: Cli, known_state: KnownState
                                                                              ) -> None:
    st = known_state
    code, out, err = run(cli, st, "config", "set", "max_staleness=none", "batch_groups=none",
                         "settled_retention_s=none", "--yes")
    assert code == 0, err
    cfg = json.loads(run(cli, st, "config", "show", "--json")[1])
    assert (cfg["max_staleness"], cfg["batch_groups"], cfg["settled_retention_s"]) == (None, None, None)
    for name in ("max_attempts", "lease_timeout_s", "buffer_order"):
        code, _, err = run(cli, st, "config", "set", f"{name}=none", "--yes")
        assert code == 2 and "cannot be none" in err and "not optional" in err, err
    for bad in ("lease_timeout_s=inf", "lease_timeout_s=nan", "max_attempts=1e400", "hold_timeout_s=1e300",
                "max_staleness=true", "max_attempts=9007199254740993"):
        code, _, err = run(cli, st, "config", "set", bad, "--yes")
        assert code == 2 and "Traceback" not in err, (bad, err)


def test_drain_closes_admission_until_stopped(cli: Cli, known_state: KnownState) -> None:
    st = known_state
    code, out, _ = run(cli, st, "drain", "--yes", "--timeout-s", "60", "--reason", "redis upgrade")
    assert code == 0 and out.startswith("draining\texecuting=2")
    assert st.workers[ALIVE].heartbeat().held
    assert st.workers[ALIVE].reserve(1) == []  # granted nothing (it reaped silent host-b on the way)
    code, out, _ = run(cli, st, "drain", "status")
    assert code == 0 and out.startswith("draining\texecuting=1\tleft=") and out.endswith("\treason=redis upgrade\n")
    code, _, err = run(cli, st, "drain", "--yes", "--wait", "0.05")
    assert code == 1 and "still executing" in err
    run(cli, st, "requeue", st.ids[5], "--yes", "--force")
    code, out, _ = run(cli, st, "drain", "--yes", "--wait", "2")
    assert code == 0 and "executing=0" in out
    text = run(cli, st, "stats")[1]
    assert "DRAINING (redis upgrade)" in text, text
    code, out, _ = run(cli, st, "drain", "stop", "--yes")
    assert code == 0 and out == "stopped\tother_holds=0\tadmission=open\n"
    assert not st.workers[ALIVE].heartbeat().held and st.workers[ALIVE].reserve(1)
    # With a trainer's hold standing, stopping the drain says that admission stays closed, and why.
    hold = st.q.hold(timeout_s=60)
    try:
        run(cli, st, "drain", "--yes")
        code, out, err = run(cli, st, "drain", "stop", "--yes")
        assert code == 0 and out == "stopped\tother_holds=1\tadmission=closed\n" and "stays closed" in err
    finally:
        hold.release()


def test_dlq_list_show_requeue_purge(cli: Cli, known_state: KnownState) -> None:
    st = known_state
    code, out, _ = run(cli, st, "dlq", "list")  # piped: tab-separated, no header, for `cut -f1`
    fields = out.rstrip("\n").split("\t")
    assert code == 0 and fields[:4] == [st.dlq_id, st.ids[0], "prompt-0", "attempt=2"]
    assert re.fullmatch(r"died=\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", fields[4]) and fields[5] == "max_attempts"
    assert fields[6] == "last=failed: prompt too long for the engine"
    code, out, _ = run(cli, st, "dlq", "show", st.dlq_id, "--json")
    d = json.loads(out)
    assert code == 0 and d["reason"] == "max_attempts" and d["fields"] is None
    assert [h["r"] for h in d["history"]] == ["prompt too long for the engine"] * 2
    assert d["died_ms"] == int(st.dlq_id.split("-")[0])
    code, out, _ = run(cli, st, "dlq", "show", st.dlq_id)  # for people: a table, times as dates and ages
    assert code == 0 and f"== dead letter {st.dlq_id}" in out and "ago)" in out
    assert out.count("prompt too long for the engine") == 2 and f"dlq requeue {st.dlq_id} --yes" in out
    assert run(cli, st, "dlq", "show", "1-0")[0] == 4
    code, out, err = run(cli, st, "dlq", "requeue", "--all", "--yes")
    dlq_id, new_id = out.strip().split("\t")
    assert code == 0 and dlq_id == st.dlq_id and "requeued dead letter" in err
    assert json.loads(run(cli, st, "inspect", new_id, "--json")[1])["state"] == "backlog"
    # The old entry says it died, how, and where its group lives on; its attempts are still there.
    old = json.loads(run(cli, st, "inspect", st.ids[0], "--json")[1])
    assert (old["state"], old["requeued_as"], old["counted_failures"]) == ("dead", new_id, 2)
    assert old["ledger"] == f"s|dead|2|{ALIVE}|max_attempts"  # as its death wrote it: a retry still replays
    assert any(line.startswith("requeued as") and new_id in line
               for line in run(cli, st, "inspect", st.ids[0])[1].splitlines())
    # g4 failed once already: one more counted failure makes a new dead letter. Then purge them all.
    st.refresh()
    (res,) = [x for x in st.workers[ALIVE].reserve(10) if x.group.source_id == "prompt-4"]
    assert st.workers[ALIVE].fail(res.receipt, "still broken") == "dead"
    st.q.settle_parked()  # parked by the worker's fail: the reaper's next pass writes its dead letter
    code, out, err = run(cli, st, "dlq", "purge", "--all", "--yes")
    assert code == 0 and out == "purged\t1\n"
    code, out, err = run(cli, st, "dlq", "list")  # empty: stdout stays empty (pipes), stderr says so
    assert (code, out) == (0, "") and f"no dead letters in queue {st.queue}" in err
    s = json.loads(run(cli, st, "stats", "--json")[1])
    assert s["dead"] == 0 and s["counters"]["dead_purged"] == 1
    code, out, err = run(cli, st, "dlq", "purge", "1-0", "--yes")
    assert (code, out) == (4, "purged\t0\n") and "1 of 1 dead letters named do not exist" in err


# -- exit codes ---------------------------------------------------------------------------------------


def test_exit_codes_for_scripts(cli: Cli, shared_state: KnownState, r: redis.Redis) -> None:
    assert cli(None, shared_state.queue, "stats")[0] == 2
    assert cli(shared_state.url, None, "stats")[0] == 2
    assert cli(shared_state.url, "a{b}", "stats")[0] == 2  # braces would break the hash tag
    code, _, err = cli(f"redis://127.0.0.1:{pick_free_port()}/0", "q", "stats")
    assert code == 3 and "cannot reach Redis" in err
    user = f"rq-test-{shared_state.queue}"
    r.execute_command("ACL", "SETUSER", user, "on", ">right", "~*", "+@all")
    try:
        host, port = shared_state.url.split("//")[1].split("/")[0].split(":")
        code, _, err = cli(f"redis://{user}:wrong@{host}:{port}/0", shared_state.queue, "stats")
        assert code == 6 and "credentials" in err
    finally:
        r.execute_command("ACL", "DELUSER", user)


def test_python_m_and_console_script(shared_state: KnownState) -> None:
    env_args = ["--url", shared_state.url, "--queue", shared_state.queue]
    done = subprocess.run([sys.executable, "-m", "rollout_queue", *env_args, "inspect", shared_state.ids[7], "--json"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and json.loads(done.stdout)["state"] == "backlog"
    script = Path(sys.executable).with_name("rollout-queue")  # the console script, where installed
    command = [str(script)] if script.exists() else [sys.executable, "-m", "rollout_queue"]
    done = subprocess.run([*command, *env_args, "requeue", shared_state.ids[3]], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 2 and done.stderr == "rollout-queue: requeue " + shared_state.ids[3] + \
        " ends its executing attempt: confirm with --yes\n"
