"""Following the queue's policy version: what the engine has loaded, what the queue wants, the hold.

Why apart from the runtime's life cycle (``states.py``): a weight update may happen while the
worker runs or drains, and an admission hold changes nothing the worker does (``reserve`` simply
grants nothing), so neither is a state of the worker. This module owns:

- ``adopt``: at start, take the queue's current version, loading its weights if it names them;
  when the engine refuses them, start on the newest older version beside them that loads (or on
  the weights the engine started with, version 0) and let ``follow`` retry (``StartedBehind``).
- ``notice``: what the heartbeat thread learned (handed to the loop); a newer published version
  wakes ``follow``.
- ``follow``: load each newer version with ``engine.load_weights(weights_uri)``. ``ready`` is
  cleared meanwhile, so no attempt starts generating on half-loaded weights; in ``abort`` mode the
  attempts still generating are aborted first, in ``continue`` mode every request in flight
  records that it also ran under the new version (``track``).

A version whose weights the engine refuses before applying anything (``WeightsError``: a folder
missing, not written yet, truncated, overwritten, pruned, of another model) is not fatal, at start
as later: the engine still holds ``loaded``, so the worker keeps generating on it (its samples say
so; the staleness bound judges them) and retries every ``retry_s`` until that version or a newer
one loads.

It must not reserve, settle, or decide whether any other failed load is fatal: ``follow`` raises
and the runtime decides (such a load leaves the engine's weights unknown, so it stops the worker).
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Awaitable, Callable, Literal

from rollout_queue import HeartbeatInfo
from rollout_queue.workers.attempt import RuntimeStats
from rollout_queue.workers.engines.base import Engine
from rollout_queue.core.errors import WeightsError
from rollout_queue.weights.fetch import older_versions
from rollout_queue.workers.events import (
    AdoptedWithoutWeights,
    HoldChanged,
    Observer,
    StartedBehind,
    WeightsRefused,
    WeightsUpdated,
)
from rollout_queue.workers.heartbeat import VersionNotice

#: continue (the default, WorkerOptions): in-flight attempts go on, their KV recomputed on the new
#: weights (vLLM); keep-kv: they go on over the KV already computed (vLLM keeps it; the torch engine
#: always does). Both record every version a sample ran under. abort: in-flight attempts are
#: aborted at an update (requeued uncounted), their generation so far thrown away.
WeightsMode = Literal["abort", "continue", "keep-kv"]

#: Seconds between tries of a refused version (a folder may appear late on a network filesystem).
RETRY_S = 5.0


class PolicyVersions:
    """The loaded and the wanted policy version of one worker's engine, and the admission hold."""

    def __init__(self, engine: Engine, mode: WeightsMode, stats: RuntimeStats, emit: Observer, *,
                 retry_s: float = RETRY_S) -> None:
        self.engine, self.mode, self.stats, self.emit, self.retry_s = engine, mode, stats, emit, retry_s
        self.refused = False  # the target version was refused: retry after retry_s
        self.loaded = 0
        self.held: bool | None = None  # None until a heartbeat reply said
        self.ready = asyncio.Event()  # cleared while weights load
        self.ready.set()
        self._target: tuple[int, str | None] = (0, None)
        self._wanted = asyncio.Event()
        self._seen: dict[str, list[int]] = {}  # request id in flight -> versions it ran under

    async def adopt(self, info: HeartbeatInfo, *, load: bool) -> None:
        """Take the queue's current version at start, loading its weights if it names them (and
        ``load``). Refused weights (module docstring) leave the worker on the newest older version
        beside them that loads, or on version 0 (the weights it started with), and ``follow``
        retries them. Raises what a load raises otherwise (the engine's weights are then unknown)."""
        self._target = (info.version, info.weights_uri or None)
        self.loaded = info.version
        if not (info.version_published and info.weights_uri and load):
            return
        try:
            await self.engine.load_weights(info.weights_uri)
            return
        except WeightsError as exc:
            reason = str(exc)
        self.loaded, self.refused, loaded_uri = 0, True, None
        self.stats.weight_refusals += 1
        for version, uri in await asyncio.to_thread(older_versions, info.weights_uri, info.version):
            try:
                await self.engine.load_weights(uri)
            except WeightsError:
                continue  # pruned meanwhile, or broken too: an older one may load
            self.loaded, loaded_uri = version, uri
            break
        self.emit(StartedBehind(info.version, info.weights_uri, self.loaded, reason, loaded_uri, self.retry_s))

    def notice(self, notice: VersionNotice) -> None:
        if notice.held is not None and notice.held != self.held:
            if notice.held or self.held is not None:  # the first "not held" is no news
                self.emit(HoldChanged(notice.held))
            self.held = notice.held
        if notice.published and notice.version > self._target[0]:
            self._target = (notice.version, notice.weights_uri)
            self._wanted.set()

    def track(self, request_id: str) -> list[int]:
        """Start recording the versions ``request_id`` runs under; the list grows at each update."""
        seen = self._seen[request_id] = [self.loaded]
        return seen

    def untrack(self, request_id: str) -> None:
        del self._seen[request_id]

    @contextmanager
    def request(self, request_id: str, rids: set[str]) -> Iterator[list[int]]:
        """One engine request of an attempt: its versions tracked and its id in ``rids`` (what an abort
        aborts) while the block runs; yields the growing list of versions it ran under."""
        seen = self.track(request_id)
        rids.add(request_id)
        try:
            yield seen
        finally:
            self.untrack(request_id)
            rids.discard(request_id)

    async def follow(self, abort_generating: Callable[[str], Awaitable[None]]) -> None:
        """Load every newer version noticed, until cancelled. Raises what a load raises."""
        while True:
            try:
                await asyncio.wait_for(self._wanted.wait(), self.retry_s if self.refused else None)
            except asyncio.TimeoutError:
                pass  # retry the refused version
            self._wanted.clear()
            version, uri = self._target
            if version > self.loaded:
                await self._update(version, uri, abort_generating)

    def _refuse(self, version: int, uri: str, exc: WeightsError) -> None:
        self.refused = True
        self.stats.weight_refusals += 1
        self.emit(WeightsRefused(version, uri, self.loaded, str(exc)))

    async def _update(self, version: int, uri: str | None, abort_generating: Callable[[str], Awaitable[None]]) -> None:
        if self.mode == "abort" and self.refused and uri:
            # Refused before (its folder not written yet, say): while it still would be, abort
            # nothing and keep reserving; only a version that now passes the check costs requests.
            try:
                await self.engine.check_weights(uri)
            except WeightsError as exc:
                return self._refuse(version, uri, exc)
        self.ready.clear()
        try:
            if self.mode == "abort":
                await abort_generating(f"weight update to version {version}")
            moved: bool | None = True
            if uri:
                try:
                    moved = await self.engine.load_weights(uri)
                except WeightsError as exc:  # nothing applied: serve on the loaded version
                    return self._refuse(version, uri, exc)
            else:
                self.emit(AdoptedWithoutWeights(version))
            self.loaded, self.refused = version, False
            if moved is not False:  # requests in flight ran under this version too (not LoRA's in vLLM)
                for seen in self._seen.values():
                    seen.append(version)
            self.stats.weight_updates += 1
            self.emit(WeightsUpdated(version, uri, self.mode))
        finally:
            self.ready.set()
