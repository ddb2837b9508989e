"""Redis truth for the stateful machine: read every key of one queue and derive each entry's state.

This module owns reading the queue raw (XPENDING over the whole PEL, the ready/buffer/kept sorted
sets, the lease hashes, the completion payload keys, the ledger, commits and dlq streams, the
progress records of partial rollouts) and deciding, index by index, which states each entry is in,
so that "exactly one state" is checked against what Redis holds and not against what the model
believes. It must not call the queue's scripts or change any key.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import redis

from rollout_queue.core.keys import QueueKeys

from .model_entries import BACKLOG, COMMITTED, COMPLETED, DEAD, EXECUTING, FILTERED, LEASED, READY, id_key
from .trainer_model import VERSION_SHIFT  # lua/include/buffer_score.lua

__all__ = ["VERSION_SHIFT", "Truth", "check_no_ghosts", "derive_state", "observe", "snapshot", "states_of"]



def _s(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


@dataclass
class Truth:
    """One read of a queue's keys. Not atomic, but the machine is the only client of its queue."""

    pel: dict[str, tuple[str, int]]            # entry_id -> (owner, delivery count)
    stream: dict[str, dict[str, bytes]]         # entry_id -> fields
    xlen: int
    last_delivered: str
    ready: dict[str, float]
    buffer: dict[str, float]
    bufver: dict[str, float]
    payloads: dict[str, set[int]]              # entry_id -> attempts with a payload key (payload:<id>:<attempt>)
    leases: dict[str, float]                    # the leases zset: active lease ids by deadline
    lease_records: dict[str, dict[str, str]]
    commits: list[dict[str, str]]
    dlq: list[dict[str, str]]
    kept: dict[str, float]
    ledger: dict[str, str]
    ids: dict[str, str]                         # source_id -> entry_id
    meta: dict[str, str]
    workers: dict[str, float]
    holds: dict[str, float]
    settled: dict[str, str]                     # entry_id -> source_id of each record waiting for prune
    history: dict[str, Any]                     # entry_id -> {"f": counted failures, "h": [attempts]}
    suspects: dict[str, float]                  # entry_id -> leases rolled back on a trainer error that held it
    partial: dict[str, bytes]                   # entry_id -> progress record (partial rollouts)
    partial_head: dict[str, str]                # entry_id -> 'attempt|tokens|min_version|bytes|worker'
    parked: dict[str, str] = field(default_factory=dict)  # entry_id -> settlement record (park_many)
    tokens: dict[str, dict[int, int]] = field(default_factory=dict)  # entry_id -> {attempt: its token record}

    @property
    def dead_ids(self) -> Counter[str]:
        return Counter(d.get("entry_id", "") for d in self.dlq)

    @property
    def commit_counts(self) -> Counter[str]:
        return Counter(i for line in self.commits for i in line.get("ids", "").split(",") if i)

    def n_of(self, entry_id: str) -> int:
        return int(self.stream[entry_id]["n"])


def _zset(r: redis.Redis, key: str) -> dict[str, float]:
    return {_s(m): float(sc) for m, sc in r.zrange(key, 0, -1, withscores=True)}


def _hash(r: redis.Redis, key: str) -> dict[str, str]:
    return {_s(k): _s(v) for k, v in r.hgetall(key).items()}


def _lines(r: redis.Redis, key: str) -> list[dict[str, str]]:
    return [{_s(k): _s(v) for k, v in fields.items()} for _, fields in r.xrange(key)]


def _records(r: redis.Redis, key: str) -> dict[str, str]:
    """The settled stream's records, each field an entry ID and its value the source_id."""
    out: dict[str, str] = {}
    for _, fields in r.xrange(key):
        for k, v in fields.items():
            assert _s(k) not in out, f"{_s(k)} is recorded as settled twice"
            out[_s(k)] = _s(v)
    return out


def _payloads(r: redis.Redis, keys: QueueKeys) -> dict[str, set[int]]:
    """Every completion payload key (rollout:{q}:payload:<entry_id>:<attempt>), by entry and attempt."""
    prefix = keys.payload("", 0)[:-len(":0")]  # rollout:{q}:payload:
    out: dict[str, set[int]] = {}
    for raw_key in r.scan_iter(match=keys.payload("*", "*"), count=1000):
        key = _s(raw_key)
        entry_id, sep, attempt = key[len(prefix):].rpartition(":")
        assert key.startswith(prefix) and sep and attempt.isdigit(), f"a payload key of no attempt: {key!r}"
        assert keys.payload(entry_id, int(attempt)) == key, f"a payload key spelt unlike keys.payload: {key!r}"
        kind = _s(r.type(key))
        assert kind == "string", f"payload key {key} holds a {kind}"
        out.setdefault(entry_id, set()).add(int(attempt))
    return out


def _token_records(r: redis.Redis, keys: QueueKeys) -> dict[str, dict[int, int]]:
    """The token records ('<entry_id>:<attempt>' -> count, lua/include/payloads.lua), by entry and attempt."""
    out: dict[str, dict[int, int]] = {}
    for field_name, value in r.hgetall(keys["tokens"]).items():
        entry_id, sep, attempt = _s(field_name).rpartition(":")
        assert sep and attempt.isdigit() and _s(value).isdigit(), f"a token record of no attempt: {field_name!r}"
        out.setdefault(entry_id, {})[int(attempt)] = int(value)
    return out


