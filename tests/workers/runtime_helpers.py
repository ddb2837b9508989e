"""Helpers for the worker-runtime tests: a private server, a runtime on a thread, a test trainer,
worker subprocesses, and reading who owns what in Redis.

It never changes queue state except through the public API (submit, lease, commit, reap), so the
tests see exactly what a real trainer and reaper would.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import threading
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from rollout_queue import CompletedGroup, QueueConfig, RolloutQueue, Sample, SourceGroup
from rollout_queue.core.codec import decode_partial
from rollout_queue.core.keys import QueueKeys
from rollout_queue.devtools.local_server import LocalServer
from tests.helpers import wait_until
from rollout_queue.workers.runtime import WorkerRuntime

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def worker_server() -> Iterator[LocalServer]:
    """One private server for a module of runtime tests.

    The runtime only uses the public client, which the contract suite already runs against every
    server kind; running these slower tests once (on the first kind asked for) keeps them short.
    """
    kind = os.environ.get("ROLLOUT_TEST_SERVERS", "").split(",")[0].strip() or None
    local = LocalServer(kind)
    try:
        yield local.start()
    finally:
        local.cleanup(graceful=False)


def open_queue(url: str, name: str, **config: Any) -> RolloutQueue:
    return RolloutQueue.from_url(url, name, QueueConfig(**config))


def submit(q: RolloutQueue, count: int, n: int, prefix: str = "g", **metadata: Any) -> list[str]:
    """``count`` arithmetic groups ``{prefix}-{i}`` ("What is i plus i?", answer 2i)."""
    return q.submit([SourceGroup(f"{prefix}-{i}", f"What is {i} plus {i}?", n, {"answer": 2 * i, **metadata})
                     for i in range(count)])


class RuntimeThread:
    """A WorkerRuntime running on its own event loop thread, as a worker process would run it."""

    def __init__(self, runtime: WorkerRuntime) -> None:
        self.runtime = runtime
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._main, name=f"runtime:{runtime.worker_id}", daemon=True)

    def _main(self) -> None:
        try:
            asyncio.run(self.runtime.run())
        except BaseException as exc:  # handed to the test through .error
            self.error = exc

    def start(self) -> "RuntimeThread":
        self._thread.start()
        def started() -> bool:
            beat = self.runtime.heartbeat
            return (beat is not None and beat.ready.is_set()) or not self._thread.is_alive()

        wait_until(started, 120, message="the runtime to start")  # vLLM on shared CPUs can take a minute
        return self

    def on_loop(self, fn: Any, *args: Any) -> None:
        """Run ``fn(*args)`` on the runtime's loop (engine state belongs to that loop)."""
        loop = self.runtime._loop
        assert loop is not None
        loop.call_soon_threadsafe(fn, *args)

    def join(self, timeout: float = 15.0) -> BaseException | None:
        self._thread.join(timeout)
        assert not self._thread.is_alive(), "the runtime did not stop"
        return self.error

    def drain(self, timeout: float = 15.0) -> BaseException | None:
        self.runtime.drain_threadsafe()
        return self.join(timeout)

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()


def train(q: RolloutQueue, expected: set[str], timeout: float = 30.0,
          step: Any = None) -> tuple[Counter[str], list[CompletedGroup]]:
    """A test trainer: lease and commit until every source id in ``expected`` was committed.

    Returns how many times each source id was committed and every group trained, in order.
    """
    committed: Counter[str] = Counter()
    trained: list[CompletedGroup] = []

    def one_lease() -> bool:
        lease = q.lease(max(1, min(4, len(expected - set(committed)))), block_ms=200, partial=True)
        if lease is not None:
            with lease:
                for g in lease.groups:
                    committed[g.group.source_id] += 1
                    trained.append(g)
            if step is not None:
                step(len(trained))
        return expected <= set(committed)

    wait_until(one_lease, timeout, interval=0, message=f"{len(expected)} groups trained")
    return committed, trained


def pel_owners(url: str, name: str) -> dict[str, int]:
    """PEL owner -> entries it owns (a worker id, or @ready, @done, @lease:...)."""
    client = redis.Redis.from_url(url)
    try:
        summary = client.xpending(QueueKeys(name)["src"], "rollout")
        return {c["name"].decode(): int(c["pending"]) for c in summary.get("consumers") or []}
    finally:
        client.close()


def saved_record(url: str, name: str, entry_id: str, n: int) -> dict[int, Sample]:
    """The progress record stored for ``entry_id`` of a group of ``n`` (by slot), {} when there is none."""
    client = redis.Redis.from_url(url)
    try:
        blob = client.hget(QueueKeys(name)["partial"], entry_id)
    finally:
        client.close()
    return {} if blob is None else decode_partial(blob, n)


def registered_workers(url: str, name: str) -> list[str]:
    client = redis.Redis.from_url(url)
    try:
        return [w.decode() for w in client.zrange(QueueKeys(name)["workers"], 0, -1)]
    finally:
        client.close()


def serving_workers(url: str, name: str) -> list[str]:
    """Workers whose heartbeat thread has beaten (a progress line): registered is not enough, since a
    worker registers before it loads its weights and subscribes to announcements, so a round opened
    between the two may pass it by."""
    client = redis.Redis.from_url(url)
    try:
        return [w.decode() for w in client.hkeys(QueueKeys(name)["progress"])]
    finally:
        client.close()


def spawn_worker(url: str, name: str, worker_id: str, *args: str,
                 env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    """``python -m rollout_queue.workers --engine scripted ...`` as a real process (stderr captured)."""
    cmd = [sys.executable, "-m", "rollout_queue.workers", "--url", url, "--queue", name, "--engine", "scripted",
           "--worker-id", worker_id, "--block-ms", "200", *args]
    env = {**os.environ, "PYTHONPATH": str(REPO), **(env or {})}
    return subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
