"""TorchEngine on the tiny model: batching, sampling, aborts, weight loads, failures."""

from __future__ import annotations

import asyncio
import math
from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from rollout_queue.core.errors import WeightsError
from rollout_queue.workers.engines.base import EngineError, RequestFailed, SampleOutput, SamplingConfig
from rollout_queue.workers.engines.torch import TorchEngine
from rollout_queue.workers.testing import LoopRunner, wait_until

pytestmark = pytest.mark.torch

GREEDY = SamplingConfig(max_tokens=24, temperature=0)
# Long enough to still be running when a test acts on it. Greedy, because a sampled run could
# draw EOS early and finish on its own; the greedy runs of these tests' prompts never reach EOS.
LONG = SamplingConfig(max_tokens=900, temperature=0)


@pytest.fixture(scope="module")
def engine(runner: LoopRunner, tiny_model: Path) -> Iterator[TorchEngine]:
    torch_engine = TorchEngine(str(tiny_model), max_batch_size=8)
    runner.run(torch_engine.start())
    yield torch_engine
    runner.run(torch_engine.close())


@pytest.fixture
def prompt(engine: TorchEngine) -> list[int]:
    return engine.encode("What is 12 plus 30?")


def assert_well_formed(out: SampleOutput, params: SamplingConfig) -> None:
    assert len(out.token_ids) == len(out.logprobs) >= 1
    assert all(math.isfinite(p) and p <= 0 for p in out.logprobs)
    if out.finish_reason == "length":
        assert len(out.token_ids) == params.max_tokens
    else:
        assert out.finish_reason == "stop" and len(out.token_ids) <= params.max_tokens


def test_concurrent_samples_finish_independently(
    runner: LoopRunner, engine: TorchEngine, prompt: list[int]
) -> None:
    params = [SamplingConfig(max_tokens=4 + 5 * i, seed=i) for i in range(6)]

    async def scenario() -> list[SampleOutput]:
        return await asyncio.gather(
            *(engine.generate(f"conc-{i}", prompt, p) for i, p in enumerate(params))
        )

    outputs = runner.run(scenario())
    for out, p in zip(outputs, params, strict=True):
        assert_well_formed(out, p)
    assert len({out.token_ids for out in outputs}) == len(outputs)


def test_greedy_is_deterministic_and_batch_invariant(
    runner: LoopRunner, engine: TorchEngine, prompt: list[int]
) -> None:
    async def scenario() -> tuple[SampleOutput, SampleOutput]:
        alone = await engine.generate("greedy-alone", prompt, GREEDY)
        # The same request again, now joining a batch of differently sized sampled requests.
        others = [
            engine.generate(
                f"greedy-noise-{i}", engine.encode("x" * (i + 1)), SamplingConfig(seed=i)
            )
            for i in range(3)
        ]
        batched, *_ = await asyncio.gather(
            engine.generate("greedy-batched", prompt, GREEDY), *others
        )
        return alone, batched

    alone, batched = runner.run(scenario())
    assert_well_formed(alone, GREEDY)
    assert batched.token_ids == alone.token_ids
    assert batched.logprobs == pytest.approx(alone.logprobs, abs=1e-4)


def test_seeded_sampling_is_reproducible(
    runner: LoopRunner, engine: TorchEngine, prompt: list[int]
) -> None:
    def params(seed: int) -> SamplingConfig:
        return SamplingConfig(max_tokens=20, temperature=0.9, top_p=0.95, seed=seed)

    async def scenario() -> list[SampleOutput]:
        first = await engine.generate("seed-a", prompt, params(7))
        rest = await asyncio.gather(
            engine.generate("seed-b", prompt, params(7)),
            engine.generate("seed-c", prompt, params(8)),
        )
        return [first, *rest]

    first, again, other_seed = runner.run(scenario())
    assert again.token_ids == first.token_ids
    assert other_seed.token_ids != first.token_ids


def test_tiny_top_p_is_greedy(runner: LoopRunner, engine: TorchEngine, prompt: list[int]) -> None:
    """A nucleus that keeps only the most likely token must reproduce greedy decoding."""
    nucleus = SamplingConfig(max_tokens=GREEDY.max_tokens, temperature=1.0, top_p=1e-6, seed=3)
    greedy = runner.run(engine.generate("top-p-greedy", prompt, GREEDY))
    sampled = runner.run(engine.generate("top-p-tiny", prompt, nucleus))
    assert sampled.token_ids == greedy.token_ids


