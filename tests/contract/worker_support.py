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


def call(q: Any, name: str, **argv: Any) -> list[Any]:
    """Build script ``name`` with ``argv`` and run it once; the raw reply with text status."""
    reply = send(q, p.build(q.keys, name, **argv))
    return [p.s(reply[0]), *reply[1:]]


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
    return {k.decode(): v.decode() for k, v in raw.hgetall(keys(queue_name)["meta"]).items()}


def counter(raw: redis.Redis, queue_name: str, name: str) -> int:
    return int(raw.hget(keys(queue_name)["meta"], name) or 0)


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


def consumers(raw: redis.Redis, queue_name: str) -> set[str]:
    return {c["name"].decode() for c in raw.xinfo_consumers(keys(queue_name)["src"], "rollout")}


def entry_ids(reservations: Sequence[Any]) -> list[str]:
    return [r.receipt.entry_id for r in reservations]
