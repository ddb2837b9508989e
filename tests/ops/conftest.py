"""Fixtures of the operator-tool tests: a queue in a known state with one entry in every state, and an
in-process runner of the ``rollout-queue`` CLI.

The known state (worker_timeout 0.5 s, max_attempts 2, max_staleness 2, policy version 3):
  g0 dead (two counted failures), g1 committed, g2 leased by trainer-0, g3 completed (oldest sample
  version 2), g4 ready (failed once: "CUDA OOM"), g5 executing on host-a:gpu0 (alive once
  ``refresh()`` ran), g6 executing on host-b:gpu1 (silent), g7 and g8 in the backlog. host-a reports
  progress (PROGRESS, with its sample histograms) in its heartbeats; host-z:gpu9 reported progress
  once (no histograms: an older worker's line), held nothing, went silent and was reaped (one line
  in the ``reaped`` stream).
Nothing in the fixture calls reserve or lease after host-b went silent (both reap opportunistically),
so the state holds until a test changes it.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import pytest

from rollout_queue import Progress, QueueConfig, RolloutQueue, Sample, SourceGroup, Worker
from rollout_queue.core import flows
from rollout_queue.cli import main
from rollout_queue.devtools.local_server import LocalServer
from tests.conftest import _delete_queue_keys
from tests.helpers import wait_until

CONFIG = QueueConfig(worker_timeout_s=0.5, max_attempts=2, max_staleness=2)
ALIVE, SILENT, TRAINER, REAPED = "host-a:gpu0", "host-b:gpu1", "trainer-0", "host-z:gpu9"
#: host-a's 20 samples per bucket of core/histograms.py: by length (p50 256 tokens, p90 1024, p99 and
#: max 4096) and by duration (p50 5 s, p90 20 s, p99 and max above the last edge, 600 s).
SAMPLE_TOKENS = (0, 0, 2, 4, 6, 4, 2, 1, 1, 0, 0, 0, 0)
SAMPLE_SECONDS = (0, 0, 0, 2, 8, 6, 2, 1, 0, 0, 0, 0, 1)
#: host-a's progress: 10 groups, 5,000 tokens in 20 s (0.5 groups/s, 250 tokens/s), and its samples.
PROGRESS = Progress(groups=10, tokens=5000, uptime_ms=20_000, sample_tokens=SAMPLE_TOKENS,
                    sample_seconds=SAMPLE_SECONDS)


def samples(n: int, version: int) -> list[Sample]:
    return [Sample(slot=i, token_ids=(1, 2, 3), logprobs=(-0.1, -0.2, -0.3), reward=float(i), version=version)
            for i in range(n)]


@dataclass
class KnownState:
    url: str
    queue: str
    q: RolloutQueue
    ids: list[str]
    lease_id: str
    lease: object
    workers: dict[str, Worker] = field(default_factory=dict)
    dlq_id: str = ""

    @property
    def prefix(self) -> str:
        return f"rollout:{{{self.queue}}}"

    def refresh(self) -> None:
        """Heartbeat host-a, so that it counts as alive for the next worker_timeout."""
        self.workers[ALIVE].heartbeat(PROGRESS)

    def close(self) -> None:
        self.q.close()


def build_known_state(url: str, queue: str) -> KnownState:
    q = RolloutQueue.from_url(url, queue, CONFIG)
    ids = q.submit([SourceGroup(f"prompt-{i}", f"What is {i} + {i}?", 2, {"row": i}) for i in range(9)])
    q.publish_version(3, "s3://weights/v3")
    q.worker(REAPED).heartbeat(Progress(groups=4, tokens=1200, uptime_ms=8000))  # silent from now on
    a, b = q.worker(ALIVE), q.worker(SILENT)
    r = {x.entry_id: x for x in a.reserve(6)}                        # g0..g5 executing on host-a
    a.fail(r[ids[0]].receipt, "prompt too long for the engine")      # g0 -> ready
    again = a.reserve(1)[0]                                           # g0 again, attempt 2
    a.fail(again.receipt, "prompt too long for the engine")          # g0 -> dead (max_attempts 2)
    a.complete(r[ids[1]].receipt, samples(2, 3))
    # lease and reserve reap the oldest silent worker on the way: keep host-a fresh before each.
    a.heartbeat()
    committed = q.lease(1, trainer_id=TRAINER)
    assert committed is not None and committed.groups[0].entry_id == ids[1]
    committed.commit()                                                # g1 committed
    a.complete(r[ids[2]].receipt, samples(2, 3))
    a.heartbeat()
    lease = q.lease(1, trainer_id=TRAINER)                            # g2 leased, kept open
    assert lease is not None and lease.groups[0].entry_id == ids[2]
    # Beaten once as it was handed out, then no more: the state stays as built (a background beat
    # would move the record under the views, and log into the in-process CLI's captured stderr
    # whenever a test corrupts this queue's config).
    q.beats.discard(lease)
    a.complete(r[ids[3]].receipt, samples(2, 2))                      # g3 completed, staleness 1
    a.heartbeat()
    b.reserve(1)                                                      # g6 executing on host-b
    a.fail(r[ids[4]].receipt, "CUDA OOM")                             # g4 ready (after b's reserve)
    # host-a's last heartbeat is older than host-b's, so both must be silent before host-a is refreshed.
    # host-z beat first, so it is the first silent (unless a lease or reserve above reaped it on the
    # way, as the oldest silent worker): reaped now, alone (a full pass would take host-b's attempt).
    wait_until(lambda: q.stats().workers_silent >= 1, timeout=5, interval=0.02, message="host-z silent")
    q.run(flows.reaper._reap_worker(q.layout.keys[0], REAPED.encode(), False, 100))
    wait_until(lambda: q.stats().workers_silent >= 2, timeout=5, interval=0.02, message="host-b silent")
    state = KnownState(url, queue, q, ids, lease.lease_id, lease, {ALIVE: a, SILENT: b})
    q.settle_parked()  # g0 was parked by host-a's fail (the worker role holds no XACK): settled here
    state.dlq_id = q.dead_letters()[0].dlq_id
    state.refresh()
    return state


@pytest.fixture
def known_state(server: LocalServer, queue_name: str) -> Iterator[KnownState]:
    """A fresh known state per test (tests that change it)."""
    state = build_known_state(server.url, queue_name)
    yield state
    state.close()


@pytest.fixture(scope="module")
def shared_state(server: LocalServer) -> Iterator[KnownState]:
    """One known state per module and server kind, for tests that only read it."""
    queue = f"t-{uuid.uuid4().hex[:12]}"
    state = build_known_state(server.url, queue)
    yield state
    state.close()
    if server.is_running():
        _delete_queue_keys(server.url, queue)


Cli = Callable[..., tuple[int, str, str]]


@pytest.fixture
def cli(capsys: pytest.CaptureFixture[str]) -> Cli:
    """cli(url, queue, *args) -> (exit code, stdout, stderr), run in-process."""

    def run(url: str | None, queue: str | None, *args: str) -> tuple[int, str, str]:
        capsys.readouterr()
        argv = ([] if url is None else ["--url", url]) + ([] if queue is None else ["--queue", queue]) + list(args)
        code = main(argv)
        out, err = capsys.readouterr()
        return code, out, err

    return run