def observe(r: redis.Redis, keys: QueueKeys) -> Truth:
    src = keys["src"]
    pel = {_s(p["message_id"]): (_s(p["consumer"]), int(p["times_delivered"]))
           for p in r.xpending_range(src, "rollout", "-", "+", 1_000_000)}
    groups = [g for g in r.xinfo_groups(src) if _s(g["name"]) == "rollout"]
    assert len(groups) == 1, "the consumer group rollout is missing"
    records = {}
    for key in r.scan_iter(match=keys.lease("*"), count=1000):
        lease_id = _s(key)[len(keys.lease("")):]
        records[lease_id] = _hash(r, _s(key))
    return Truth(
        pel=pel,
        stream={_s(i): {_s(k): v for k, v in f.items()} for i, f in r.xrange(src)}, xlen=r.xlen(src),
        last_delivered=_s(groups[0]["last-delivered-id"]),
        ready=_zset(r, keys["ready"]), buffer=_zset(r, keys["buffer"]), bufver=_zset(r, keys["bufver"]),
        payloads=_payloads(r, keys),
        leases=_zset(r, keys["leases"]), lease_records=records,
        commits=_lines(r, keys["commits"]), dlq=_lines(r, keys["dlq"]),
        kept=_zset(r, keys["kept"]), ledger=_hash(r, keys["ledger"]), ids=_hash(r, keys["ids"]),
        meta={**_hash(r, keys["meta"]), **_hash(r, keys["counters"])}, workers=_zset(r, keys["workers"]), holds=_zset(r, keys["holds"]),
        settled=_records(r, keys["settled"]),
        history={_s(k): json.loads(v) for k, v in r.hgetall(keys["history"]).items()},
        suspects=_zset(r, keys["suspects"]),
        partial={_s(k): v for k, v in r.hgetall(keys["partial"]).items()},
        partial_head=_hash(r, keys["partial_head"]),
        parked=_hash(r, keys["parked"]),
        tokens=_token_records(r, keys),
    )


def states_of(t: Truth, entry_id: str) -> list[str]:
    """Every state some index of Redis puts the entry in: each index votes on its own."""
    votes = []
    owner = t.pel[entry_id][0] if entry_id in t.pel else None
    ledger = t.ledger.get(entry_id, "")
    if entry_id in t.ready:
        votes.append(READY)
    if entry_id in t.buffer:
        votes.append(COMPLETED)
    for lease_id, rec in t.lease_records.items():
        if rec.get("state") == "active" and entry_id in rec.get("members", "").split(","):
            votes.append(LEASED)
    if owner is not None and not owner.startswith("@"):
        votes.append(EXECUTING)
    if owner is None and entry_id in t.stream and id_key(entry_id) > id_key(t.last_delivered):
        votes.append(BACKLOG)
    if owner is None and ledger.startswith("s|committed|"):
        votes.append(COMMITTED)
    # Parked (a worker's script settled it as far as its role may): its owner is the parking consumer
    # and it counts as settled until settle_parked finishes it; in the dlq too would be two states.
    if (owner is None and ledger.startswith("s|filtered|")) or owner == "@filtered":
        votes.append(FILTERED)
    if owner == "@dead":
        votes.append(DEAD)
    if entry_id in t.dead_ids:
        votes.append(DEAD)
    return votes