def test_abort_mid_generation_returns_tokens_so_far(
    runner: LoopRunner, engine: TorchEngine, prompt: list[int]
) -> None:
    params = LONG

    async def scenario() -> SampleOutput:
        task = asyncio.create_task(engine.generate("abort-me", prompt, params))
        await wait_until(lambda: (engine.tokens_generated("abort-me") or 0) >= 3, what="3 tokens")
        await engine.abort("abort-me")
        await engine.abort("abort-me")  # idempotent
        await engine.abort("never-submitted")  # unknown ids are ignored
        return await task

    out = runner.run(scenario())
    assert out.finish_reason == "abort"
    assert 3 <= len(out.token_ids) < params.max_tokens
    assert len(out.logprobs) == len(out.token_ids)
    assert engine.tokens_generated("abort-me") is None


def test_partial_reads_the_tokens_so_far_without_stopping_the_request(
    runner: LoopRunner, engine: TorchEngine, prompt: list[int]
) -> None:
    """What a periodic progress save reads: a prefix of what the request goes on to return, with its
    logprobs, while the request keeps running."""
    params = SamplingConfig(max_tokens=200, temperature=0)

    async def scenario() -> tuple[SampleOutput | None, bool, SampleOutput]:
        task = asyncio.create_task(engine.generate("peek", prompt, params))
        await wait_until(lambda: (engine.tokens_generated("peek") or 0) >= 3, what="3 tokens")
        peek = engine.partial("peek")
        return peek, task.done(), await task

    peek, done, out = runner.run(scenario())
    assert peek is not None and not done and out.finish_reason != "abort"  # reading it stopped nothing
    assert peek.finish_reason == "abort" and 3 <= len(peek.token_ids) < len(out.token_ids)
    assert out.token_ids[:len(peek.token_ids)] == peek.token_ids
    assert out.logprobs[:len(peek.logprobs)] == peek.logprobs
    assert engine.partial("peek") is None and engine.partial("never-submitted") is None  # finished, unknown


def test_cancelling_generate_aborts_the_request(
    runner: LoopRunner, engine: TorchEngine, prompt: list[int]
) -> None:
    async def scenario() -> SampleOutput:
        task = asyncio.create_task(engine.generate("cancel-me", prompt, LONG))
        await wait_until(lambda: (engine.tokens_generated("cancel-me") or 0) >= 1, what="a token")
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await wait_until(lambda: engine.tokens_generated("cancel-me") is None, what="the abort")
        # The id is free again and the engine still serves.
        return await engine.generate("cancel-me", prompt, GREEDY)

    assert_well_formed(runner.run(scenario()), GREEDY)


def test_stop_string_ends_the_sample(
    runner: LoopRunner, engine: TorchEngine, prompt: list[int]
) -> None:
    full = runner.run(engine.generate("stop-full", prompt, GREEDY))
    cut, stop = first_new_text(engine, full.token_ids)
    params = SamplingConfig(max_tokens=GREEDY.max_tokens, temperature=0, stop=(stop,))
    out = runner.run(engine.generate("stop-cut", prompt, params))
    assert out.finish_reason == "stop"
    assert out.token_ids == full.token_ids[:cut]


def first_new_text(engine: TorchEngine, token_ids: tuple[int, ...]) -> tuple[int, str]:
    """A stop string that first appears when token ``cut - 1`` is generated, and that ``cut``."""
    for cut in range(4, len(token_ids)):
        before = engine.decode(token_ids[: cut - 1])
        text = engine.decode(token_ids[:cut])
        if not text.startswith(before) or len(text) == len(before):
            continue
        stop = text[max(len(before) - 1, 0) :]
        # Random byte-level output is full of U+FFFD (bytes that are not UTF-8 yet); a stop string
        # containing it could match early in a partial decode.
        if "\ufffd" not in stop and stop not in before:
            return cut, stop
    raise AssertionError("no usable stop string in the greedy output")


def test_prompt_near_max_model_len_stops_with_length(runner: LoopRunner, tiny_model: Path) -> None:
    async def scenario() -> SampleOutput:
        short = TorchEngine(str(tiny_model), max_model_len=40)
        await short.start()
        try:
            return await short.generate("edge", list(range(3, 39)), SamplingConfig(max_tokens=20))
        finally:
            await short.close()

    out = runner.run(scenario())
    assert out.finish_reason == "length" and len(out.token_ids) == 4


