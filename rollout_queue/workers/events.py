"""What the worker runtime reports: one frozen type per kind of event, carrying its own fields.

Why typed events: the runtime's story (started, reserved, settled, drained, closed) used to exist
only as log message strings. Here each kind is a value an observer can match on (a test, a
metrics hook) and the log line is derived from it, so the two never disagree. Every event is
logged once by ``log_event``, with its type name in the ``event`` field of the structured log.

Rules: an event is a fact that already happened; it never asks for anything, and an observer
must not change the runtime's state (it runs on the worker's event loop, inline, so it must also
be quick). Messages are the ones operators already grep for ("worker closed", "aborted", ...).
"""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass
from typing import Any, Callable, ClassVar

from rollout_queue import Receipt
from rollout_queue.ops.logs import fields
from rollout_queue.workers.states import RuntimeState
from rollout_queue.workers.verdicts import Verdict

log = logging.getLogger("rollout_queue.workers.runtime")


@dataclass(frozen=True)
class Event:
    """Base: ``message`` and ``level`` say how it is logged; its dataclass fields are the log fields."""

    message: ClassVar[str]
    level: ClassVar[int] = logging.INFO

    def log_level(self) -> int:
        return self.level

    def log_message(self) -> str:
        return self.message

    def log_fields(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}

    def error(self) -> BaseException | None:
        """The exception a log line prints with its traceback (None: none)."""
        return None


Observer = Callable[[Event], None]


@dataclass(frozen=True)
class _AboutAttempt(Event):
    """An event about one attempt: logged as ``entry`` and ``attempt``, like every attempt line."""

    receipt: Receipt

    def log_fields(self) -> dict[str, Any]:
        out = {"entry": self.receipt.entry_id, "attempt": self.receipt.attempt, **super().log_fields()}
        del out["receipt"]
        return out


@dataclass(frozen=True)
class _Fatal(Event):
    """An event that carries the exception behind it."""

    cause: BaseException

    def log_fields(self) -> dict[str, Any]:
        return {}

    def error(self) -> BaseException:
        return self.cause


# -- life cycle -----------------------------------------------------------------------------------

@dataclass(frozen=True)
class StateChanged(Event):
    previous: RuntimeState
    state: RuntimeState
    message: ClassVar[str] = "state changed"
    level: ClassVar[int] = logging.DEBUG

    def log_fields(self) -> dict[str, Any]:
        return {"previous": self.previous.value, "state": self.state.value}


@dataclass(frozen=True)
class WaitingForQueue(Event):
    """The queue does not exist yet: the worker waits for its trainer to create it (logged once)."""

    missing: str
    wait_s: float
    message: ClassVar[str] = ("queue does not exist yet: waiting for the process that creates it (the trainer, or "
                              "one given --create); check --queue and --url if it never comes")
    level: ClassVar[int] = logging.WARNING


@dataclass(frozen=True)
class WorkerStarted(Event):
    policy: str
    version: int
    message: ClassVar[str] = "worker started"


@dataclass(frozen=True)
class DrainRequested(Event):
    timeout_s: float
    message: ClassVar[str] = "draining"


@dataclass(frozen=True)
class DrainHurried(Event):
    """A second drain request: the rest of the drain timeout is skipped."""

    message: ClassVar[str] = "drain hurried: aborting what is left"


@dataclass(frozen=True)
class DrainDeadline(Event):
    attempts: int
    message: ClassVar[str] = "drain deadline: aborting attempts"


@dataclass(frozen=True)
class FatalError(_Fatal):
    message: ClassVar[str] = "fatal error: stopping, requeueing owned work"
    level: ClassVar[int] = logging.ERROR


@dataclass(frozen=True)
class CloseFailed(_Fatal):
    message: ClassVar[str] = "could not return owned work; the reaper will requeue it"
    level: ClassVar[int] = logging.ERROR


@dataclass(frozen=True)
class WorkerClosed(Event):
    """The worker returned its work and deregistered. ``generated``: RuntimeStats.generated at close,
    the tokens its engine produced by how their attempts ended, logged as ``tokens_<ending>`` (what a
    benchmark adds up to compare generated with trained tokens: scripts/bench_waste.py)."""

    terminal: str
    requeued: int
    dead: int
    reconciled: int
    settled: tuple[tuple[str, int], ...]  # RuntimeStats.settled at close, as pairs
    generated: tuple[tuple[str, int], ...] = ()  # RuntimeStats.generated at close, as pairs
    message: ClassVar[str] = "worker closed"

    def log_fields(self) -> dict[str, Any]:
        return {"terminal": self.terminal, "requeued": self.requeued, "dead": self.dead,
                "reconciled": self.reconciled, **dict(self.settled),
                **{f"tokens_{ending}": tokens for ending, tokens in self.generated}}


