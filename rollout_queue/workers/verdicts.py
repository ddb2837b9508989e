"""How an attempt ends: one frozen type per verdict, each naming the one facade call that settles it.

Why types and not verb strings: the settler used to run ``getattr(worker, verb)(receipt, arg)``,
so a misspelt verb or an argument of the wrong kind (samples where a reason belongs) was found only
when that line ran. Here each verdict carries exactly its own fields and its ``send`` is an
ordinary method call on the worker facade, so the four settlements can be read (and type-checked)
side by side.

It owns nothing else: no retries, no logging, no decision about which verdict applies (that is
``attempt.Settler``). The facade calls are exactly ``complete``/``filter``/``fail``/``abort`` with
their existing signatures.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from collections.abc import Awaitable, Sequence
from typing import Any, ClassVar, Protocol

from rollout_queue import Receipt, Sample


class Settles(Protocol):
    """What a verdict is sent to: the four settling calls of the asyncio worker facade (AsyncWorker),
    which ServedQueues (served.py) also offers, routing each receipt to the queue it came from. A
    Protocol, not ``AsyncWorker | ServedQueues``, so the settler types whichever it is given."""

    def complete(self, receipt: Receipt, samples: Sequence[Sample]) -> Awaitable[str]: ...

    def filter(self, receipt: Receipt, reason: str, tokens: int = 0) -> Awaitable[str]: ...

    def fail(self, receipt: Receipt, reason: str) -> Awaitable[str]: ...

    def abort(self, receipt: Receipt, reason: str = "aborted", progress: Sequence[Sample] = (),
              discarded: int = 0) -> Awaitable[str]: ...


@dataclass(frozen=True)
class Verdict:
    """Base of the four verdicts. ``counter``: the ``RuntimeStats.settled`` key and the log message."""

    counter: ClassVar[str]
    log_level: ClassVar[int] = logging.WARNING

    def log_fields(self) -> dict[str, Any]:
        """What a log line shows of the verdict (never the samples)."""
        return {}

    async def send(self, worker: Settles, receipt: Receipt) -> str:
        """Settle ``receipt`` on ``worker``; returns the script's outcome word."""
        raise NotImplementedError


@dataclass(frozen=True)
class Complete(Verdict):
    """The samples go to the buffer for training."""

    samples: tuple[Sample, ...]
    counter: ClassVar[str] = "completed"
    log_level: ClassVar[int] = logging.DEBUG

    async def send(self, worker: Settles, receipt: Receipt) -> str:
        return await worker.complete(receipt, list(self.samples))


@dataclass(frozen=True)
class _Explained(Verdict):
    """A verdict that settles with a reason, kept on the terminal record."""

    reason: str

    def log_fields(self) -> dict[str, Any]:
        return {"reason": self.reason[:200]}


@dataclass(frozen=True)
class Filter(_Explained):
    """The group scored but the filter rejected it (for example, every reward equal)."""

    counter: ClassVar[str] = "filtered"
    log_level: ClassVar[int] = logging.DEBUG
    #: The tokens generated for the group, counted as the queue's waste (counters.tokens_filtered).
    tokens: int = 0

    async def send(self, worker: Settles, receipt: Receipt) -> str:
        return await worker.filter(receipt, self.reason, self.tokens)


@dataclass(frozen=True)
class Fail(_Explained):
    """A request or the reward failed: counted against the group's attempts."""

    counter: ClassVar[str] = "failed"

    async def send(self, worker: Settles, receipt: Receipt) -> str:
        return await worker.fail(receipt, self.reason)


@dataclass(frozen=True)
class Abort(_Explained):
    """Back to ready, not counted: a weight update, a drain, or the worker stopping. ``progress``: the
    samples so far, kept in the same call for the next attempt to continue (partial rollouts).
    ``discarded``: with no progress kept, the tokens the attempt generated, counted as the queue's
    waste (counters.tokens_aborted; the settler fills it in from the attempt)."""

    progress: tuple[Sample, ...] = ()
    discarded: int = 0
    counter: ClassVar[str] = "aborted"

    def log_fields(self) -> dict[str, Any]:
        tokens = sum(len(s.token_ids) for s in self.progress)
        return {**super().log_fields(), **({"progress_tokens": tokens} if tokens else {})}

    async def send(self, worker: Settles, receipt: Receipt) -> str:
        if self.progress:
            return await worker.abort(receipt, self.reason, progress=list(self.progress))
        return await worker.abort(receipt, self.reason, discarded=self.discarded)


#: Every verdict type; RuntimeStats counts one key per entry (plus "stale").
VERDICTS: tuple[type[Verdict], ...] = (Complete, Filter, Fail, Abort)
