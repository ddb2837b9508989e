"""The Redis truth of one queue at the end of a run: a raw, read-only copy of every key the checker needs.

Owns reading (XPENDING over the whole PEL, the stream and its consumer group cursor, the ready and
buffer sets, lease records, the ledger and ids hashes, the commits and dlq streams, meta) with plain
redis-py commands. It never calls a queue script and never writes. Key names come from keys.py.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Mapping, Sequence

import orjson
import redis

from rollout_queue.core.keys import QueueKeys


#: An XRANGE reply as redis-py types it (None only for a client in pipeline or async mode).
RawLines = Sequence[tuple[bytes | str | None, Mapping[bytes | str, bytes | str] | None]] | None


def _s(value: object) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


def stream_lines(reply: RawLines) -> list[tuple[str, dict[str, str]]]:
    """An XRANGE reply as text: (stream id, fields)."""
    return [(_s(i), hash_text(f)) for i, f in (reply or [])]


def hash_text(reply: object) -> dict[str, str]:
    """An HGETALL reply (or a stream line's fields) as text; anything but a mapping reads as empty
    (redis-py types a synchronous client's reply as possibly awaitable)."""
    return {_s(k): _s(v) for k, v in reply.items()} if isinstance(reply, Mapping) else {}


def _id_key(entry_id: str) -> tuple[int, int]:
    ms, seq = entry_id.split("-")
    return int(ms), int(seq)


@dataclass
class Truth:
    pel: dict[str, tuple[str, int]]          # entry_id -> (owner, delivery count)
    stream_ids: list[str]
    last_delivered: str
    ready: list[str]
    buffer: list[str]
    leases: list[str]                          # lease ids still due (active or being rolled back)
    lease_records: dict[str, dict[str, str]]
    ledger: dict[str, str]                     # entry_id -> a|... or s|...
    ids: dict[str, str]                        # source_id -> entry_id
    commits: list[dict[str, str]]              # one line per committed lease: lease, ids, step, ..., stream_id
    dlq: list[dict[str, Any]]                  # entry_id, source_id, reason, attempt, history (decoded), stream_id
    meta: dict[str, str]
    # entry_id -> its attempts ({a, w, t, r, ms}, the last 32) and counted failures (DESIGN key history)
    history: dict[str, dict[str, Any]] = field(default_factory=dict)
    reaped: list[dict[str, str]] = field(default_factory=list)  # the reaped stream: worker, ids, terminal, stream_id
    push: dict[str, str] = field(default_factory=dict)          # the last push round's record
    # entry_id -> the head of its progress record (attempt|tokens|min_version|bytes|worker), if one is left
    partial_heads: dict[str, str] = field(default_factory=dict)

    @property
    def backlog(self) -> list[str]:
        """Entries never delivered: after the consumer group's cursor."""
        cursor = _id_key(self.last_delivered)
        return [i for i in self.stream_ids if _id_key(i) > cursor and i not in self.pel]


def _dlq_line(f: dict[str, str], stream_id: str = "") -> dict[str, Any]:
    try:
        history = orjson.loads(f.get("history", "[]") or "[]")
    except orjson.JSONDecodeError:
        history = None
    if isinstance(history, dict):  # {"f": counted failures, "h": attempts} or the bare list
        history = history.get("h")
    return {"entry_id": f.get("entry_id", ""), "source_id": f.get("source_id", ""),
            "reason": f.get("reason", ""), "attempt": int(f.get("attempt", "0") or 0),
            "worker": f.get("worker", ""), "history": history if isinstance(history, list) else [],
            "stream_id": _s(stream_id)}


def _history(raw: str) -> dict[str, Any]:
    """One entry's history value ({"f": counted failures, "h": attempts}); garbage reads as none."""
    try:
        value = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return {"f": None, "h": [], "garbage": _s(raw)[:200]}
    if isinstance(value, list):  # the older bare list
        return {"f": None, "h": value}
    return value if isinstance(value, dict) and isinstance(value.get("h"), list) else {"f": None, "h": [],
                                                                                         "garbage": _s(raw)[:200]}


def observe(url: str, queue: str) -> Truth:
    """Read the queue once. The run is over, so nothing changes while we read."""
    keys = QueueKeys(queue)
    r = redis.Redis.from_url(url, socket_timeout=30)
    try:
        src = keys["src"]
        pel = {_s(p["message_id"]): (_s(p["consumer"]), int(p["times_delivered"]))
               for p in r.xpending_range(src, "rollout", "-", "+", 10_000_000)}
        group = [g for g in r.xinfo_groups(src) if _s(g["name"]) == "rollout"]
        records = {}
        for key in r.scan_iter(match=keys.lease("*"), count=1000):
            records[_s(key)[len(keys.lease("")):]] = hash_text(r.hgetall(key))
        return Truth(
            pel=pel,
            stream_ids=[i for i, _ in stream_lines(r.xrange(src))],
            last_delivered=_s(group[0]["last-delivered-id"]) if group else "0-0",
            ready=[_s(x) for x in r.zrange(keys["ready"], 0, -1)],
            buffer=[_s(x) for x in r.zrange(keys["buffer"], 0, -1)],
            leases=[_s(x) for x in r.zrange(keys["leases"], 0, -1)],
            lease_records=records,
            ledger=hash_text(r.hgetall(keys["ledger"])),
            ids=hash_text(r.hgetall(keys["ids"])),
            # stream_id: the Redis time of the settlement (the progress watchdog's clock for it).
            commits=[{**f, "stream_id": i} for i, f in stream_lines(r.xrange(keys["commits"]))],
            dlq=[_dlq_line(f, i) for i, f in stream_lines(r.xrange(keys["dlq"]))],
            # meta and counters as one mapping (the counters left meta in data layout 4; no name is in both)
            meta={**hash_text(r.hgetall(keys["meta"])), **hash_text(r.hgetall(keys["counters"]))},
            history={k: _history(v) for k, v in hash_text(r.hgetall(keys["history"])).items()},
            reaped=[{**f, "stream_id": i} for i, f in stream_lines(r.xrange(keys["reaped"]))],
            push=hash_text(r.hgetall(keys["push"])),
            partial_heads=hash_text(r.hgetall(keys["partial_head"])),
        )
    finally:
        r.close()


def save(truth: Truth, path: Path) -> None:
    """Keep the truth beside the logs, so the checker can be run again on them (``--recheck``)."""
    path.write_bytes(orjson.dumps(asdict(truth)))


def load(path: Path) -> Truth:
    raw = orjson.loads(path.read_bytes())
    raw["pel"] = {k: tuple(v) for k, v in raw["pel"].items()}
    return Truth(**raw)
