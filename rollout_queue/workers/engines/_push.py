"""The push an engine is receiving or holds staged (weights/push.py), shared by the engines.

Why: the trainer records a pushed version as soon as every member acked, and a member acks from
inside its receive, so the version's ``load_weights(uri)`` can arrive while the receive is still
handing its tensors over. ``take(uri)`` therefore waits for a receive of ``uri`` in flight; a
receive that failed (or one of another URI) yields nothing, and the engine loads the folder.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import Generic, TypeVar

from rollout_queue.core.errors import WeightsError

T = TypeVar("T")


class PushStage(Generic[T]):
    """At most one push: its URI and the task receiving (then holding) what it staged."""

    def __init__(self) -> None:
        self._uri: str | None = None
        self._task: asyncio.Future[T] | None = None

    async def receive(self, uri: str, receiving: Awaitable[T]) -> None:
        """Run ``receiving`` as the push of ``uri`` (replacing any other); raises what it raises."""
        task = asyncio.ensure_future(receiving)
        self._uri, self._task = uri, task
        await asyncio.shield(task)

    def holds(self, uri: str) -> bool:
        """Whether a push of ``uri`` is staged or being received (``take`` may still yield None if it fails)."""
        return self._task is not None and self._uri == uri

    async def take(self, uri: str) -> T | None:
        """What the push of ``uri`` staged, once its receive ended; None if there is none or it
        failed. The stage is empty afterwards, whatever the URI."""
        task, staged = self._task, self._uri
        self._uri = self._task = None
        if task is None or staged != uri:
            return None
        try:
            return await asyncio.shield(task)
        except WeightsError:
            return None