@pytest.mark.parametrize(
    "prompt_ids, reason",
    [([], "empty"), ([0, 100_000], "vocabulary"), (list(range(3, 400)) * 3, "max_model_len")],
)
def test_bad_requests_fail_alone(
    runner: LoopRunner, engine: TorchEngine, prompt: list[int], prompt_ids: list[int], reason: str
) -> None:
    with pytest.raises(RequestFailed, match=reason):
        runner.run(engine.generate("bad", prompt_ids, GREEDY))
    assert_well_formed(runner.run(engine.generate("after-bad", prompt, GREEDY)), GREEDY)


def test_duplicate_request_id_is_refused(
    runner: LoopRunner, engine: TorchEngine, prompt: list[int]
) -> None:
    async def scenario() -> SampleOutput:
        first = asyncio.create_task(engine.generate("dup", prompt, LONG))
        await wait_until(lambda: engine.tokens_generated("dup") is not None, what="submission")
        with pytest.raises(RequestFailed, match="already in flight"):
            await engine.generate("dup", prompt, GREEDY)
        await engine.abort("dup")
        return await first

    assert runner.run(scenario()).finish_reason == "abort"


def test_load_weights_switches_policy(
    runner: LoopRunner,
    engine: TorchEngine,
    prompt: list[int],
    tiny_model: Path,
    perturbed_model: Path,
) -> None:
    async def scenario() -> tuple[SampleOutput, SampleOutput, SampleOutput, SampleOutput]:
        before = await engine.generate("w-before", prompt, GREEDY)
        await engine.load_weights(str(perturbed_model))
        try:
            after = await engine.generate("w-after", prompt, GREEDY)
        finally:
            await engine.load_weights(str(tiny_model))
        restored = await engine.generate("w-restored", prompt, GREEDY)
        fresh = TorchEngine(str(perturbed_model))
        await fresh.start()
        try:
            reference = await fresh.generate("w-reference", prompt, GREEDY)
        finally:
            await fresh.close()
        return before, after, restored, reference

    before, after, restored, reference = runner.run(scenario())
    assert after.token_ids != before.token_ids
    assert after.token_ids == reference.token_ids
    assert after.logprobs == pytest.approx(reference.logprobs, abs=1e-4)
    assert restored.token_ids == before.token_ids


def test_load_weights_rejects_a_mismatched_folder(
    runner: LoopRunner, engine: TorchEngine, prompt: list[int], tmp_path: Path
) -> None:
    from rollout_queue.workers.tiny_model import build_tiny_model

    other = build_tiny_model(tmp_path / "other", hidden_size=64, num_heads=2, num_layers=1)
    before = runner.run(engine.generate("mismatch-before", prompt, GREEDY))
    for folder in (other, tmp_path / "missing"):
        with pytest.raises(WeightsError, match="could not load weights|no weights folder"):
            runner.run(engine.load_weights(str(folder)))
    # Validation happens before the first copy: the old weights are intact (WeightsError, not fatal).
    after = runner.run(engine.generate("mismatch-after", prompt, GREEDY))
    assert after.token_ids == before.token_ids


def test_close_answers_in_flight_requests_with_abort(runner: LoopRunner, tiny_model: Path) -> None:
    async def scenario() -> SampleOutput:
        own = TorchEngine(str(tiny_model))
        await own.start()
        prompt = own.encode("hello")
        task = asyncio.create_task(own.generate("closing", prompt, LONG))
        await wait_until(lambda: (own.tokens_generated("closing") or 0) >= 1, what="a token")
        await own.close()
        await own.close()  # idempotent
        with pytest.raises(EngineError, match="closed"):
            await own.generate("late", prompt, GREEDY)
        return await task

    out = runner.run(scenario())
    assert out.finish_reason == "abort" and len(out.token_ids) >= 1


def test_compute_failure_is_fatal(
    runner: LoopRunner, tiny_model: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken_step(*args: object) -> None:
        raise RuntimeError("simulated device failure")

    async def scenario() -> None:
        own = TorchEngine(str(tiny_model))
        await own.start()
        try:
            monkeypatch.setattr("rollout_queue.workers.engines._decode.DecodeBatch.step", broken_step)
            prompt = own.encode("hello")
            with pytest.raises(EngineError, match="simulated device failure"):
                await own.generate("doomed", prompt, GREEDY)
            with pytest.raises(EngineError):
                await own.generate("after", prompt, GREEDY)
        finally:
            await own.close()

    runner.run(scenario())


def test_generate_before_start_is_an_engine_error(runner: LoopRunner, tiny_model: Path) -> None:
    with pytest.raises(EngineError, match="not started"):
        runner.run(TorchEngine(str(tiny_model)).generate("early", [0], GREEDY))