@dataclass(frozen=True)
class EngineCloseFailed(_Fatal):
    message: ClassVar[str] = "engine close failed"
    level: ClassVar[int] = logging.WARNING


# -- attempts -------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Reserved(_AboutAttempt):
    n: int
    version: int
    message: ClassVar[str] = "reserved"
    level: ClassVar[int] = logging.DEBUG


@dataclass(frozen=True)
class Settled(_AboutAttempt):
    """The attempt ended by receipt; the verdict says how (its ``counter`` is the message)."""

    verdict: Verdict
    outcome: str
    message: ClassVar[str] = "settled"

    def log_level(self) -> int:
        return self.verdict.log_level

    def log_message(self) -> str:
        return self.verdict.counter

    def log_fields(self) -> dict[str, Any]:
        return {"entry": self.receipt.entry_id, "attempt": self.receipt.attempt, "outcome": self.outcome,
                **self.verdict.log_fields()}


@dataclass(frozen=True)
class StaleSettlement(_AboutAttempt):
    """The reaper gave the attempt away while we were slow: our result is dropped, never written."""

    detail: str
    message: ClassVar[str] = "stale receipt: result dropped"
    level: ClassVar[int] = logging.WARNING


@dataclass(frozen=True)
class ProgressSaved(_AboutAttempt):
    """A periodic save recorded the attempt's samples so far (``save_partial``)."""

    tokens: int
    outcome: str
    message: ClassVar[str] = "progress saved"
    level: ClassVar[int] = logging.DEBUG


@dataclass(frozen=True)
class ProgressNotSaved(_AboutAttempt):
    """A periodic save wrote nothing: the record is over ``max_partial_bytes`` (this attempt saves no
    more; ``rollout-queue config set max_partial_bytes=N`` raises the bound) or Redis did not answer
    (tried again at the next interval). The attempt itself goes on either way."""

    detail: str
    message: ClassVar[str] = "progress not saved"
    level: ClassVar[int] = logging.WARNING


@dataclass(frozen=True)
class CompletionRefused(_AboutAttempt):
    """The complete script ended the attempt malformed (and requeued the group)."""

    detail: str
    message: ClassVar[str] = "completion refused as malformed"
    level: ClassVar[int] = logging.ERROR


# -- policy versions ------------------------------------------------------------------------------

@dataclass(frozen=True)
class HoldChanged(Event):
    held: bool
    message: ClassVar[str] = "admission hold"

    def log_message(self) -> str:
        return "admission hold " + ("active" if self.held else "released")

    def log_fields(self) -> dict[str, Any]:
        return {}


@dataclass(frozen=True)
class WeightsUpdated(Event):
    version: int
    weights_uri: str | None
    mode: str
    message: ClassVar[str] = "weights updated"


@dataclass(frozen=True)
class WeightsPushed(Event):
    """A pushed version was received and staged; it is applied when the queue records it."""

    version: int
    epoch: int
    rank: int
    seconds: float
    message: ClassVar[str] = "weights received by push"


@dataclass(frozen=True)
class PushMissed(Event):
    """A push round this worker joined failed for it: the version will load from its folder."""

    version: int
    epoch: int
    reason: str
    message: ClassVar[str] = "weights push missed, the folder will be loaded"
    level: ClassVar[int] = logging.WARNING


@dataclass(frozen=True)
class WeightsRefused(Event):
    """A version's weights were refused before anything was applied: the engine keeps generating
    on ``loaded`` (its samples say so) and the load is retried at the next notice or after a pause."""

    version: int
    weights_uri: str | None
    loaded: int
    reason: str
    message: ClassVar[str] = "weights refused, still generating on the loaded version"
    level: ClassVar[int] = logging.WARNING


@dataclass(frozen=True)
class StartedBehind(WeightsRefused):
    """A refusal at start: the queue's version ``version`` was refused before anything was applied
    (most often its folder is not written yet: ``transport="dist"`` records a version before it
    writes it). The worker serves ``loaded`` instead: the newest older version beside it that loaded
    (``loaded_uri``), or 0, the weights it started with (``loaded_uri`` None); it retries every
    ``retry_s`` seconds until that version or a newer one loads."""

    loaded_uri: str | None
    retry_s: float
    message: ClassVar[str] = "started behind the queue's version: its weights do not load yet, waiting for them"
    level: ClassVar[int] = logging.WARNING


@dataclass(frozen=True)
class AdoptedWithoutWeights(Event):
    version: int
    message: ClassVar[str] = "version published without weights_uri: adopted without loading"
    level: ClassVar[int] = logging.WARNING


def log_event(event: Event, base: dict[str, Any]) -> None:
    """Log ``event`` at its level; ``base``: the worker's own fields (queue, worker)."""
    level = event.log_level()
    if not log.isEnabledFor(level):
        return
    log.log(level, event.log_message(), exc_info=event.error(),
            extra=fields(**base, event=type(event).__name__, **event.log_fields()))
