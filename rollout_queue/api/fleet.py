"""FleetReserver: one worker process serving several queues by weight (scale/fleet.py has the rule).

``FleetReserver({"run-a": qa.worker(id), "run-b": qb.worker(id)}, {"run-a": 3, "run-b": 1})``:
``reserve`` returns ``[(queue name, Reservation), ...]``; settle each through ``workers[name]``.
The queues may sit on different connections: the plan's steps are calls of each queue's own
worker, composed with ``run_calls``, so the same class serves sync and asyncio workers.
"""

from __future__ import annotations

import time
from typing import Callable, Mapping, TypeVar

from rollout_queue.api.results import Calls, Result, run_calls
from rollout_queue.api.worker import Worker
from rollout_queue.core.errors import InvalidInput
from rollout_queue.core.models import HeartbeatInfo, Progress, Reservation
from rollout_queue.scale.fleet import WeightedShare, plan_reserve

V = TypeVar("V")


class FleetReserver:
    """Reserve from several queues' workers in proportion to ``weights`` (any positive scale)."""

    is_async: bool
    names: list[str]
    workers: dict[str, Worker]
    share: WeightedShare
    clock: Callable[[], float]

    def __init__(self, workers: Mapping[str, Worker], weights: Mapping[str, float], quantum_samples: int = 0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        if set(workers) != set(weights):
            raise InvalidInput(f"workers {sorted(workers)} and weights {sorted(weights)} must name the same queues")
        kinds = {w.queue.driver.is_async for w in workers.values()}
        if len(kinds) != 1:
            raise InvalidInput("a fleet's workers must all be sync or all asyncio")
        self.is_async = kinds.pop()
        self.names = list(workers)
        self.workers = dict(workers)
        self.share = WeightedShare([weights[n] for n in self.names], quantum_samples)
        self.clock = clock

    def reserve(self, max_groups: int = 1, block_ms: int = 0, max_samples: int = 0,
                overcommit: bool = False) -> Result[list[tuple[str, Reservation]]]:
        """Up to ``max_groups`` groups over the queues in weighted proportion (see scale/fleet.py)."""
        return run_calls(self._reserve(max_groups, block_ms, max_samples, overcommit), self.is_async)

    def _reserve(self, max_groups: int, block_ms: int, max_samples: int,
                 overcommit: bool) -> Calls[list[tuple[str, Reservation]]]:
        plan = plan_reserve(self.share, max_groups, max_samples, block_ms, self.clock)
        got: list[Reservation] | None = None
        while True:
            try:
                k, groups, samples, block = plan.send(got)  # type: ignore[arg-type]
            except StopIteration as stop:
                return [(self.names[k], r) for k, r in stop.value]
            worker = self.workers[self.names[k]]
            got = yield lambda: worker.reserve(groups, block_ms=block, max_samples=samples, overcommit=overcommit)

    def heartbeat(self, progress: Progress | None = None) -> Result[dict[str, HeartbeatInfo]]:
        """Each queue's heartbeat: its own policy version and weights (``progress`` goes to each)."""
        return run_calls(self._each(lambda w: w.heartbeat(progress)), self.is_async)

    def close(self, terminal: str = "aborted", reason: str = "worker closed") -> Result[dict[str, tuple[int, int]]]:
        """Close the worker on every queue: {queue: (requeued, dead-lettered)}."""
        return run_calls(self._each(lambda w: w.close(terminal, reason)), self.is_async)

    def _each(self, call: Callable[[Worker], Result[V]]) -> Calls[dict[str, V]]:
        out: dict[str, V] = {}
        for name in self.names:
            worker = self.workers[name]
            out[name] = yield lambda: call(worker)
        return out
