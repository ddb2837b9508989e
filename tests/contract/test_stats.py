"""stats.lua: the queue's counters agree with a recount from Redis truth, on real servers.

After a mixed sequence of every transition, q.stats() must equal what XPENDING, the indexes and the
streams say: @ready owners = ready, @done = completed, @lease:* = leased, every other owner =
executing_groups (and the sum of their n = executing_samples), PEL size = retained, XLEN - retained -
kept = backlog = entries after the group's last-delivered ID; committed matches the ledger (and the
commits stream when nothing was restored), kept and dead their set and stream. The script is read-only: it leaves every key byte-identical.
"""

from __future__ import annotations

from collections import Counter

from rollout_queue import QueueConfig
from tests.contract.conftest import snapshot
from tests.contract.lifecycle import (
    check_header,
    complete_all,
    fill_buffer,
    keys,
    make_groups,
    pel,
    reserve_all,
    samples_for,
)


def test_header_matches_builder() -> None:
    check_header("stats", ["src", "meta", "ready", "buffer", "bufver", "workers", "leases", "holds", "dlq", "commits", "ledger", "ids", "intake", "counters"], [])


def _id_key(entry_id: str) -> tuple[int, int]:
    ms, seq = entry_id.split("-")
    return int(ms), int(seq)


def recount(raw, queue_name) -> dict[str, int]:
    """The state counts, from Redis truth alone (no counter in meta is read)."""
    k = keys(queue_name)
    owners = pel(raw, queue_name)
    by_owner = Counter("@lease" if o.startswith("@lease:") else o if o.startswith("@") else "worker"
                       for o, _ in owners.values())
    entries = {e.decode(): {f.decode(): v.decode() for f, v in kv.items()} for e, kv in raw.xrange(k["src"])}
    executing = [e for e, (o, _) in owners.items() if not o.startswith("@")]
    [group] = [g for g in raw.xinfo_groups(k["src"]) if g["name"] in (b"rollout", "rollout")]
    last = group["last-delivered-id"]
    last = _id_key(last.decode() if isinstance(last, bytes) else last)
    # The ledger's last word per entry: a restore turns 's|committed|...' back into an attempt.
    committed = sum(1 for v in raw.hvals(k["ledger"]) if v.startswith(b"s|committed|"))
    return {
        "ready": by_owner["@ready"], "completed": by_owner["@done"], "leased": by_owner["@lease"],
        "executing_groups": by_owner["worker"],
        "executing_samples": sum(int(entries[e]["n"]) for e in executing),
        # Parked entries (@dead, @filtered: a worker's script settled them as far as its role may)
        # are settled already: not retained, counted dead or filtered, still in the stream.
        "retained": len(owners) - by_owner["@dead"] - by_owner["@filtered"], "kept": raw.zcard(k["kept"]),
        "backlog": sum(1 for e in entries if _id_key(e) > last),
        "xlen_backlog": raw.xlen(k["src"]) - len(owners) - raw.zcard(k["kept"]),
        "committed": committed,
        "commit_lines": sum(len(kv[b"ids"].decode().split(",")) for _, kv in raw.xrange(k["commits"])), "dead": raw.xlen(k["dlq"]) + by_owner["@dead"], "active_leases": raw.zcard(k["leases"]),
        "ready_index": raw.zcard(k["ready"]), "buffer_index": raw.zcard(k["buffer"]),
    }


def assert_agrees(q, raw, queue_name) -> None:
    before = snapshot(raw, queue_name)
    s = q.stats()
    assert snapshot(raw, queue_name) == before, "stats is read-only"
    truth = recount(raw, queue_name)
    mine = {name: getattr(s, name) for name in ("ready", "completed", "leased", "executing_groups",
                                                "executing_samples", "retained", "kept", "backlog",
                                                "committed", "dead", "active_leases")}
    want = {name: truth[name] for name in mine}
    assert mine == want
    assert truth["xlen_backlog"] == truth["backlog"]
    assert (truth["ready_index"], truth["buffer_index"]) == (s.ready, s.completed)


def test_stats_agree_with_redis_truth_after_a_mixed_sequence(open_queue, raw, queue_name) -> None:
    q = open_queue(QueueConfig(max_staleness=1))
    assert_agrees(q, raw, queue_name)
    fill_buffer(q, 5, versions=[0, 0, 1, 1, 1])
    assert q.stats().since_commit_ms is None         # no trainer has committed yet
    q.lease(2).commit(step=1)                        # committed, kept until a checkpoint
    assert 0 <= q.stats().since_commit_ms < 60_000 and "last_commit_ms" not in q.stats().counters
    open_lease = q.lease(1, timeout_s=30)            # leased
    a_b = q.submit(make_groups(2, n=3))
    raw.xadd(keys(queue_name)["src"], {"v": "1", "sid": "junk", "n": "0", "p": "[]", "g": "{}"})
    q.submit(make_groups(4, n=3))
    w2 = q.worker("w-2")
    running = reserve_all(w2, 2)                     # executing: 2 groups, 6 samples
    assert [r.entry_id for r in running] == a_b
    [c] = q.worker("w-4").reserve(1)                 # the garbage before it is dead-lettered
    q.worker("w-4").filter(c.receipt, "zero_std")    # filtered
    [d] = q.worker("w-3").reserve(1)
    q.worker("w-3").abort(d.receipt, "drain")        # ready
    q.publish_version(2)                             # the two v1 groups stay fresh (staleness 1)
    s = q.stats()
    assert (s.backlog, s.ready, s.executing_groups, s.executing_samples, s.completed, s.leased) == \
        (2, 1, 2, 6, 2, 1)
    assert (s.retained, s.committed, s.kept, s.filtered, s.dead) == (6, 2, 2, 1, 1)
    assert (s.staleness_max, s.staleness_mean, s.version) == (1, 1.0, 2)
    assert s.filtered_by_reason == {"zero_std": 1}
    assert_agrees(q, raw, queue_name)
    assert recount(raw, queue_name)["commit_lines"] == s.committed

    # More of every transition, then recount again.
    complete_all(w2, running[:1], versions=2)
    w2.fail(running[1].receipt, "engine error")
    open_lease.rollback()
    q.lease(3).commit()
    q.checkpoint(1)
    assert_agrees(q, raw, queue_name)
    s = q.stats()
    assert (s.kept, s.committed, s.terminals["failed"], s.terminals["rolled_back"]) == (0, 5, 1, 1)


def test_stats_agree_after_reaping_and_restore(open_queue, raw, queue_name) -> None:
    q = open_queue(QueueConfig(worker_timeout_s=0.15))
    fill_buffer(q, 3)
    q.lease(3).commit(step=1)
    q.restore(0)
    assert_agrees(q, raw, queue_name)
    w = q.worker("w-gone")
    [res, *_] = w.reserve(max_groups=2)
    w.complete(res.receipt, samples_for(res))
    from tests.contract.lifecycle import wait_silent

    wait_silent(q, 2)  # w-fill (owns nothing) and w-gone
    assert q.reap().lost == 1
    assert_agrees(q, raw, queue_name)
