"""Short paths through the state machine for the trainer-side and reaper contract tests.

This module owns the "submit n groups, reserve, complete them with samples of given versions" steps
and the Redis-truth readers (PEL owners, ledger, meta) those tests assert against. It works with a
sync queue or the async one behind ``SyncView``. It must not assert anything itself, start servers,
or sleep: tests decide what is right and wait with ``tests.helpers.wait_until``.
"""

from __future__ import annotations

import inspect
import uuid
from collections.abc import Iterable, Sequence
from typing import Any

import redis

from rollout_queue import Reservation, Sample, SourceGroup
from rollout_queue.core.keys import QueueKeys


def make_groups(count: int, n: int = 2, tag: str | None = None) -> list[SourceGroup]:
    """``count`` distinct source groups of ``n`` parent slots each."""
    tag = tag or uuid.uuid4().hex[:8]
    return [SourceGroup(source_id=f"{tag}-{i}", prompt=f"prompt {tag} {i}", n=n, metadata={"i": i})
            for i in range(count)]


def samples_for(res: Reservation, version: int = 0, reward: float = 1.0) -> list[Sample]:
    """One sample per parent slot of the reservation, all generated with policy ``version``."""
    return [Sample(slot=i, token_ids=(1, 2, 3 + i), logprobs=(-0.1, -0.2, -0.3), reward=reward, version=version)
            for i in range(res.group.n)]


def submit(q: Any, count: int, n: int = 2) -> list[str]:
    """Backlog ``count`` fresh groups; returns their entry IDs in submission order."""
    return list(q.submit(make_groups(count, n)))


def reserve_all(worker: Any, count: int) -> list[Reservation]:
    """Reserve exactly ``count`` groups (in as many calls as the queue needs)."""
    got: list[Reservation] = []
    while len(got) < count:
        batch = worker.reserve(max_groups=count - len(got))
        if not batch:
            raise RuntimeError(f"reserve granted nothing after {len(got)} of {count}")
        got += batch
    return got


def complete_all(worker: Any, reservations: Iterable[Reservation], versions: int | Sequence[int] = 0) -> list[str]:
    """Complete each reservation (in order) with samples of the given version(s); returns entry IDs."""
    out = []
    res_list = list(reservations)
    vs = [versions] * len(res_list) if isinstance(versions, int) else list(versions)
    for res, v in zip(res_list, vs, strict=True):
        assert worker.complete(res.receipt, samples_for(res, v)) == "buffered"
        out.append(res.entry_id)
    return out


def fill_buffer(q: Any, count: int, versions: int | Sequence[int] = 0, n: int = 2,
                worker_id: str = "w-fill") -> list[str]:
    """Submit ``count`` groups, reserve them with one worker and complete them with samples of
    ``versions`` (one int for all, or one per group). Returns the entry IDs in completion order."""
    submit(q, count, n)
    w = q.worker(worker_id)
    return complete_all(w, reserve_all(w, count), versions)


def train(q: Any, groups: int, step: int | None = None) -> Any:
    """Lease exactly ``groups`` groups and commit them at ``step``; returns the committed lease."""
    lease = q.lease(groups)
    assert lease is not None, f"no lease of {groups} groups"
    lease.commit(step=step)
    return lease


# -- Redis truth ---------------------------------------------------------------------------------


def keys(queue_name: str) -> QueueKeys:
    return QueueKeys(queue_name)


def pel(raw: redis.Redis, queue_name: str) -> dict[str, tuple[str, int]]:
    """entry ID -> (PEL owner, delivery count), straight from XPENDING."""
    rows = raw.xpending_range(keys(queue_name)["src"], "rollout", "-", "+", 10_000)
    return {_s(r["message_id"]): (_s(r["consumer"]), int(r["times_delivered"])) for r in rows}


def owners(raw: redis.Redis, queue_name: str, ids: Iterable[str]) -> list[str]:
    """The PEL owner of each entry ID ('' when it is not pending)."""
    table = pel(raw, queue_name)
    return [table.get(i, ("", 0))[0] for i in ids]


