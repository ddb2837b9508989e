"""Taking part in weights pushes: join each announced round, receive, stage (weights/push.py).

Why apart from ``versions.py``: receiving a push changes nothing the worker generates with. The
tensors are only staged by the engine; the version is applied by ``PolicyVersions`` when the queue
records it (``publish_version``), exactly like a folder version, and its ``load_weights(uri)``
finds them staged. So a failed, late or missed round costs nothing but the push: the version
then loads from its folder.

Rules: a round is joined only for a version newer than the one loaded (so the retry round of a
version reaches only the members that missed it); one round is received at a time; a worker that
starts while a round is joinable joins it (``join_push(0)``); a failed round is logged and counted,
never fatal.
"""

from __future__ import annotations

import asyncio
import time
from typing import Awaitable, Callable

from rollout_queue.core.errors import RolloutQueueError, WeightsError
from rollout_queue.core.models import PushTicket
from rollout_queue.workers.attempt import RuntimeStats
from rollout_queue.workers.engines.base import Engine
from rollout_queue.workers.events import Observer, PushMissed, WeightsPushed
from rollout_queue.workers.heartbeat import PushNotice

#: join_push(epoch, newer_than): the lead queue worker's.
Join = Callable[[int, int], Awaitable[PushTicket | None]]


class PushFollower:
    """Joins the rounds announced for versions newer than ``loaded()``."""

    def __init__(self, engine: Engine, join: Join, loaded: Callable[[], int], stats: RuntimeStats,
                 emit: Observer) -> None:
        self.engine, self.join, self.loaded, self.stats, self.emit = engine, join, loaded, stats, emit
        self.received = 0  # the newest version staged
        self._announced: tuple[int, int] = (0, 0)  # (epoch, version) of the newest round announced
        self._wanted = asyncio.Event()

    def notice(self, notice: PushNotice) -> None:
        if notice.epoch > self._announced[0]:
            self._announced = (notice.epoch, notice.version)
            self._wanted.set()

    async def run(self) -> None:
        """Until cancelled: the round joinable at start, then every round announced."""
        await self._take(0)
        while True:
            await self._wanted.wait()
            self._wanted.clear()
            epoch, version = self._announced
            if version > max(self.loaded(), self.received):
                await self._take(epoch)

    async def _take(self, epoch: int) -> None:
        # Only for a version newer than this worker holds (a retry round's version it has is not
        # joined): a member must take part, the round waits for it.
        try:
            ticket = await self.join(epoch, max(self.loaded(), self.received))
        except RolloutQueueError as exc:  # Redis away past the retry window: the folder will do
            self.stats.pushes_missed += 1
            self.emit(PushMissed(self._announced[1], epoch, f"could not join: {exc}"))
            return
        if ticket is None:
            return
        began = time.monotonic()
        try:
            await self.engine.receive_push(ticket)
        except WeightsError as exc:
            self.stats.pushes_missed += 1
            self.emit(PushMissed(ticket.version, ticket.epoch, str(exc)))
            return
        self.received = ticket.version
        self.stats.pushes_received += 1
        self.emit(WeightsPushed(ticket.version, ticket.epoch, ticket.rank, round(time.monotonic() - began, 3)))
