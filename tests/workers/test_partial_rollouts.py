"""Partial rollouts through the worker runtime (issue 30 section 1; DESIGN: Partial rollouts).

An attempt cut short for a reason that is not its group's fault (a weight update in abort mode, a
drain) hands its samples so far back with the abort; the next attempt, on any worker, continues each
sample from them: the trained sample is the prefix plus the continuation, with one segment per
version, and every token is generated once. Each test here fails on a build without progress
records (the next attempt regenerated every sample from the prompt).
"""

from __future__ import annotations

import uuid
from typing import Any

import pytest

from rollout_queue import CompletedGroup, RolloutQueue
from rollout_queue.devtools.local_server import LocalServer
from rollout_queue.workers.engines.base import SamplingConfig
from rollout_queue.workers.engines.scripted import ScriptedEngine
from rollout_queue.workers.runtime import WorkerOptions, WorkerRuntime
from tests.helpers import wait_until
from tests.workers.runtime_helpers import RuntimeThread, open_queue, submit, train, worker_server  # noqa: F401

MAX_TOKENS = 20


@pytest.fixture
def url(worker_server: LocalServer) -> str:  # noqa: F811  # the fixture above, by name
    return worker_server.url


@pytest.fixture
def name() -> str:
    return f"p-{uuid.uuid4().hex[:10]}"


def start(url: str, name: str, engine: ScriptedEngine, **options: Any) -> RuntimeThread:
    opts = WorkerOptions(**{"block_ms": 200, "sampling": SamplingConfig(max_tokens=MAX_TOKENS), **options})
    return RuntimeThread(WorkerRuntime(url, name, engine, opts, worker_id=f"wk-{uuid.uuid4().hex[:6]}")).start()


def check_continued(trained: list[CompletedGroup], before: int, after: int) -> None:
    """Every sample: MAX_TOKENS tokens, its first half at version ``before``, the rest at ``after``."""
    for g in trained:
        assert g.attempt == 2
        for s in g.samples:
            assert len(s.token_ids) == MAX_TOKENS == len(s.logprobs)
            assert (s.version, s.versions, s.segments) == (before, (before, after), ((0, before), (10, after)))
            assert s.token_versions == (before,) * 10 + (after,) * 10


def test_an_attempt_aborted_by_a_weight_update_is_continued_not_restarted(url: str, name: str) -> None:
    q = open_queue(url, name, max_staleness=2)
    submit(q, 2, n=2)
    engine = ScriptedEngine(hang=True, tokens=MAX_TOKENS, abort_share=0.5)
    rt = start(url, name, engine, weights_mode="abort")
    wait_until(lambda: engine.running == 4, 10)
    engine.hang = False  # the continuations finish normally
    q.publish_version(1, "file:///weights/v1")
    _, trained = train(q, {"g-0", "g-1"})
    check_continued(trained, 0, 1)
    stats = rt.runtime.stats
    assert rt.drain() is None
    # Every trained token was generated once: 10 per sample before the update, 10 after.
    assert (stats.generated["aborted"], stats.generated["completed"], stats.continued) == (40, 40, 40)
    st = q.stats()
    assert (st.counters["partial_continued"], st.counters["partial_saved"]) == (40, 2)
    assert (st.partial_records, st.counters["partial_bytes"], st.terminals["aborted"]) == (0, 0, 2)


def test_a_drained_workers_attempts_are_continued_by_another_worker(url: str, name: str) -> None:
    q = open_queue(url, name, max_staleness=2)
    submit(q, 1, n=2)
    first = ScriptedEngine(hang=True, tokens=MAX_TOKENS, abort_share=0.5)
    rt1 = start(url, name, first, drain_timeout_s=0.0)
    wait_until(lambda: first.running == 2, 10)
    assert rt1.drain() is None  # SIGTERM's path: the drain deadline aborts what still generates
    assert q.stats().partial_records == 1
    q.publish_version(2, "file:///weights/v2")  # within max_staleness of the prefix; the next worker starts on v3 (adopted before it reserves)
    second = ScriptedEngine(tokens=MAX_TOKENS)
    rt2 = start(url, name, second)
    _, trained = train(q, {"g-0"})
    assert rt2.drain() is None and second.loads == ["file:///weights/v2"]
    check_continued(trained, 0, 2)
    assert rt2.runtime.stats.continued == 20 and rt2.runtime.stats.generated["completed"] == 20


def test_a_prefix_older_than_the_staleness_bound_is_regenerated(url: str, name: str) -> None:
    q = open_queue(url, name, max_staleness=None)  # strictly on-policy: no prefix of an older version
    submit(q, 1, n=2)
    engine = ScriptedEngine(hang=True, tokens=MAX_TOKENS, abort_share=0.5)
    rt = start(url, name, engine, weights_mode="abort")
    wait_until(lambda: engine.running == 2, 10)
    engine.hang = False
    q.publish_version(1, "file:///weights/v1")
    _, trained = train(q, {"g-0"})
    assert rt.drain() is None
    for s in trained[0].samples:
        assert (len(s.token_ids), s.version, s.segments) == (MAX_TOKENS, 1, ())
    st = q.stats()
    assert (st.counters["partial_stale"], st.counters.get("partial_continued", 0)) == (20, 0)