def zmembers(raw: redis.Redis, queue_name: str, role: str) -> list[str]:
    return [_s(x) for x in raw.zrange(keys(queue_name)[role], 0, -1)]


def meta(raw: redis.Redis, queue_name: str) -> dict[str, str]:
    """meta and counters as one mapping (no field name is in both)."""
    return {_s(k): _s(v) for key in ("meta", "counters") for k, v in raw.hgetall(keys(queue_name)[key]).items()}


def ledger(raw: redis.Redis, queue_name: str, entry_id: str) -> str:
    return _s(raw.hget(keys(queue_name)["ledger"], entry_id) or b"")


def stream_ids(raw: redis.Redis, queue_name: str) -> list[str]:
    return [_s(e[0]) for e in raw.xrange(keys(queue_name)["src"])]


def history(raw: redis.Redis, queue_name: str, entry_id: str) -> list[dict[str, Any]]:
    """The attempt history of an entry still owned by the queue (reasons of its ended attempts)."""
    import orjson

    blob = raw.hget(keys(queue_name)["history"], entry_id)
    return list(orjson.loads(blob)["h"]) if blob else []


def payload_keys(raw: redis.Redis, queue_name: str, entry_id: str | None = None) -> set[str]:
    """Every completion payload key of the queue (rollout:{q}:payload:<entry ID>:<attempt>), or only
    those of one entry (any attempt)."""
    match = keys(queue_name).prefix + "payload:" + (f"{entry_id}:*" if entry_id else "*")
    return {_s(k) for k in raw.scan_iter(match=match, count=1000)}


def execute(q: Any, op: Any) -> Any:
    """Run one protocol Call/Command through the queue's own transport (sync or async)."""
    result = q.driver.execute(op)
    if inspect.isawaitable(result):
        return q._loop.run_until_complete(result)  # the SyncView's private loop
    return result


def _s(x: Any) -> str:
    return x.decode() if isinstance(x, bytes) else str(x)


def server_ms(raw: redis.Redis) -> int:
    """The server clock (the one every script judges deadlines by), in ms."""
    sec, usec = raw.time()
    return int(sec) * 1000 + int(usec) // 1000


def wait_past(raw: redis.Redis, deadline_ms: int, timeout: float = 5.0) -> None:
    """Wait until the server clock is strictly past ``deadline_ms``."""
    from tests.helpers import wait_until

    wait_until(lambda: server_ms(raw) > deadline_ms, timeout=timeout, interval=0.005,
               message=f"server clock past {deadline_ms}")


def wait_silent(q: Any, count: int = 1, timeout: float = 5.0) -> None:
    """Wait until the server counts at least ``count`` workers silent past worker_timeout."""
    from tests.helpers import wait_until

    wait_until(lambda: q.stats().workers_silent >= count, timeout=timeout, interval=0.01,
               message=f"{count} silent worker(s)")


def check_header(name: str, keys_: Sequence[str], argv: Sequence[str]) -> None:
    """The script's header declares exactly these KEYS and ARGV, and the builder follows it."""
    from rollout_queue.core import protocol
    from rollout_queue.core.keys import KEY_SUFFIXES
    from rollout_queue.core.scripts import SCRIPTS

    script = SCRIPTS[name]
    assert script.keys == tuple(keys_), f"{name} KEYS"
    assert script.argv == tuple(argv), f"{name} ARGV"
    assert set(script.keys) <= set(KEY_SUFFIXES), f"{name} names a key role keys.py does not know"
    qk = QueueKeys("hdr")
    call = protocol.build(qk, name, **{a.lstrip("*"): ([] if a.startswith("*") else "x") for a in argv})
    assert call.keys == tuple(qk[k] for k in keys_)
    assert len(call.args) == len([a for a in argv if not a.startswith("*")])
    try:
        protocol.build(qk, name, not_an_argv="x")
    except TypeError:
        pass
    else:
        raise AssertionError(f"build({name!r}) accepted an ARGV name its header does not declare")
