"""Coalescing one worker's completions: attempts that finish while a complete call is in flight are
sent together in the next ``complete_many``.

What it owns: turning concurrent ``complete(receipt, samples)`` awaits into as few script calls as
possible without holding any of them back. The first completion is sent at once; those that arrive
while that call runs wait for it, then go together (benchmarks/README.md P4: a batch costs ~2 Redis
commands per group instead of ~15). Each caller still gets its own outcome or its own exception
(StaleReceipt, PayloadTooLarge, MalformedCompletion, or the whole call's OutcomeUnknown), exactly as
from ``AsyncWorker.complete``, so one refused attempt never affects another.

It must not decide anything about an attempt (attempt.py's Settler does) or send an attempt whose
caller was cancelled before its batch left: ``close()`` requeues that one.
"""

from __future__ import annotations

import asyncio
from typing import Sequence

from rollout_queue import AsyncWorker, Receipt, Sample

Waiting = tuple[Receipt, Sequence[Sample], "asyncio.Future[str]"]


class BatchingWorker(AsyncWorker):
    """An AsyncWorker whose ``complete`` calls are coalesced into ``complete_many`` calls."""

    def __init__(self, worker: AsyncWorker) -> None:
        super().__init__(worker.queue, worker.worker_id)
        self._waiting: list[Waiting] = []
        self._sender: asyncio.Task[None] | None = None

    async def complete(self, receipt: Receipt, samples: Sequence[Sample]) -> str:
        """As AsyncWorker.complete; sent with whatever else is waiting when the previous call returns."""
        future: asyncio.Future[str] = asyncio.get_running_loop().create_future()
        self._waiting.append((receipt, samples, future))
        if self._sender is None or self._sender.done():
            # A task of its own: cancelling one attempt must not cancel the call its neighbours are in.
            self._sender = asyncio.create_task(self._send(), name=f"complete_many:{self.worker_id}")
        return await future

    async def _send(self) -> None:
        while self._waiting:
            batch = [w for w in self._waiting if not w[2].cancelled()]
            self._waiting = []
            if not batch:
                continue
            try:
                outcomes = await self.complete_many([(receipt, samples) for receipt, samples, _ in batch])
            except asyncio.CancelledError:
                for _, _, future in batch:
                    future.cancel()
                raise
            except Exception as exc:  # OutcomeUnknown, a script error: every attempt of the call gets it
                for _, _, future in batch:
                    if not future.done():
                        future.set_exception(exc)
                continue
            for (_, _, future), outcome in zip(batch, outcomes):
                if future.done():
                    continue  # its attempt was cancelled while the call ran: nobody reads the outcome
                if isinstance(outcome, Exception):
                    future.set_exception(outcome)
                else:
                    future.set_result(outcome)
