"""scripts/bench_engine.py end to end on the torch engine at toy sizes: every arm runs through the
shipped processes (worker, trainer, reaper, publisher) and writes the documented rows.

It checks shapes and that work was done (every group committed in the queue arms), never rates: the machine is shared and noisy, and the target is a goal, not an assertion.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "scripts"))

from bench_engine import StepTap, cores_in, parse_steps, step_stats, steady_rate, steady_window, steps_text  # noqa: E402


def test_steady_rate_leaves_the_first_tenth_of_tokens_out() -> None:
    # 10 events of 10 tokens, one per second: the 10% mark is the first event (t=1); after it, 90
    # tokens in the 9 s to the last one.
    rate, window, total = steady_rate([(float(t), 10) for t in range(1, 11)])
    assert (rate, window, total) == (10.0, 9.0, 100)
    # Order does not matter; a single burst has no window to measure.
    assert steady_rate([(2.0, 5), (1.0, 5)])[2] == 10
    rate, window, _ = steady_rate([(1.0, 100)])
    assert rate != rate and window == 0.0  # NaN: nothing after the mark


def test_cores_are_read_between_the_samples_that_bracket_the_steady_window() -> None:
    events = [(float(t), 10) for t in range(1, 11)]
    assert steady_window(events) == (1.0, 10.0)
    # The engine used one core throughout; redis 0.1 core, a trainer that started at t=4.
    samples = [(float(t), {"engine": float(t), "redis": 0.1 * t, **({"trainer": 0.5 * (t - 4)} if t >= 4 else {})})
               for t in range(0, 12)]
    cores = cores_in(samples, steady_window(events))
    assert cores["engine"] == 1.0 and abs(cores["redis"] - 0.1) < 1e-9
    assert abs(cores["trainer"] - 3.0 / 9) < 1e-9  # 3 CPU s by t=10, counted from 0 before it existed
    assert cores_in(samples[:1], (1.0, 10.0)) == {} and cores_in(samples, None) == {}


def test_engine_steps_are_read_from_the_line_vllm_itself_logs() -> None:
    """vLLM's own per-step logging (the installed version's format), taken by the bare arm's tap;
    a dummy step is left out."""
    import logging
    from types import SimpleNamespace

    loggers = pytest.importorskip("vllm.v1.metrics.loggers")
    tap = StepTap()
    log = logging.getLogger("vllm.v1.metrics.loggers")
    log.addFilter(tap)
    level = log.level
    log.setLevel(logging.INFO)
    me = SimpleNamespace(_log_prefix_for_engine=lambda i: f"Engine {i:03d}: ", kv_cache_device="CPU")
    try:
        for index, (ctx, gen, ms, dummy) in enumerate([(2, 30, 12.5, False), (0, 0, 0.4, True), (0, 32, 10.0, False)]):
            details = SimpleNamespace(iteration_index=index, num_ctx_requests=ctx, num_ctx_tokens=20 * ctx,
                                      num_generation_requests=gen, num_generation_tokens=gen, elapsed_ms=ms,
                                      is_dummy=dummy, num_encoder_inputs=0, num_encoder_output_tokens=0)
            loggers.LoggingStatLogger._log_iteration_details(
                me, SimpleNamespace(iteration_details=details, kv_cache_usage=0.03), 0)
    finally:
        log.removeFilter(tap)
        log.setLevel(level)
    assert parse_steps(tap.lines) == [(32, 30, 12.5), (32, 32, 10.0)]


def test_step_stats_leave_the_first_wave_and_the_drain_out() -> None:
    # 20 steps: 2 filling, 16 with 32 requests of 10 ms, the last 2 draining.
    steps = [(8, 8, 5.0), (16, 16, 8.0)] + [(32, 32, 10.0)] * 16 + [(4, 4, 2.0), (1, 1, 1.0)]
    stats = step_stats(steps, 32)
    assert stats == {"steps": 20, "requests_per_step": 32.0, "full_steps": 1.0, "ms_per_step": 10.0,
                     "decode_tokens_per_step_s": 3200.0}
    assert step_stats([], 32) == {} and steps_text({}) == ""
    assert steps_text(stats).startswith("steps 20: 32.0 requests, 100% full, 10.0 ms")


def test_torch_arms_run_through_the_shipped_processes(tmp_path: Path) -> None:
    out = tmp_path / "engine.json"
    proc = subprocess.run(
        [sys.executable, "scripts/bench_engine.py", "--engines", "torch", "--groups", "8", "--n", "2",
         "--max-tokens", "8", "--slots", "4", "--publish-every", "0.2", "--repeats", "2", "--json", str(out)],
        cwd=REPO, capture_output=True, text=True, timeout=600,
        env={**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, proc.stderr[-4000:]
    report = json.loads(out.read_text())
    rows = {r["arm"]: r for r in report["rows"]}
    assert set(rows) == {"bare", "queue", "queue+weights"}  # no keep arm: torch keeps its cache anyway
    for row in rows.values():
        assert row["engine"] == "torch" and row["tokens"] > 0 and row["x_bare"] > 0
        # Each row is the median of the two interleaved repeats, with the spread it was judged on.
        assert row["repeats"] == 2 and row["x_bare_min"] <= row["x_bare"] <= row["x_bare_max"]
    assert rows["bare"]["x_bare"] == 1.0
    # Where the CPU went in the steady window: the torch engine is its process (the worker in the
    # queue arms), and the queue arms add the trainer's process and Redis.
    assert set(rows["bare"]["cores"]) == {"engine"}
    assert set(rows["queue"]["cores"]) == {"engine", "trainer", "redis"}
    assert all(c >= 0 for row in rows.values() for c in row["cores"].values())
    assert rows["queue"]["cores"]["engine"] > 0
    assert rows["queue"]["committed"] == rows["queue+weights"]["committed"] == 8
    assert proc.stdout.count("(repeat 2/2)") == 3 and "medians over the repeats" in proc.stdout
    assert report["environment"]["target"] == 0.97 and "x bare" in proc.stdout


def test_an_unknown_arm_is_refused_before_anything_runs() -> None:
    from bench_engine import main

    with pytest.raises(SystemExit) as exc:
        main(["--arms", "queue,queu"])
    assert exc.value.code == 2
