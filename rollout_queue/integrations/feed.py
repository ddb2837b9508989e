"""A dataset fed into the queue from inside a trainer process, through the exactly-once producer.

A framework that owns its dataset (TRL's ``train_dataset``, say) hands it to the queue here instead
of to its own sampler: the producer's cursor lives in Redis, so a trainer killed and resumed goes
on where the queue says, never enqueueing a record twice for one epoch (rl/producer.py). The feed
runs the producer in a daemon thread bounded by ``max_backlog``, and reports when it is done or
failed, so the trainer's stream fails fast instead of waiting for groups that will never come.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence

from rollout_queue.api.queue import RolloutQueue
from rollout_queue.rl.producer import DatasetRecords, ProducePlan, ProduceReport, run_producer

log = logging.getLogger("rollout_queue.integrations.feed")

__all__ = ["DatasetFeed"]


class DatasetFeed:
    """``records`` -> ``queue`` under ``plan``, in a background thread (start/stop/done/error)."""

    def __init__(self, queue: RolloutQueue, records: DatasetRecords, plan: ProducePlan, *, max_backlog: int = 0,
                 tokenize: Callable[[str], Sequence[int]] | None = None) -> None:
        self.queue, self.records, self.plan = queue, records, plan
        self.max_backlog, self.tokenize = max_backlog, tokenize
        self.report: ProduceReport | None = None
        self.error: BaseException | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> "DatasetFeed":
        self._thread = threading.Thread(target=self._run, name=f"feed-{self.plan.name}", daemon=True)
        self._thread.start()
        return self

    def _run(self) -> None:
        try:
            self.report = run_producer(self.queue, self.records, self.plan, max_backlog=self.max_backlog,
                                       stop=self._stop, tokenize=self.tokenize, on_progress=self._progress)
        except BaseException as exc:  # surfaced to the trainer by check(): a thread must not die silently
            log.error("the feed stopped on an error", exc_info=exc)
            self.error = exc

    def _progress(self, report: ProduceReport) -> None:
        self.report = report

    @property
    def done(self) -> bool:
        """True once the whole plan is in the queue (or the feed failed: check() raises then)."""
        return self.error is not None or bool(self.report and self.report.done)

    def check(self) -> None:
        """Raise the producer's error, if it failed (ProducerConflict, GroupTooLarge, ...)."""
        if self.error is not None:
            raise self.error

    def exhausted(self) -> bool:
        """The stream's ``exhausted`` hook: raises the feed's error, else whether it is done."""
        self.check()
        return self.done

    def stop(self, timeout_s: float = 10.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout_s)
