"""DESIGN's invariants, checked from Redis truth and compared with the model after every step.

1. every submitted source group is in exactly one state, derived index by index from Redis (a group
   pruned after settled_retention_s is in its settled state with no trace left but its commits line);
2. nothing is committed twice: each entry is named by (commit lines - restores) in {0, 1} lines of
   the commits stream, 1 exactly when it is committed;
3. stats() equals a recount from Redis truth (and the model's count);
4. nothing is lost: submitted == backlog + retained + committed + filtered + dead, counting unique
   source_ids (a requeued dead letter is the same source under a new entry ID) plus the pruned groups
   (whose mapping is gone; their source_id may since have been submitted as a new entry);
5. (checked on every lease, in the machine) no lease holds a group staler than max_staleness;
6. progress records (partial rollouts): one only for a ready or executing entry (never after
   settlement, nor for a buffered or leased group), each exactly the model's (head and decoded
   samples), its head's attempt never decreasing, partial_bytes the sum of the records' lengths.

This module only reads: a Truth (redis_truth.py), a QueueStats and the model. It must never weaken
a check to fit the code: a failure here is a bug in the queue or in the model, to be found.
"""

from __future__ import annotations

from rollout_queue import QueueStats
from rollout_queue.core.codec import decode_partial

from .ledger_model import LedgerModel
from .model_entries import COMMITTED, EXECUTING, FILTERED, LEASED, READY, RETAINED, RETIRED, STATES
from .redis_truth import VERSION_SHIFT, Truth, check_no_ghosts, derive_state, states_of


