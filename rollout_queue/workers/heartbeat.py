"""The worker's heartbeat thread: liveness on its own connection, and news of policy versions.

DESIGN, "Failure handling": the reaper requeues the work of a worker silent for
``worker_timeout_s``. A worker's event loop may be busy for seconds (a long CPU-bound step, a
blocking reward, vLLM start-up), so liveness must not depend on it: this thread opens its OWN
synchronous connection (``RolloutQueue.from_url``) and heartbeats every ``interval_s`` whatever the
loop is doing.

It also reports what each heartbeat reply says (policy version, weights URI, admission hold) and,
between beats, listens on the queue's versions channel (``rollout:{q}:versions``, payload
``<version>|<weights_uri>``) so a new policy version reaches the worker within milliseconds rather
than at the next beat; rounds of a weights push are announced there too (``push|<epoch>|<version>``). Reports go to ``on_notice`` (called on this thread: hand them to the loop
with ``call_soon_threadsafe``).

Rules: it never settles or reserves anything; it stops (and sends nothing more) once ``stop()``
returns, so a worker that deregistered is never re-registered by a late beat; a lost connection
is logged and retried at the next beat, never raised.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable

from redis.exceptions import RedisError

from rollout_queue import Progress, RetryPolicy, RolloutQueue, RolloutQueueError
from rollout_queue.ops.logs import fields

log = logging.getLogger("rollout_queue.workers.heartbeat")

#: Longest wait on the versions channel, so stop() returns quickly.
POLL_S = 0.2


@dataclass(frozen=True)
class PushNotice:
    """A round of a weights push opened (``push|<epoch>|<version>`` on the versions channel)."""

    epoch: int
    version: int


@dataclass(frozen=True)
class VersionNotice:
    """What the worker learned: the policy version and where its weights are (None: unknown);
    ``held`` is None when the news came from pub/sub (which says nothing about holds)."""

    version: int
    weights_uri: str | None
    held: bool | None = None
    published: bool = True


class HeartbeatThread:
    """Heartbeats ``worker_id`` every ``interval_s`` on its own connection until ``stop()``."""

    def __init__(self, url: str, queue: str, worker_id: str, interval_s: float,
                 on_notice: Callable[[VersionNotice | PushNotice], None], *, subscribe: bool = True, partitions: int = 1,
                 progress: Callable[[], Progress] | None = None) -> None:
        """``partitions``: the queue's partition count (a beat goes to every partition). ``progress``:
        read at each beat, the process's counts so far, stored for operators (`rollout-queue workers`)."""
        self.url, self.queue, self.worker_id, self.partitions = url, queue, worker_id, partitions
        self.progress = progress
        self.interval_s, self.on_notice, self.subscribe = interval_s, on_notice, subscribe
        self.beats = 0
        self.last_beat: float | None = None
        self._stop = threading.Event()
        self.ready = threading.Event()  # set after the first beat (and subscription) was attempted
        self._thread = threading.Thread(target=self._run, name=f"heartbeat:{worker_id}", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout_s: float = 5.0) -> None:
        """Stop beating; returns once the thread will send nothing more (or after ``timeout_s``)."""
        self._stop.set()
        if self._thread.is_alive() and threading.current_thread() is not self._thread:
            self._thread.join(timeout_s)

    def _run(self) -> None:
        q: RolloutQueue | None = None
        pubsub: Any = None
        try:
            next_beat = 0.0
            while not self._stop.is_set():
                if time.monotonic() >= next_beat:
                    q = q or self._open()
                    if q is not None:
                        # Subscribe before beating: the beat's reply covers whatever was announced
                        # before the subscription, so no version can fall between the two.
                        if self.subscribe and pubsub is None:
                            pubsub = self._subscribe(q)
                        self._beat(q)
                    self.ready.set()
                    next_beat = time.monotonic() + self.interval_s
                wait = max(0.0, min(POLL_S, next_beat - time.monotonic()))
                pubsub = self._listen(pubsub, wait)
        finally:
            if pubsub is not None:
                pubsub.close()
            if q is not None:
                q.close()

    def _open(self) -> RolloutQueue | None:
        try:
            # A short retry window: a beat that cannot get through is retried at the next one.
            # create=False: the runtime opened the queue already; a beat must never recreate a deleted one.
            return RolloutQueue.from_url(self.url, self.queue, partitions=self.partitions, create=False,
                                         retry=RetryPolicy(window_s=max(0.5, self.interval_s)))
        except (RolloutQueueError, RedisError, OSError) as exc:
            self._warn("cannot connect for heartbeats; retrying at the next beat", exc)
            return None

    def _beat(self, q: RolloutQueue) -> None:
        try:
            info = q.worker(self.worker_id).heartbeat(None if self.progress is None else self.progress())
        except (RolloutQueueError, RedisError, OSError) as exc:
            self._warn("heartbeat failed; retrying at the next beat", exc)
            return
        if self._stop.is_set():
            return  # stop() raced this beat: report nothing to a worker that is shutting down
        self.beats += 1
        self.last_beat = time.monotonic()
        self.on_notice(VersionNotice(info.version, info.weights_uri or None, info.held, info.version_published))

    def _warn(self, message: str, exc: BaseException) -> None:
        log.warning(message, extra=fields(queue=self.queue, worker=self.worker_id, error=str(exc)))

    def _subscribe(self, q: RolloutQueue) -> Any:
        try:
            pubsub = q.client.pubsub(ignore_subscribe_messages=True)
            # publish_version announces on every partition's channel: the first partition's hears each.
            pubsub.subscribe(q.layout.keys[0].versions_channel)
            return pubsub
        except (RedisError, OSError) as exc:
            self._warn("cannot subscribe to policy versions; relying on heartbeats", exc)
            return None

    def _listen(self, pubsub: Any, wait_s: float) -> Any:
        """Wait up to ``wait_s`` for a version announcement; returns the pubsub (None if broken)."""
        if pubsub is None:
            self._stop.wait(wait_s)
            return None
        try:
            message = pubsub.get_message(timeout=wait_s)
        except (RedisError, OSError) as exc:
            self._warn("versions channel lost; resubscribing at the next beat", exc)
            pubsub.close()
            return None
        if message and message.get("type") == "message" and not self._stop.is_set():
            notice = parse_announcement(message["data"])
            if notice is not None:
                self.on_notice(notice)
        return pubsub


def parse_announcement(data: bytes | str) -> VersionNotice | PushNotice | None:
    """``b"<version>|<weights_uri>"`` -> VersionNotice, ``b"push|<epoch>|<version>"`` -> PushNotice;
    None for anything else (logged)."""
    text = data.decode(errors="replace") if isinstance(data, bytes) else str(data)
    if text.startswith("push|"):
        _, epoch, pushed = (text.split("|") + ["", ""])[:3]
        if epoch.isdigit() and pushed.isdigit():
            return PushNotice(int(epoch), int(pushed))
        log.warning("ignoring a malformed push announcement", extra=fields(payload=text[:200]))
        return None
    version, sep, uri = text.partition("|")
    if not sep or not version.isdigit():
        log.warning("ignoring a malformed version announcement", extra=fields(payload=text[:200]))
        return None
    return VersionNotice(int(version), uri or None)
