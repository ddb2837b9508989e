"""A worker's sample histograms, end to end: the runtime counts every sample it generates into the
shared buckets (core/histograms.py), its heartbeat carries them to the queue, and `rollout-queue
stats` shows their sum. On the scripted engine against a real Redis."""

from __future__ import annotations

import json
import uuid
from collections import Counter

import pytest

from rollout_queue.cli import main
from rollout_queue.core.histograms import SECOND_BUCKETS, TOKEN_BUCKETS, bucket_index
from rollout_queue.devtools.local_server import LocalServer
from rollout_queue.workers.engines.base import SamplingConfig
from rollout_queue.workers.engines.scripted import ScriptedEngine
from rollout_queue.workers.runtime import WorkerOptions, WorkerRuntime
from tests.helpers import wait_until
from tests.workers.runtime_helpers import (
    RuntimeThread,
    open_queue,
    submit,
    train,
    worker_server,  # noqa: F401  # a fixture, used by name
)


def _slot(request_id: str) -> int:
    return int(request_id.rsplit("/", 1)[1])


def test_stats_shows_the_lengths_and_durations_a_running_worker_counted(
        worker_server: LocalServer, capsys: pytest.CaptureFixture[str]) -> None:  # noqa: F811
    url, name = worker_server.url, f"w-{uuid.uuid4().hex[:10]}"
    q = open_queue(url, name)
    submit(q, 3, n=2)
    # Slot 0 answers short and fast, slot 1 long and slow: two buckets of each histogram.
    engine = ScriptedEngine(text_fn=lambda prompt, rid: "ok" if _slot(rid) == 0 else "x" * 100,
                            latency_fn=lambda prompt, rid: 0.01 if _slot(rid) == 0 else 0.6)
    opts = WorkerOptions(block_ms=200, sampling=SamplingConfig(max_tokens=200), heartbeat_interval_s=0.05)
    rt = RuntimeThread(WorkerRuntime(url, name, engine, opts, worker_id=f"wk-{uuid.uuid4().hex[:6]}")).start()
    try:
        _, trained = train(q, {f"g-{i}" for i in range(3)})
        lengths = Counter(bucket_index(TOKEN_BUCKETS, len(s.token_ids)) for g in trained for s in g.samples)
        assert len(lengths) == 2 and sum(lengths.values()) == 6
        want = [lengths.get(i, 0) for i in range(len(TOKEN_BUCKETS) + 1)]
        assert list(rt.runtime.stats.sample_tokens) == want

        def reported() -> dict | None:
            capsys.readouterr()
            assert main(["--url", url, "--queue", name, "stats", "--json"]) == 0
            samples = json.loads(capsys.readouterr().out)["samples"]
            return samples if samples["tokens"]["count"] == 6 and samples["seconds"]["count"] == 6 else None

        samples = wait_until(reported, 10, message="the worker's sample counts in `stats`")
        assert samples["tokens"]["counts"] == want and samples["tokens"]["workers"] == 1
        assert samples["tokens"]["p50"] == TOKEN_BUCKETS[min(lengths)]
        assert samples["tokens"]["max"] == TOKEN_BUCKETS[max(lengths)]
        # Three samples took ~10 ms, three ~0.6 s (1 s bucket), give or take a loaded machine.
        seconds = samples["seconds"]["counts"]
        assert sum(seconds[:bucket_index(SECOND_BUCKETS, 0.25) + 1]) >= 3
        assert sum(seconds[bucket_index(SECOND_BUCKETS, 0.6):]) == 3
        assert samples["seconds"]["max"] >= 1
        capsys.readouterr()
        assert main(["--url", url, "--queue", name, "stats"]) == 0
        out = capsys.readouterr().out
        assert "== samples: lengths and durations reported by 1 worker(s)" in out
        assert next(line for line in out.splitlines() if line.startswith("tokens")).split()[1] == "6"
    finally:
        assert rt.drain() is None
    capsys.readouterr()
    assert main(["--url", url, "--queue", name, "stats", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["samples"]["tokens"]["count"] == 0  # closed: out of the sum
