"""The demo's closing check, read straight from Redis: every group trained exactly once, none lost,
none left owned.

Sources of truth, cross-checked against each other:
- ``ids`` (source_id -> entry ID): what the producer enqueued;
- the ``commits`` stream (one line per committed lease: ``lease``, ``ids``, ``step``): what was trained;
- ``ledger`` (entry ID -> ``s|<settlement>|...`` once settled): how each entry ended;
- the consumer group's PEL and the queue's counters: what is still owned;
- the trainer's own list of the entry IDs it trained on.
Read-only: it changes nothing.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Iterable

import redis

from rollout_queue.core.keys import QueueKeys
from rollout_queue.core.models import QueueStats


@dataclass
class LedgerCheck:
    """The outcome; ``ok`` when ``problems`` is empty."""

    expected: int
    enqueued: int = 0
    committed_once: int = 0
    committed_twice: int = 0
    filtered: int = 0
    dead: int = 0
    lost: int = 0
    still_owned: int = 0
    commit_lines: int = 0
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


def check_ledger(client: redis.Redis, keys: QueueKeys, expected_source_ids: Iterable[str],
                 trained_entry_ids: Iterable[str], stats: QueueStats) -> LedgerCheck:
    """Check the queue's ledger after a run in which every enqueued group should have been settled."""
    expected = sorted(set(expected_source_ids))
    result = LedgerCheck(expected=len(expected))
    ids = {_text(k): _text(v) for k, v in client.hgetall(keys["ids"]).items()}
    result.enqueued = len(ids)
    missing = [sid for sid in expected if sid not in ids]
    extra = sorted(set(ids) - set(expected))
    if missing:
        result.problems.append(f"{len(missing)} source groups never enqueued (e.g. {missing[:3]})")
    if extra:
        result.problems.append(f"{len(extra)} unexpected source groups enqueued (e.g. {extra[:3]})")
    commits = _commits(client, keys, result)
    _count_settlements(client, keys, ids, commits, result)
    if set(commits) - set(ids.values()):
        result.problems.append(f"{len(set(commits) - set(ids.values()))} committed entries that no producer enqueued")
    if Counter(trained_entry_ids) != commits:
        result.problems.append("the trainer's own record of trained groups differs from the commits stream")
    _check_nothing_owned(client, keys, stats, result)
    return result


def _commits(client: redis.Redis, keys: QueueKeys, result: LedgerCheck) -> Counter[str]:
    """How many committed leases name each entry ID (the commits stream's ``ids`` field)."""
    commits: Counter[str] = Counter()
    for _, fields in client.xrange(keys["commits"], "-", "+"):
        f = {_text(k): _text(v) for k, v in fields.items()}
        commits.update(x for x in f.get("ids", "").split(",") if x)
        result.commit_lines += 1
    return commits


def _count_settlements(client: redis.Redis, keys: QueueKeys, ids: dict[str, str], commits: Counter[str],
                       result: LedgerCheck) -> None:
    """Each enqueued entry: committed once (commits stream and ledger agree), twice, filtered, dead or lost."""
    settled = {_text(k): _text(v) for k, v in client.hgetall(keys["ledger"]).items()}
    for entry in ids.values():
        times = commits.get(entry, 0)
        how = settled.get(entry, "").split("|")
        if times == 1 and how[:2] == ["s", "committed"]:
            result.committed_once += 1
        elif times > 1:
            result.committed_twice += 1
        elif how[:2] == ["s", "filtered"]:
            result.filtered += 1
        elif how[:2] == ["s", "dead"]:
            result.dead += 1
        else:
            result.lost += 1
    if result.committed_twice:
        result.problems.append(f"{result.committed_twice} groups committed more than once")
    if result.lost:
        result.problems.append(f"{result.lost} groups neither committed, filtered nor dead-lettered")


def _check_nothing_owned(client: redis.Redis, keys: QueueKeys, stats: QueueStats, result: LedgerCheck) -> None:
    pending = client.xpending(keys["src"], "rollout")
    result.still_owned = int(pending["pending"]) if pending else 0
    if result.still_owned or stats.retained:
        result.problems.append(f"{result.still_owned} entries still owned in the PEL (retained={stats.retained})")
    if stats.backlog or stats.ready or stats.completed or stats.leased or stats.executing_groups:
        result.problems.append(f"work left in the queue: backlog={stats.backlog} ready={stats.ready} "
                               f"completed={stats.completed} leased={stats.leased} executing={stats.executing_groups}")
