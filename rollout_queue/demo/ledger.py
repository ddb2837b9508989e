"""The demo's closing check: every group trained exactly once, none lost, none left owned.

The check itself is ``rollout-queue verify --final`` (ops/verify.py: the ids, the PEL, the backlog,
the ledger and the commits stream, cross-checked), so an operator runs the same proof on any queue.
The demo adds what only it knows:
- the source_ids its producer should have enqueued (its dataset plan): none missing, none extra;
- the trainer's own list of the entry IDs it trained on, which must equal the commits stream;
- no commits line names an entry that no submitted group maps to (nothing is pruned during a demo).
Read-only: it changes nothing.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Iterable

import redis

from rollout_queue.api.queue import RolloutQueue
from rollout_queue.ops import verify
from rollout_queue.ops.view_models import VerifyReport


@dataclass
class LedgerCheck:
    """The outcome: verify's report plus the demo's own problems; ``ok`` when there are none."""

    expected: int
    report: VerifyReport
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems

    @property
    def enqueued(self) -> int:
        return self.report.submitted

    def state(self, name: str) -> int:
        return self.report.states.get(name, 0)


def check_ledger(q: RolloutQueue, client: redis.Redis, expected_source_ids: Iterable[str],
                 trained_entry_ids: Iterable[str]) -> LedgerCheck:
    """Check the queue after a run in which every enqueued group should have been settled."""
    expected = sorted(set(expected_source_ids))
    report = q.run(verify.verify(q.keys, final=True))
    result = LedgerCheck(len(expected), report)
    result.problems += [f"{x.groups} groups {x.what} (e.g. {', '.join(x.examples)})" for x in report.problems]
    mapped = client.hmget(q.keys["ids"], expected) if expected else []
    missing = [sid for sid, entry in zip(expected, mapped) if entry is None]
    if missing:
        result.problems.append(f"{len(missing)} source groups never enqueued (e.g. {missing[:3]})")
    extra = report.submitted - (len(expected) - len(missing))
    if extra:
        result.problems.append(f"{extra} unexpected source groups enqueued")
    if report.unmapped_commits:
        result.problems.append(f"{report.unmapped_commits} committed entries that no producer enqueued")
    if Counter(trained_entry_ids) != report.commits:
        result.problems.append("the trainer's own record of trained groups differs from the commits stream")
    return result
