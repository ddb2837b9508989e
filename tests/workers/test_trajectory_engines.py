"""Multi-turn trajectories on the real engines (torch, and vLLM's CPU build) with the tiny model.

A scripted environment answers each model turn with a text observation. Checked token by token:
each model turn is exactly what the engine generates, greedily, from the prompt and everything
before it (so the engine really continued the trajectory, prefix cache and all: the prompt is longer
than two vLLM KV blocks); each observation is the environment's text tokenized without special
tokens; the loss mask, the logprobs (the engine's on model tokens, 0 on observations) and the turn
boundaries match; and the two engines produce the same trajectory.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip("torch")

from rollout_queue import Receipt, Reservation, SourceGroup, Turn
from rollout_queue.workers.attempt import Attempt, Output, RuntimeStats
from rollout_queue.workers.engines.base import Engine, SamplingConfig
from rollout_queue.workers.engines.torch import TorchEngine
from rollout_queue.workers.environments import EnvironmentHost, ModelTurn, Step
from rollout_queue.workers.testing import LoopRunner
from rollout_queue.workers.trajectory import TrajectoryLimits, TrajectoryRunner
from rollout_queue.workers.versions import PolicyVersions

GREEDY = SamplingConfig(max_tokens=12, temperature=0)
TURNS = 3


class Calculator:
    """Observation ``" = {i * 7}\\n"`` after model turn i; done after TURNS model turns."""

    def step(self, turn: ModelTurn) -> Step:
        if turn.index + 1 >= TURNS:
            return Step(reward=1.0, done=True)
        return Step(observation=f" = {turn.index * 7}\n", reward=0.5)


async def run_trajectory(engine: Engine, prompt: list[int]) -> Output:
    versions = PolicyVersions(engine, "abort", RuntimeStats(), lambda event: None)
    runner = TrajectoryRunner(engine, EnvironmentHost(Calculator), versions, TrajectoryLimits(max_turns=TURNS))
    group = SourceGroup("calc", "calc", 1)
    attempt = Attempt(Reservation(Receipt("1-0", 1, "engine-test"), group, 0))
    return await runner.run(attempt, 0, prompt, GREEDY)


async def check_token_by_token(engine: Engine, prompt: list[int], out: Output) -> None:
    """Replay the trajectory turn by turn against the engine and the environment's text."""
    assert out.finish_reason == "stop" and [t.role for t in out.turns] == ["model", "observation"] * 2 + ["model"]
    at = 0
    for i, turn in enumerate(out.turns):
        span = slice(at, at + turn.n_tokens)
        if turn.role == "model":
            want = await engine.generate(f"replay-{i}", prompt + list(out.token_ids[:at]), GREEDY)
            assert out.token_ids[span] == want.token_ids
            assert out.logprobs[span] == pytest.approx(want.logprobs, abs=1e-4)
            assert turn == Turn("model", len(want.token_ids), 0)
        else:
            text = f" = {(i // 2) * 7}\n"
            assert list(out.token_ids[span]) == engine.encode_continuation(text)
            assert out.logprobs[span] == (0.0,) * turn.n_tokens
        at += turn.n_tokens
    assert at == len(out.token_ids)
    assert out.reward == pytest.approx(0.5 * (TURNS - 1) + 1.0)


@pytest.fixture(scope="module")
def torch_engine(runner: LoopRunner, tiny_model: Path) -> Iterator[TorchEngine]:
    engine = TorchEngine(str(tiny_model), max_batch_size=8)
    runner.run(engine.start())
    yield engine
    runner.run(engine.close())


def test_torch_engine_runs_trajectories_token_by_token(runner: LoopRunner, torch_engine: TorchEngine,
                                                       long_prompt: list[int]) -> None:
    out = runner.run(run_trajectory(torch_engine, long_prompt))
    runner.run(check_token_by_token(torch_engine, long_prompt, out))
    assert torch_engine.encode_continuation(" = 7\n") != torch_engine.encode(" = 7\n")  # no BOS mid-sequence


@pytest.mark.vllm
def test_vllm_engine_runs_the_same_trajectories(runner: LoopRunner, torch_engine: TorchEngine, tiny_model: Path,
                                                long_prompt: list[int]) -> None:
    pytest.importorskip("vllm")
    from rollout_queue.workers.engines.vllm import VLLMEngine

    engine = VLLMEngine(str(tiny_model), multiprocessing=False, max_model_len=1024, max_num_seqs=16,
                        kv_cache_memory_bytes=64 * 2**20)
    runner.run(engine.start(), timeout=300)
    try:
        out = runner.run(run_trajectory(engine, long_prompt))
        runner.run(check_token_by_token(engine, long_prompt, out))
    finally:
        runner.run(engine.close())
    reference = runner.run(run_trajectory(torch_engine, long_prompt))
    assert (out.token_ids, out.turns) == (reference.token_ids, reference.turns)
    assert out.logprobs == pytest.approx(reference.logprobs, abs=1e-3)
