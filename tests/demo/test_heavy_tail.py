"""``rollout-queue demo --task tools-heavy``: the tools task with a slow tool on about one prompt in
ten. First the task itself (which prompts are slow, that the environment really waits and says so),
then a short async run through the shipped processes (private Redis, producer, two torch worker
processes, reaper, GRPO trainer, ledger check): every long trajectory must be generated through its
slow tool and trained exactly once, and at least one must span a weight update (else the task is
not heavy-tailed for the queue at all)."""

from __future__ import annotations

import asyncio
import io
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from rollout_queue.demo import tools_task
from rollout_queue.demo.task import demo_task
from rollout_queue.workers.environments import ModelTurn, Step


def test_the_slow_tools_are_seeded_per_prompt_and_about_one_in_ten() -> None:
    heavy = tools_task.records(2000, seed=3, heavy=True)
    assert heavy == tools_task.records(2000, seed=3, heavy=True)
    assert tools_task.records(50, seed=3, heavy=True) == heavy[:50]  # more prompts change no earlier one
    assert [r["mode"] for r in heavy] == [r["mode"] for r in tools_task.records(2000, seed=3)]  # same task
    latencies = sorted(r["tool_s"] for r in heavy)
    median = latencies[len(latencies) // 2]
    long = [t for t in latencies if tools_task.is_long({"tool_s": t})]
    assert 0.07 <= len(long) / len(latencies) <= 0.13
    assert median == pytest.approx(tools_task.MEDIAN_TOOL_S, rel=0.1)
    assert all(10 * median * 0.9 <= t <= 30 * median * 1.1 for t in long)  # 10-30x the median
    assert tools_task.records(2000, seed=4, heavy=True) != heavy


def _group(tool_s: object) -> SimpleNamespace:
    return SimpleNamespace(source_id="g", metadata={"mode": "letters", "tool_s": tool_s})


def test_the_slow_tool_waits_its_latency_without_a_thread_and_records_it() -> None:
    env = tools_task.SlowModeTool()
    env.reset(_group(0.3), 0)

    async def both_turns() -> tuple[float, Step, Step]:
        began = time.monotonic()
        first = await env.step(ModelTurn(0, "tool?", (1,), "length"))
        waited = time.monotonic() - began
        return waited, first, await env.step(ModelTurn(1, "ab", (2, 3), "length"))

    waited, first, last = asyncio.run(both_turns())
    assert waited >= 0.3
    assert first.observation == "\ntool: reply with letters: abcd" and not first.done
    assert first.info == {"tool": "mode", "tool_s": 0.3}
    assert last.done and last.reward == 1.0


@pytest.mark.parametrize("tool_s", [None, -1.0, 31.0, True, "2"])
def test_a_group_without_a_usable_latency_is_refused_with_what_to_do(tool_s: object) -> None:
    with pytest.raises(ValueError, match="heavy=True"):
        tools_task.SlowModeTool().reset(_group(tool_s), 0)


@pytest.mark.slow
@pytest.mark.torch
def test_a_short_async_run_generates_and_trains_every_long_trajectory(redis_url: str, tmp_path: Path) -> None:
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from rich.console import Console

    from rollout_queue.demo.run import DemoOptions, DemoRun
    from rollout_queue.workers.tiny_model import build_tiny_model

    steps, batch_groups = 6, 8
    options = DemoOptions(url=redis_url, engine="torch", model_dir=build_tiny_model(tmp_path / "tiny-model"),
                          run_dir=tmp_path, steps=steps, batch_groups=batch_groups, max_tokens=3, max_staleness=2,
                          task="tools-heavy")
    result = DemoRun(options, Console(file=io.StringIO(), width=120)).execute()

    assert result.ok, (result.error, result.ledger and result.ledger.problems)
    expected = [r for r in tools_task.records(steps * batch_groups, options.seed, heavy=True)
                if tools_task.is_long(r)]
    assert demo_task("tools-heavy").is_long is tools_task.is_long
    assert len(result.long_sources) == len(expected) >= 1
    trained = [s for r in result.records for s in r.sources]
    assert len(trained) == len(set(trained)) == steps * batch_groups
    assert result.long_sources <= set(trained)  # every long trajectory trained, once
    assert result.long_trained() == len(expected)
    # Generated through the slow tool: the environment only ends a trajectory after its wait, and a
    # long one's turns lie on different policy versions when the trainer went on meanwhile.
    assert result.long_span_max() >= 1
    assert result.newest_staleness_seen <= 2
