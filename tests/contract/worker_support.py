"""Helpers for the worker-side contract tests (open, submit, reserve, complete, fail, ...).

Owns building source groups and samples, sending one raw script call through a queue's own
transport (so a test can read a status word the client turns into ``[]`` or an exception), and
reading Redis truth (PEL owners, meta counters, history, ledger). It never changes queue state
by itself except through the scripts a test names.
"""

from __future__ import annotations

from typing import Any, Generator, Sequence

import orjson
import redis

from rollout_queue import Sample, SourceGroup
from rollout_queue.core import protocol as p
from rollout_queue.core.keys import QueueKeys


def group(source_id: str, n: int = 2, **kwargs: Any) -> SourceGroup:
    """A small source group whose prompt names it, so a decoded copy is easy to compare."""
    return SourceGroup(source_id, f"prompt of {source_id}", n, kwargs.pop("metadata", {"k": source_id}), **kwargs)


def samples(n: int, version: int = 0, tokens: int = 2) -> list[Sample]:
    """One well-formed output per parent slot 0..n-1."""
    return [Sample(slot=i, token_ids=tuple(range(i, i + tokens)), logprobs=tuple(-0.5 for _ in range(tokens)),
                   reward=float(i), version=version) for i in range(n)]


def _one(op: p.Op) -> Generator[p.Op, Any, Any]:
    reply = yield op
    return reply


def send(q: Any, op: p.Op) -> Any:
    """Run one prepared call (or command) through the queue's transport; the raw reply."""
    return q.run(_one(op))


def call(q: Any, name: str, stage: Sequence[tuple[str, bytes]] = (), **argv: Any) -> list[Any]:
    """Build script ``name`` with ``argv`` and run it once; the raw reply with text status.
    ``stage``: (key, bytes) pairs the transport SETs in the same MULTI, just before the script."""
    reply = send(q, p.build(q.keys, name, stage=tuple(stage), **argv))
    return [p.s(reply[0]), *reply[1:]]


def call_complete(q: Any, entry_id: str, attempt: int, worker_id: str, payload: bytes, min_version: Any = 0,
                  slots: str = "0,1", tokens: Any = 0) -> list[Any]:
    """One complete script call as flows.complete sends it: the payload SET at the attempt's payload
    key in the call's MULTI and its byte length in ARGV (nothing staged and size '' for slots '');
    ``tokens``: the completion's declared token count."""
    stage = ((q.keys.payload(entry_id, attempt), payload),) if slots else ()
    return call(q, "complete", stage=stage, entry_id=entry_id, attempt=attempt, worker_id=worker_id,
                size=len(payload) if slots else "", min_version=min_version, slots=slots, tokens=tokens)


def call_complete_many(q: Any, worker_id: str, items: Sequence[tuple[str, Any, bytes, Any, str]]) -> list[Any]:
    """One complete_many script call as flows.complete_many sends it: ``items`` are (entry_id, attempt,
    payload, min_version, slots); each payload with slots is SET at its payload key in the call's
    MULTI, and only its byte length goes in ARGV (with a token count of 0)."""
    flat: list[Any] = []
    stage: list[tuple[str, bytes]] = []
    for entry_id, attempt, payload, min_version, slots in items:
        flat += [entry_id, attempt, len(payload) if slots else "", min_version, slots, 0]
        if slots:
            stage.append((q.keys.payload(entry_id, attempt), payload))
    return call(q, "complete_many", stage=stage, worker_id=worker_id, items=flat)


def raw_reserve(q: Any, worker_id: str, max_groups: int = 1, max_samples: int = 0,
                request_id: str = "req-1") -> p.ReserveReply:
    """One reserve script call, parsed but not decoded (no reject, no blocking, no retry)."""
    built = p.build(q.keys, "reserve", worker_id=worker_id, max_groups=max_groups, max_samples=max_samples,
                    request_id=request_id, overcommit=0)
    return p.parse_reserve(send(q, built), worker_id)


def keys(queue_name: str) -> QueueKeys:
    return QueueKeys(queue_name)


def pel(raw: redis.Redis, queue_name: str) -> dict[str, tuple[str, int]]:
    """entry ID -> (PEL owner, delivery count) for every pending entry."""
    rows = raw.xpending_range(keys(queue_name)["src"], "rollout", "-", "+", 10_000)
    return {r["message_id"].decode(): (r["consumer"].decode(), int(r["times_delivered"])) for r in rows}


def meta(raw: redis.Redis, queue_name: str) -> dict[str, str]:
    """meta and counters as one mapping (no field name is in both)."""
    return {k.decode(): v.decode() for key in ("meta", "counters") for k, v in raw.hgetall(keys(queue_name)[key]).items()}


def counter(raw: redis.Redis, queue_name: str, name: str) -> int:
    return int(raw.hget(keys(queue_name)["counters"], name) or 0)


def history(raw: redis.Redis, queue_name: str, entry_id: str) -> dict[str, Any] | None:
    """The stored attempt history {'f': counted failures, 'h': [attempts]} of an entry."""
    value = raw.hget(keys(queue_name)["history"], entry_id)
    return None if value is None else orjson.loads(value)


def ledger(raw: redis.Redis, queue_name: str, entry_id: str) -> str | None:
    value = raw.hget(keys(queue_name)["ledger"], entry_id)
    return None if value is None else value.decode()


def ready_ids(raw: redis.Redis, queue_name: str) -> list[str]:
    return [x.decode() for x in raw.zrange(keys(queue_name)["ready"], 0, -1)]


def buffer_ids(raw: redis.Redis, queue_name: str) -> list[str]:
    return [x.decode() for x in raw.zrange(keys(queue_name)["buffer"], 0, -1)]


def payload_keys(raw: redis.Redis, queue_name: str, entry_id: str | None = None) -> set[str]:
    """Every completion payload key of the queue (rollout:{q}:payload:<entry ID>:<attempt>), or only
    those of one entry (any attempt)."""
    match = keys(queue_name).prefix + "payload:" + (f"{entry_id}:*" if entry_id else "*")
    return {k.decode() for k in raw.scan_iter(match=match, count=1000)}


def attempt_of(raw: redis.Redis, queue_name: str, entry_id: str) -> int:
    """The entry's current attempt: its PEL delivery count (0 when it is pending nowhere)."""
    rows = raw.xpending_range(keys(queue_name)["src"], "rollout", entry_id, entry_id, 1)
    return int(rows[0]["times_delivered"]) if rows else 0


def stored_payload(raw: redis.Redis, queue_name: str, entry_id: str, attempt: int | None = None) -> bytes | None:
    """The completion payload kept for an entry's attempt (default: its current one, from XPENDING)."""
    attempt = attempt_of(raw, queue_name, entry_id) if attempt is None else attempt
    return raw.get(keys(queue_name).payload(entry_id, attempt))


def consumers(raw: redis.Redis, queue_name: str) -> set[str]:
    return {c["name"].decode() for c in raw.xinfo_consumers(keys(queue_name)["src"], "rollout")}


def entry_ids(reservations: Sequence[Any]) -> list[str]:
    return [r.receipt.entry_id for r in reservations]
