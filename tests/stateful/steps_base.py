"""What every group of machine steps shares: the queue under test, its raw Redis, the model, and
the helpers that read the server clock and prove that a call wrote nothing.

This module owns those helpers only. The steps live in worker_steps.py and trainer_steps.py, the
rule and the invariants in ledger_machine.py.
"""

from __future__ import annotations

from typing import Any, Callable

import redis

from rollout_queue import Hold, ReapReport, RolloutQueue
from rollout_queue.core.keys import QueueKeys
from rollout_queue.devtools.local_server import LocalServer
from tests.helpers import wait_until

from .ledger_model import LedgerModel
from .redis_truth import snapshot

WORKERS = ("gpu-a", "gpu-b", "gpu-c")


class Steps:
    """The state the step mixins read; LedgerMachine sets it up for each example. Steps may call
    each other across the mixins (a silent worker is noticed by the next lease, say)."""

    server: LocalServer
    q: RolloutQueue
    raw: redis.Redis
    model: LedgerModel
    holds: dict[str, Hold]   # the client's handle of each hold the model knows
    restarts: int
    ranks: bool = False      # torch.distributed is set up (a world of one rank): RankedStream steps run

    @property
    def keys(self) -> QueueKeys:
        return self.q.keys

    def server_ms(self) -> int:
        sec, usec = self.raw.time()
        return sec * 1000 + usec // 1000

    def reap_pass(self) -> ReapReport:
        """q.reap(), once the server clock has moved past the 1 ms settled_retention_s of a pruning
        example, so that every group settled by an earlier step is due (the model prunes them all)."""
        if self.model.prunes_at_reap:
            start = self.server_ms()
            wait_until(lambda: self.server_ms() > start + 1, timeout=5.0, interval=0.001,
                       message="the server clock past the retention")
        return self.q.reap()

    def check_reap(self, expected: ReapReport) -> None:
        got = self.reap_pass()
        assert got == expected, f"reap {got} != model {expected}"

    def unchanged(self, call: Callable[[], Any]) -> Any:
        """Run ``call`` and assert that no key of the queue changed (refusals and replays)."""
        before = snapshot(self.raw, self.keys)
        try:
            return call()
        finally:
            assert snapshot(self.raw, self.keys) == before, "a refused or replayed call wrote to Redis"
