"""VLLMEngine on vLLM's CPU build with the tiny model, cross-checked against TorchEngine.

Most tests share one engine in single-process-core mode (``multiprocessing=False``, about twice as
fast to start); ``test_default_multiprocess_mode`` covers vLLM's default process layout, where the
weight reload has to cross a process boundary.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("vllm")

from rollout_queue.core.errors import WeightsError
from rollout_queue.workers.engines.base import EngineError, RequestFailed, SampleOutput, SamplingConfig
from rollout_queue.workers.engines.torch import TorchEngine
from rollout_queue.workers.engines.vllm import VLLMEngine
from rollout_queue.workers.testing import LoopRunner

pytestmark = pytest.mark.vllm

GREEDY = SamplingConfig(max_tokens=32, temperature=0)
ENGINE_OPTIONS = {"max_model_len": 1024, "max_num_seqs": 16, "kv_cache_memory_bytes": 64 * 2**20}


@pytest.fixture(scope="module")
def engine(runner: LoopRunner, tiny_model: Path) -> Iterator[VLLMEngine]:
    vllm_engine = VLLMEngine(str(tiny_model), multiprocessing=False, **ENGINE_OPTIONS)  # type: ignore[arg-type]
    runner.run(vllm_engine.start(), timeout=300)
    yield vllm_engine
    runner.run(vllm_engine.close())


async def generate_all(
    engine: TorchEngine | VLLMEngine,
    tag: str,
    prompts: Sequence[Sequence[int]],
    params: SamplingConfig,
) -> list[SampleOutput]:
    """One concurrent request per prompt, as the runtime submits a group."""
    return list(
        await asyncio.gather(
            *(engine.generate(f"{tag}-{i}", p, params) for i, p in enumerate(prompts))
        )
    )


async def torch_reference(
    model: Path, prompts: Sequence[Sequence[int]], params: SamplingConfig
) -> list[SampleOutput]:
    reference = TorchEngine(str(model))
    await reference.start()
    try:
        return await generate_all(reference, "torch", prompts, params)
    finally:
        await reference.close()


def assert_same_greedy(actual: Sequence[SampleOutput], expected: Sequence[SampleOutput]) -> None:
    for got, want in zip(actual, expected, strict=True):
        assert got.token_ids == want.token_ids
        assert got.finish_reason == want.finish_reason
        assert got.logprobs == pytest.approx(want.logprobs, abs=1e-3)


def test_concurrent_seeded_samples(runner: LoopRunner, engine: VLLMEngine) -> None:
    prompt = engine.encode("What is 12 plus 30?")
    params = [SamplingConfig(max_tokens=5 + 4 * i, temperature=0.8, seed=i % 3) for i in range(6)]

    async def scenario() -> list[SampleOutput]:
        return await asyncio.gather(
            *(engine.generate(f"seeded-{i}", prompt, p) for i, p in enumerate(params))
        )

    outputs = runner.run(scenario())
    for out, p in zip(outputs, params, strict=True):
        assert len(out.token_ids) == len(out.logprobs) >= 1
        assert all(math.isfinite(x) and x <= 0 for x in out.logprobs)
        assert out.finish_reason == "stop" or len(out.token_ids) == p.max_tokens
    # Same seed, same prompt: the shorter sample is a prefix of the longer one.
    assert outputs[3].token_ids[: len(outputs[0].token_ids)] == outputs[0].token_ids
    assert engine.max_concurrency == 16


def test_abort_mid_generation(runner: LoopRunner, engine: VLLMEngine) -> None:
    prompt = engine.encode("Once upon a time")
    # Greedy: a sampled run could draw EOS and finish before the abort; this one never does.
    params = SamplingConfig(max_tokens=900, temperature=0)

    async def scenario() -> SampleOutput:
        long = asyncio.create_task(engine.generate("abort-long", prompt, params))
        # Submitted after the long request and batched with it: once this short one is done, the
        # long one has been running for several steps.
        await engine.generate("abort-short", prompt, SamplingConfig(max_tokens=8))
        await engine.abort("abort-long")
        await engine.abort("abort-long")  # idempotent
        await engine.abort("never-submitted")  # unknown ids are ignored
        return await long

    out = runner.run(scenario())
    assert out.finish_reason == "abort"
    assert 1 <= len(out.token_ids) < params.max_tokens
    assert len(out.logprobs) == len(out.token_ids)


def test_bad_requests_fail_alone(runner: LoopRunner, engine: VLLMEngine) -> None:
    prompt = engine.encode("hello")

    async def scenario() -> SampleOutput:
        for bad in ([], [0, 100_000], list(range(3, 400)) * 3):
            with pytest.raises(RequestFailed):
                await engine.generate("bad", bad, GREEDY)
        first = asyncio.create_task(engine.generate("dup", prompt, SamplingConfig(max_tokens=200)))
        await asyncio.sleep(0)  # let the first request register its id
        with pytest.raises(RequestFailed, match="already in flight"):
            await engine.generate("dup", prompt, GREEDY)
        await engine.abort("dup")
        await first
        return await engine.generate("after-bad", prompt, GREEDY)

    assert len(runner.run(scenario()).token_ids) == GREEDY.max_tokens


def test_fp32_greedy_matches_torch_engine(
    runner: LoopRunner, engine: VLLMEngine, tiny_model: Path, long_prompt: list[int]
) -> None:
    prompts = [engine.encode("What is 12 plus 30?"), engine.encode("The trainer"), long_prompt]
    vllm_out = runner.run(generate_all(engine, "parity", prompts, GREEDY))
    torch_out = runner.run(torch_reference(tiny_model, prompts, GREEDY))
    assert_same_greedy(vllm_out, torch_out)


def test_stop_strings_match_torch_engine(
    runner: LoopRunner, engine: VLLMEngine, tiny_model: Path
) -> None:
    prompt = engine.encode("She sells sea shells")
    full = runner.run(engine.generate("stop-full", prompt, GREEDY))
    text = engine.decode(full.token_ids)
    stop = next(c for c in text[len(text) // 2 :] if c.isprintable() and c != "\ufffd")
    params = SamplingConfig(max_tokens=GREEDY.max_tokens, temperature=0, stop=(stop,))
    vllm_out = runner.run(generate_all(engine, "stop", [prompt], params))
    torch_out = runner.run(torch_reference(tiny_model, [prompt], params))
    assert vllm_out[0].finish_reason == "stop"
    assert_same_greedy(vllm_out, torch_out)


def test_weight_push_resets_prefix_cache(
    runner: LoopRunner,
    engine: VLLMEngine,
    tiny_model: Path,
    perturbed_model: Path,
    long_prompt: list[int],
) -> None:
    """After load_weights, a prompt whose blocks are in the prefix cache is served by the new
    weights (without reset_prefix_cache, vLLM would reuse KV computed by the old ones)."""
    prompts = [long_prompt, long_prompt[:200] + long_prompt[:100]]

    async def scenario() -> tuple[list[SampleOutput], list[SampleOutput], SampleOutput]:
        before = await generate_all(engine, "push-before", prompts, GREEDY)  # fills the cache
        in_flight = asyncio.create_task(
            engine.generate("push-in-flight", long_prompt, SamplingConfig(max_tokens=300, seed=1))
        )
        await engine.load_weights(str(perturbed_model))
        try:
            after = await generate_all(engine, "push-after", prompts, GREEDY)
            survivor = await in_flight
        finally:
            await engine.load_weights(str(tiny_model))
        return before, after, survivor

    before, after, survivor = runner.run(scenario())
    assert_same_greedy(before, runner.run(torch_reference(tiny_model, prompts, GREEDY)))
    assert_same_greedy(after, runner.run(torch_reference(perturbed_model, prompts, GREEDY)))
    assert all(a.token_ids != b.token_ids for a, b in zip(after, before, strict=True))
    # A request running across the push is kept, not aborted.
    assert survivor.finish_reason in ("length", "stop")
    assert len(survivor.token_ids) == len(survivor.logprobs)


def test_a_refused_folder_is_a_weights_error_and_the_engine_serves_on(
    runner: LoopRunner, engine: VLLMEngine, tmp_path: Path
) -> None:
    (tmp_path / "empty").mkdir()
    for folder in (tmp_path / "missing", tmp_path / "empty"):
        with pytest.raises(WeightsError, match="could not load weights"):
            runner.run(engine.load_weights(str(folder)))
    # Refused before vLLM was touched: generation still runs.
    assert len(runner.run(engine.generate("after-failed-push", [0, 5], GREEDY)).token_ids) == 32


def test_default_multiprocess_mode(
    runner: LoopRunner, tiny_model: Path, perturbed_model: Path, long_prompt: list[int]
) -> None:
    async def scenario() -> tuple[list[SampleOutput], list[SampleOutput]]:
        mp_engine = VLLMEngine(str(tiny_model), **ENGINE_OPTIONS)  # type: ignore[arg-type]
        await mp_engine.start()
        try:
            before = await generate_all(mp_engine, "mp-before", [long_prompt], GREEDY)
            await mp_engine.load_weights(str(perturbed_model))
            after = await generate_all(mp_engine, "mp-after", [long_prompt], GREEDY)
        finally:
            await mp_engine.close()
        with pytest.raises(EngineError, match="closed"):
            await mp_engine.generate("late", long_prompt, GREEDY)
        return before, after

    before, after = runner.run(scenario(), timeout=300)
    assert_same_greedy(before, runner.run(torch_reference(tiny_model, [long_prompt], GREEDY)))
    assert_same_greedy(after, runner.run(torch_reference(perturbed_model, [long_prompt], GREEDY)))


def test_seeded_requests_survive_an_update_whose_recompute_exceeds_the_token_budget(
    runner: LoopRunner, tiny_model: Path, perturbed_model: Path, long_prompt: list[int]
) -> None:
    """The default update (recompute mode) preempts every running request and prefills it again,
    prompt plus generated tokens. With a small ``max_num_batched_tokens`` that burst is larger than
    one step; vLLM 0.32's CPU build, splitting a seeded request's prefill across steps, rewound its
    CPU ``torch.Generator`` and its EngineCore died. It must instead finish every request."""
    budget, prompt = 256, long_prompt[:40]
    probe_tokens = 60  # each seeded request still running has generated at least this many

    async def scenario() -> tuple[list[SampleOutput], list[SampleOutput], SampleOutput]:
        small = VLLMEngine(str(tiny_model), multiprocessing=False, max_model_len=budget, max_num_seqs=8,
                           kv_cache_memory_bytes=64 * 2**20, engine_args={"max_num_batched_tokens": budget})
        await small.start()
        try:
            # Admitted together they fit one step (6 x 40 tokens): only the update's recompute is large.
            seeded = [asyncio.create_task(small.generate(f"seeded-{i}", prompt,
                                                         SamplingConfig(max_tokens=200, temperature=1.0, seed=i)))
                      for i in range(5)]
            # Batched with them: once it is done, each seeded request has run probe_tokens steps.
            await small.generate("probe", prompt, SamplingConfig(max_tokens=probe_tokens, temperature=0))
            await small.load_weights(str(perturbed_model))
            survivors = list(await asyncio.gather(*seeded))
            # New seeded prompts together over the budget (3 x 150 tokens) are not split either.
            fresh = await generate_all(small, "fresh", [long_prompt[i:i + 150] for i in range(3)],
                                       SamplingConfig(max_tokens=8, temperature=1.0, seed=7))
            after = await small.generate("after", prompt, GREEDY)
        finally:
            await small.close()
        return survivors, fresh, after

    survivors, fresh, after = runner.run(scenario(), timeout=300)
    running = [s for s in survivors if len(s.token_ids) > probe_tokens + 2]
    # The scenario did what it says: the requests preempted by the update held more than the budget.
    assert sum(len(prompt) + probe_tokens for _ in running) > budget
    for out in [*survivors, *fresh]:
        assert out.finish_reason in ("length", "stop")
        assert len(out.token_ids) == len(out.logprobs) >= 1
    assert len(after.token_ids) == GREEDY.max_tokens


@pytest.mark.parametrize("engine_args", [{"enable_chunked_prefill": True}, {"long_prefill_token_threshold": 64}])
def test_settings_that_split_a_prefill_are_refused_on_the_cpu_build(
    tiny_model: Path, engine_args: dict[str, object]
) -> None:
    """Either setting splits a seeded request's prefill across steps, which kills vLLM 0.32's CPU
    EngineCore: refused when the engine is built, naming the option, not at the first update."""
    (option,) = engine_args
    with pytest.raises(ValueError, match=option):
        VLLMEngine(str(tiny_model), multiprocessing=False, engine_args=engine_args)


def test_a_gpu_engine_keeps_the_prefill_settings_it_was_given(
    tiny_model: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """GPU generators rewind, so the CPU build's rule leaves a GPU user's configuration alone."""
    from rollout_queue.workers.engines import vllm as module

    monkeypatch.setattr(module.current_platform, "is_cpu", lambda: False)
    unset = VLLMEngine(str(tiny_model), multiprocessing=False)
    given = VLLMEngine(str(tiny_model), multiprocessing=False,
                       engine_args={"enable_chunked_prefill": True, "long_prefill_token_threshold": 64})
    assert unset._args.enable_chunked_prefill is None  # vLLM's own default
    assert (given._args.enable_chunked_prefill, given._args.long_prefill_token_threshold) == (True, 64)


def test_partial_hands_over_the_tokens_so_far_without_stopping_the_request(runner: LoopRunner,
                                                                          engine: VLLMEngine) -> None:
    """Issue 30: a periodic progress save reads a vLLM request's tokens mid-flight (DELTA every
    progress_every_tokens); what it read is a prefix of the finished sample, logprobs included."""
    prompt = engine.encode("Once upon a time")
    params = SamplingConfig(max_tokens=400, temperature=0)

    async def scenario() -> tuple[list[SampleOutput], SampleOutput]:
        long = asyncio.create_task(engine.generate("partial-long", prompt, params))
        seen: list[SampleOutput] = []
        while not long.done() and len(seen) < 3:
            got = engine.partial("partial-long")
            if got is not None and (not seen or len(got.token_ids) > len(seen[-1].token_ids)):
                seen.append(got)
            await asyncio.sleep(0.01)
        return seen, await long

    seen, final = runner.run(scenario())
    assert engine.partial("partial-long") is None, "a finished request has no partial"
    assert engine.partial("never-submitted") is None
    assert len(seen) >= 2, "the request's tokens were handed over while it ran"
    for got in seen:
        n = len(got.token_ids)
        assert got.finish_reason == "abort" and 1 <= n < len(final.token_ids)
        assert got.token_ids == final.token_ids[:n]
        assert got.logprobs == pytest.approx(final.logprobs[:n], abs=1e-6)
    assert len(final.logprobs) == len(final.token_ids) == params.max_tokens or final.finish_reason == "stop"


def test_final_only_when_progress_is_off(runner: LoopRunner, tiny_model: Path) -> None:
    quiet = VLLMEngine(str(tiny_model), multiprocessing=False, progress_every_tokens=0,
                       **ENGINE_OPTIONS)  # type: ignore[arg-type]
    runner.run(quiet.start(), timeout=300)
    try:
        prompt = quiet.encode("Once upon a time")

        async def scenario() -> tuple[list[SampleOutput | None], SampleOutput]:
            task = asyncio.create_task(quiet.generate("q", prompt, SamplingConfig(max_tokens=64, temperature=0)))
            seen = []
            while not task.done():
                seen.append(quiet.partial("q"))
                await asyncio.sleep(0.01)
            return seen, await task

        seen, final = runner.run(scenario())
        assert all(x is None for x in seen) and len(final.token_ids) >= 1
        with pytest.raises(ValueError, match="progress_every_tokens"):
            VLLMEngine(str(tiny_model), progress_every_tokens=-1)
    finally:
        runner.run(quiet.close())