def check_states(t: Truth, m: LedgerModel) -> dict[str, str]:
    """Invariant 1, and the details the model is exact about: ledger line, attempt, owner, buffer."""
    check_no_ghosts(t)
    assert t.ids == m.by_source, "the source_id -> entry_id map differs from the model"
    assert t.settled == m.recorded(), "the settled records (waiting for prune) differ from the model"
    states = {eid: derive_state(t, eid) for eid in t.ids.values()}
    assert set(t.history) <= set(m.entries), "an attempt history names an entry the model never had"
    # Errored rollbacks' marks (issue 29 item 12): one per errored lease, gone at death or prune.
    assert t.suspects == {eid: float(e.marks) for eid, e in m.entries.items() if e.marks}, (
        f"suspects {t.suspects} != model {({eid: e.marks for eid, e in m.entries.items() if e.marks})}")
    for eid, e in m.entries.items():
        assert t.ledger.get(eid) == e.ledger, f"ledger of {eid}: {t.ledger.get(eid)!r} != model {e.ledger!r}"
        # The attempt history is kept until prune (issue 12 item 7): a late settlement is judged by it.
        h = t.history.get(eid)
        got = [] if h is None else [(x["a"], x["w"], x["t"], x.get("c")) for x in h["h"]]
        assert got == [tuple(x) for x in e.history], f"history of {eid}: {got} != model {e.history}"
        assert (0 if h is None else h["f"]) == e.failures, f"{eid}: counted failures {h and h['f']} != {e.failures}"
        assert (0 if h is None else h.get("s", 0)) == e.stale_evictions, (
            f"{eid}: stale evictions {h and h.get('s')} != model {e.stale_evictions}")
        if e.state == RETIRED or e.pruned:  # requeued under a new ID, or forgotten: gone from every index
            assert eid not in states and not states_of(t, eid), f"retired or pruned {eid}: {states_of(t, eid)}"
            assert eid not in t.pel and eid not in t.stream, f"retired or pruned {eid} is still in the stream"
            assert not e.pruned or e.state in (COMMITTED, FILTERED, RETIRED), f"pruned {eid} was {e.state}"
            continue
        assert states[eid] == e.state, f"{eid} is {states[eid]} in Redis, {e.state} in the model"
        if e.state in RETAINED:
            owner, count = t.pel[eid]
            assert count == e.attempt, f"{eid}: delivery count {count}, model attempt {e.attempt}"
            assert e.worker is None or owner == e.worker, f"{eid} is owned by {owner}, not {e.worker}"
            assert e.state != LEASED or owner == f"@lease:{e.lease_id}", f"{eid} owner {owner}"
        if eid in t.bufver:
            assert int(t.bufver[eid] // VERSION_SHIFT) == e.min_version, f"{eid}: buffered min_version"
            assert t.bufver[eid] == e.min_version * VERSION_SHIFT + e.arrival % VERSION_SHIFT, f"{eid}: bufver"
            assert t.buffer[eid] == e.arrival, f"{eid}: buffer order"
    return states


def check_commits(t: Truth, m: LedgerModel, states: dict[str, str]) -> None:
    """Invariant 2: no entry trained twice, counting restores (a restored group is trained again)."""
    counts = t.commit_counts
    for line in t.commits:
        ids = [i for i in line["ids"].split(",") if i]
        assert len(ids) == len(set(ids)), f"commit line {line} names an entry twice"
    for eid, e in m.entries.items():
        assert counts[eid] == e.commits, f"{eid}: {counts[eid]} commit lines, model {e.commits}"
        state = states.get(eid, e.state)
        net = counts[eid] - e.restores
        assert net == (1 if state == COMMITTED else 0), (
            f"{eid}: {counts[eid]} commit lines - {e.restores} restores, but it is {state}")
    assert int(t.meta.get("restored", 0)) == m.counters["restored"]


def check_stats(t: Truth, s: QueueStats, m: LedgerModel, states: dict[str, str]) -> None:
    """Invariants 3 and 4: stats() == a recount from Redis == the model; nothing lost."""
    recount = {state: sum(1 for x in states.values() if x == state) for state in STATES}
    # Pruned groups left no trace to recount (by design): the model says how many each state has.
    pruned = [e for e in m.entries.values() if e.pruned]
    for state in (COMMITTED, FILTERED):
        recount[state] += sum(1 for e in pruned if e.state == state)
    current_pruned = sum(1 for e in pruned if e.state != RETIRED)
    executing = [eid for eid, (owner, _) in t.pel.items() if not owner.startswith("@")]
    got = {"ready": s.ready, "completed": s.completed, "leased": s.leased, "executing_groups": s.executing_groups,
           "executing_samples": s.executing_samples, "retained": s.retained, "committed": s.committed,
           "filtered": s.filtered, "dead": s.dead, "backlog": s.backlog, "kept": s.kept, "submitted": s.submitted,
           "ledger_lines": s.ledger_lines, "source_ids": s.source_ids}
    truth = {"ready": len(t.ready), "completed": len(t.buffer),
             "leased": sum(1 for owner, _ in t.pel.values() if owner.startswith("@lease:")),
             "executing_groups": len(executing), "executing_samples": sum(t.n_of(i) for i in executing),
             "retained": len(t.pel), "committed": recount[COMMITTED], "filtered": recount["filtered"],
             "dead": len(t.dlq), "backlog": t.xlen - len(t.pel) - len(t.kept), "kept": len(t.kept),
             # every XADD: the current entry of each source, the IDs of requeued dead letters, the pruned
             "submitted": len(t.ids) + len(set(t.ledger) - set(t.ids.values())) + len(pruned),
             "ledger_lines": len(t.ledger), "source_ids": len(t.ids)}
    assert got == truth, f"stats {got} != recount from Redis {truth}"
    model = {**{k: m.count(k) for k in ("ready", "completed", "leased", "committed", "filtered", "dead", "backlog")},
             "executing_groups": m.count("executing"), "executing_samples": m.executing_samples(),
             "retained": m.retained(), "kept": len(m.kept()), "submitted": len(m.entries),
             "ledger_lines": sum(1 for e in m.entries.values() if e.ledger is not None),
             "source_ids": len(m.by_source)}
    assert got == model, f"stats {got} != model {model}"
    assert t.xlen == len(t.stream), "XLEN disagrees with XRANGE"
    assert truth["backlog"] == recount["backlog"], "XLEN - retained - kept is not the never-delivered count"
    assert {k: int(v) for k, v in t.kept.items()} == m.kept(), "kept copies (by commit step) differ"
    assert len(t.ids) + current_pruned == (truth["backlog"] + truth["retained"] + truth["committed"]
                                           + truth["filtered"] + truth["dead"]), f"an entry was lost: {truth}"
    check_counters(t, s, m)
    check_bounds(truth, m)


def check_counters(t: Truth, s: QueueStats, m: LedgerModel) -> None:
    """Counters by reason, versions, holds, workers and leases, as the model has them."""
    assert dict(s.terminals) == {k: m.counters[k] for k in s.terminals}
    assert dict(s.evictions) == {k: m.counters[f"evicted_{k}"] for k in s.evictions}
    prefix = "filtered_reason:"
    assert dict(s.filtered_by_reason) == {k[len(prefix):]: v for k, v in m.counters.items() if k.startswith(prefix)}
    assert (s.version, s.version_published) == (m.version, m.published)
    assert set(t.holds) == set(m.holds), "admission holds differ"
    assert set(t.workers) == m.workers, "registered workers differ"
    assert set(t.leases) == {x.lease_id for x in m.active_leases()}, "active leases differ"
    assert (s.workers_alive, s.workers_silent, s.active_leases, s.active_holds) == (
        len(m.workers), 0, len(m.active_leases()), len(m.holds))
    lags = [m.version - e.min_version for e in m.buffer()] if m.published else []
    assert s.staleness_max == (max(lags) if lags else None), "the buffer's staleness is misreported"
    # Token accounting: every adopted completion's tokens are trained, discarded for a reason, or still
    # held (a token record beside a buffered or leased group's payload): none counted twice or lost.
    w = s.waste
    held = sum(n for records in t.tokens.values() for n in records.values())
    assert w.generated == w.trained + sum(w.discarded.values()) + held, (w, held)


def check_bounds(truth: dict[str, int], m: LedgerModel) -> None:
    """DESIGN's capacity bounds, judged from the recount. A restore puts committed groups back in
    the PEL without a first delivery, so it may leave more than max_retained_groups retained (reserve
    then delivers nothing new until enough settle): that bound is checked until the first restore."""
    cfg = m.cfg
    if not m.counters["restored"]:
        assert truth["retained"] <= cfg.max_retained_groups, f"retained over its bound: {truth}"
    assert truth["executing_samples"] <= cfg.max_executing_samples, f"executing over its bound: {truth}"
    assert truth["completed"] <= cfg.max_completed_groups, f"buffer over its bound: {truth}"
    if cfg.batch_groups:
        limit = (m.version + m.staleness_bound + 1) * cfg.batch_groups
        assert truth["retained"] + truth["committed"] <= limit, f"admission past {limit}: {truth}"


PARTIAL_COUNTERS = ("partial_bytes", "partial_saved", "partial_continued", "partial_stale")


def check_partials(t: Truth, s: QueueStats, m: LedgerModel, states: dict[str, str], seen: dict[str, int]) -> None:
    """Invariant 6. ``seen``: the highest head attempt observed so far per entry, kept by the machine
    across steps (a head whose attempt went down means an older attempt overwrote a newer one's record)."""
    want = {eid: e.progress.head for eid, e in m.entries.items() if e.progress is not None}
    assert t.partial_head == want, f"progress heads {t.partial_head} != model {want}"
    for eid, head in t.partial_head.items():
        assert states.get(eid) in (READY, EXECUTING), f"{eid} is {states.get(eid)} with a progress record"
        attempt, _, _, size, _ = head.split("|", 4)
        assert int(attempt) >= seen.get(eid, 0), f"{eid}: progress head went back from attempt {seen[eid]} to {attempt}"
        seen[eid] = int(attempt)
        e = m.entries[eid]
        assert e.progress is not None and len(t.partial[eid]) == int(size), f"{eid}: record length != head {head}"
        got = decode_partial(t.partial[eid], e.n)
        assert tuple(got[k] for k in sorted(got)) == e.progress.samples, f"{eid}: the stored record is not the saved one"
    total = sum(len(v) for v in t.partial.values())
    counters = {k: int(t.meta.get(k, 0)) for k in PARTIAL_COUNTERS}
    assert counters["partial_bytes"] == total, f"partial_bytes {counters['partial_bytes']} != records' {total} bytes"
    assert counters == {k: m.counters[k] for k in PARTIAL_COUNTERS}, f"{counters} != model"
    assert s.partial_records == len(t.partial_head), f"stats counts {s.partial_records} progress records"