def derive_state(t: Truth, entry_id: str) -> str:
    """The one state Redis holds the entry in; AssertionError names the conflict otherwise."""
    votes = states_of(t, entry_id)
    where = _where(t, entry_id)
    assert len(votes) == 1, f"entry {entry_id} is in {len(votes)} states {votes}: {where}"
    state = votes[0]
    owner, count = t.pel.get(entry_id, (None, 0))
    has_payload = entry_id in t.payloads
    # A buffered or leased group keeps exactly one payload key: its attempt's, the PEL delivery count
    # (@done and @lease claims keep it); every other state keeps none (a leak otherwise).
    if state in (COMPLETED, LEASED):
        assert t.payloads.get(entry_id) == {count}, (
            f"{state} {entry_id} at delivery count {count} has payload keys of attempts "
            f"{sorted(t.payloads.get(entry_id, ()))}: {where}")
    else:
        assert not has_payload, f"{state} {entry_id} kept payload keys {sorted(t.payloads[entry_id])}: {where}"
    # A token record lives exactly as long as its payload (both written at adoption, dropped together).
    assert set(t.tokens.get(entry_id, ())) == t.payloads.get(entry_id, set()), (
        f"{state} {entry_id} has token records of attempts {sorted(t.tokens.get(entry_id, ()))} and payload keys "
        f"of {sorted(t.payloads.get(entry_id, ()))}: {where}")
    # A progress record belongs to an unfinished group only: settled, buffered or leased, it is a leak.
    assert entry_id not in t.partial or state in (READY, EXECUTING), (
        f"{state} {entry_id} kept a progress record (head {t.partial_head.get(entry_id)!r}): {where}")
    if state == READY:
        assert owner == "@ready" and not has_payload, f"ready entry {entry_id} is inconsistent: {where}"
    elif state == COMPLETED:
        assert owner == "@done" and entry_id in t.bufver and has_payload, f"completed {entry_id}: {where}"
    elif state == LEASED:
        assert owner is not None and owner.startswith("@lease:"), f"leased {entry_id} owner {owner}: {where}"
        lease_id = owner[len("@lease:"):]
        rec = t.lease_records.get(lease_id, {})
        assert rec.get("state") == "active" and entry_id in rec.get("members", "").split(","), where
        assert lease_id in t.leases and has_payload and entry_id not in t.bufver, where
    elif state in (EXECUTING, BACKLOG):
        assert not has_payload and entry_id not in t.bufver and entry_id not in t.kept, where
    elif state == COMMITTED:
        assert not has_payload and entry_id not in t.bufver, where
        assert (entry_id in t.kept) == (entry_id in t.stream), f"kept copy of {entry_id}: {where}"
    elif owner in ("@dead", "@filtered"):
        word = owner[1:]
        assert ledger_of(t, entry_id).startswith(f"s|{word}|") and not has_payload, where
        assert t.parked.get(entry_id, "").startswith(f"{word}|"), f"parked {entry_id} without its record: {where}"
    elif state in (FILTERED, DEAD):
        assert entry_id not in t.stream and not has_payload and entry_id not in t.kept, where
        if state == DEAD:
            assert t.dead_ids[entry_id] == 1 and t.ledger.get(entry_id, "").startswith("s|dead|"), where
    return state


def _where(t: Truth, entry_id: str) -> str:
    return (f"pel={t.pel.get(entry_id)} ready={entry_id in t.ready} buffer={entry_id in t.buffer} "
            f"bufver={entry_id in t.bufver} payloads={sorted(t.payloads.get(entry_id, ()))} "
            f"kept={t.kept.get(entry_id)} "
            f"stream={entry_id in t.stream} dlq={t.dead_ids[entry_id]} ledger={t.ledger.get(entry_id)!r} "
            f"parked={t.parked.get(entry_id)!r}")


def ledger_of(t: Truth, entry_id: str) -> str:
    return t.ledger.get(entry_id, "")


def check_no_ghosts(t: Truth) -> None:
    """Every id any index names (a payload key too: no leaked payload) is a submitted entry; every
    active lease is indexed and owns its members."""
    known = set(t.ids.values())
    for name, ids in (("pel", t.pel), ("ready", t.ready), ("buffer", t.buffer), ("bufver", t.bufver),
                      ("payload keys", t.payloads), ("kept", t.kept), ("stream", t.stream)):
        ghosts = set(ids) - known
        assert not ghosts, f"{name} names entries nobody submitted: {sorted(ghosts)}"
    assert set(t.buffer) == set(t.bufver), f"buffer {sorted(t.buffer)} != bufver {sorted(t.bufver)}"
    ghosts = set(t.partial) - known
    assert not ghosts, f"progress records of entries nobody submitted, or already retired: {sorted(ghosts)}"
    assert set(t.partial) == set(t.partial_head), (
        f"progress records {sorted(t.partial)} != their heads {sorted(t.partial_head)}")
    active = {i for i, rec in t.lease_records.items() if rec.get("state") == "active"}
    assert active == set(t.leases), f"active lease records {sorted(active)} != leases zset {sorted(t.leases)}"
    for owner, _ in t.pel.values():
        assert not owner.startswith("@") or owner in ("@ready", "@done", "@dead", "@filtered") or owner[7:] in active, (
            f"PEL owner {owner} is neither a worker nor a live queue owner")


def snapshot(r: redis.Redis, keys: QueueKeys) -> dict[str, Any]:
    """Every key of the queue with its full content, minus PEL idle times (they tick on their own)."""
    out: dict[str, Any] = {}
    for raw_key in sorted(r.scan_iter(match=keys.pattern, count=1000)):
        key = _s(raw_key)
        if key == keys["clock"]:
            continue  # the queue clock ticks on its own (now_ms.lua): not queue state
        kind = _s(r.type(key))
        if kind == "stream":
            groups = [{_s(k): v for k, v in g.items()} for g in r.xinfo_groups(key)]
            pel = [(p["message_id"], p["consumer"], p["times_delivered"])
                   for p in r.xpending_range(key, "rollout", "-", "+", 1_000_000)] if groups else []
            consumers = sorted((_s(c["name"]), c["pending"]) for c in r.xinfo_consumers(key, "rollout")) if groups else []
            out[key] = (r.xrange(key), groups, pel, consumers)
        elif kind == "hash":
            out[key] = r.hgetall(key)
        elif kind == "zset":
            out[key] = r.zrange(key, 0, -1, withscores=True)
        elif kind == "set":
            out[key] = sorted(r.smembers(key))
        else:
            out[key] = (kind, r.get(key) if kind == "string" else None)
    return out
