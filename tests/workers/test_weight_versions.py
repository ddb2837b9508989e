"""Both engines load delta versions (rollout_queue.weights) and generate exactly what a full reload
of the same weights generates, token for token, on prompts longer than one KV block."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from rollout_queue.weights import weight_chain, write_version  # noqa: E402
from rollout_queue.core.errors import WeightsError  # noqa: E402
from rollout_queue.workers.engines.base import SampleOutput, SamplingConfig  # noqa: E402
from rollout_queue.workers.engines.torch import TorchEngine  # noqa: E402
from rollout_queue.workers.testing import LoopRunner  # noqa: E402
from tests.workers.runtime_helpers import worker_server  # noqa: E402,F401  # a fixture, used by name
from tests.weights.test_fetch import s3_store, store  # noqa: E402,F401  # fixtures: a weights root over HTTP, a bucket

GREEDY = SamplingConfig(max_tokens=24, temperature=0)


@pytest.fixture(scope="module")
def versions(tiny_model: Path, perturbed_model: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """v1 = the tiny model (full), v2 = half its tensors from the perturbed model (delta), v3 = the
    other half too (delta: v3 is the perturbed model); ``mid`` = v2's weights written in full."""
    from transformers import AutoModelForCausalLM

    root = tmp_path_factory.mktemp("versions")
    model = AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32)
    new = AutoModelForCausalLM.from_pretrained(perturbed_model, dtype=torch.float32).state_dict()
    v1 = write_version(root, 1, model=model)
    names = sorted(model.state_dict())
    first, second = names[::2], names[1::2]
    v2 = write_version(root, 2, tensors={n: new[n] for n in first}, base=v1)
    model.load_state_dict({**model.state_dict(), **{n: new[n] for n in first}})
    mid = write_version(tmp_path_factory.mktemp("mid"), 2, model=model)
    v3 = write_version(root, 3, tensors={n: new[n] for n in second}, base=v2)
    assert weight_chain(v3) == (v1, v2, v3)
    return {"v1": v1, "v2": v2, "v3": v3, "mid": mid, "new": perturbed_model, "old": tiny_model}


async def generate_all(engine: object, tag: str, prompts: Sequence[Sequence[int]]) -> list[list[int]]:
    outputs: list[SampleOutput] = await asyncio.gather(
        *(engine.generate(f"{tag}-{i}", p, GREEDY) for i, p in enumerate(prompts)))  # type: ignore[attr-defined]
    return [o.token_ids for o in outputs]


async def walk(engine: object, versions: dict[str, Path], prompts: Sequence[Sequence[int]]) -> dict[str, list[list[int]]]:
    """Outputs after each load: the delta chain step by step, a late join straight to v3, and the
    full folders of the same weights."""
    out: dict[str, list[list[int]]] = {}
    load = engine.load_weights  # type: ignore[attr-defined]
    for step in ("v1", "v2", "v3"):  # each delta on the chain just applied
        await load(str(versions[step]))
        out[step] = await generate_all(engine, step, prompts)
    for reference in ("old", "mid", "new"):  # full folders of the same weights
        await load(str(versions[reference]))
        out[reference] = await generate_all(engine, reference, prompts)
    await load(str(versions["v2"]))  # from a folder off the chain: rebuilt from v1
    out["v2-rebuilt"] = await generate_all(engine, "v2r", prompts)
    await load(str(versions["v3"]))
    out["v3-after-v2"] = await generate_all(engine, "v3a", prompts)
    return out


def check(out: dict[str, list[list[int]]]) -> None:
    assert out["v1"] == out["old"]
    assert out["v2"] == out["mid"] == out["v2-rebuilt"]
    assert out["v3"] == out["new"] == out["v3-after-v2"]
    assert out["v1"] != out["v2"] != out["v3"]  # each version generates differently


def test_torch_engine_loads_deltas(runner: LoopRunner, tiny_model: Path, versions: dict[str, Path],
                                   long_prompt: list[int]) -> None:
    prompts = [long_prompt, long_prompt[:150]]
    engine = TorchEngine(str(tiny_model))
    runner.run(engine.start())
    try:
        check(runner.run(walk(engine, versions, prompts)))
        # A delta whose base is gone is refused before any tensor moves: the engine keeps v3.
        broken = versions["v3"].parent / "broken"
        broken.mkdir()
        (broken / "manifest.json").write_bytes((versions["v3"] / "manifest.json").read_bytes())
        with pytest.raises(WeightsError, match="ends its chain"):
            runner.run(engine.load_weights(str(broken)))
        assert runner.run(generate_all(engine, "kept", prompts)) == runner.run(walk_once(engine, versions["new"], prompts))
    finally:
        runner.run(engine.close())


def test_the_torch_engine_applies_only_the_published_bytes(runner: LoopRunner, tiny_model: Path,
                                                          perturbed_model: Path, long_prompt: list[int],
                                                          tmp_path: Path) -> None:
    """Issue 29 item 5, at the engine: a version one of whose files was rewritten with other bytes of
    the same size is refused (``WeightsError``) with the engine's weights untouched; and a chain
    whose folders were rewritten under the same names (a folder replaced) is read again in full,
    not taken for the chain the engine applied before."""
    import shutil

    from transformers import AutoModelForCausalLM

    prompts = [long_prompt[:150]]
    model = AutoModelForCausalLM.from_pretrained(perturbed_model, dtype=torch.float32)
    new = model.state_dict()
    old = AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32).state_dict()
    names = sorted(new)
    engine = TorchEngine(str(tiny_model))
    runner.run(engine.start())
    try:
        before = runner.run(generate_all(engine, "before", prompts))
        tampered = write_version(tmp_path / "tampered", 1, model=model)
        path = tampered / "model.safetensors"
        data = bytearray(path.read_bytes())
        data[-4:] = bytes(4)  # the last float of the last tensor, not the header: same size
        path.write_bytes(bytes(data))
        with pytest.raises(WeightsError, match="sha256"):
            runner.run(engine.load_weights(str(tampered)))
        assert runner.run(generate_all(engine, "kept", prompts)) == before

        root = tmp_path / "replaced"
        v1 = write_version(root, 1, model=AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32))
        v2 = write_version(root, 2, tensors={n: new[n] for n in names[::2]}, base=v1)
        runner.run(engine.load_weights(str(v2)))  # applied: the chain (v1, v2)
        shutil.rmtree(v1)
        shutil.rmtree(v2)
        assert write_version(root, 1, model=model) == v1  # the same names, other bytes
        assert write_version(root, 2, tensors={n: old[n] for n in names[::2]}, base=v1) == v2
        v3 = write_version(root, 3, tensors={n: new[n] for n in names[::3]}, base=v2)
        runner.run(engine.load_weights(str(v3)))
        replaced = runner.run(generate_all(engine, "replaced", prompts))
        # The chain as it is now: v1 the perturbed model, v2 half of it back, v3 a third moved again
        # (the chain applied before held the other half: a delta read alone would mix the two).
        model.load_state_dict({**new, **{n: old[n] for n in names[::2]}, **{n: new[n] for n in names[::3]}})
        expected = write_version(tmp_path / "expected", 3, model=model)
        runner.run(engine.load_weights(str(expected)))
        assert runner.run(generate_all(engine, "expected", prompts)) == replaced
    finally:
        runner.run(engine.close())


async def walk_once(engine: object, folder: Path, prompts: Sequence[Sequence[int]]) -> list[list[int]]:
    await engine.load_weights(str(folder))  # type: ignore[attr-defined]
    return await generate_all(engine, "once", prompts)


@pytest.mark.vllm
def test_vllm_engine_loads_deltas(runner: LoopRunner, tiny_model: Path, versions: dict[str, Path],
                                  long_prompt: list[int]) -> None:
    pytest.importorskip("vllm")
    from rollout_queue.workers.engines.vllm import VLLMEngine

    prompts = [long_prompt, long_prompt[:150]]
    engine = VLLMEngine(str(tiny_model), multiprocessing=False, max_model_len=1024, max_num_seqs=8,
                        kv_cache_memory_bytes=64 * 2**20)
    runner.run(engine.start(), timeout=300)
    try:
        out = runner.run(walk(engine, versions, prompts), timeout=300)
    finally:
        runner.run(engine.close())
    check(out)
    # The same tokens as the torch engine on every version (fp32 on CPU).
    reference = TorchEngine(str(tiny_model))
    runner.run(reference.start())
    try:
        assert runner.run(walk_once(reference, versions["v2"], prompts)) == out["v2"]
    finally:
        runner.run(reference.close())


def test_vllm_refuses_an_extension_that_cannot_load_versions(tiny_model: Path) -> None:
    pytest.importorskip("vllm")
    from rollout_queue.workers.engines.vllm import VLLMEngine

    with pytest.raises(ValueError, match="must subclass"):
        VLLMEngine(str(tiny_model), engine_args={"worker_extension_cls": "collections.OrderedDict"})
    with pytest.raises(ValueError, match="cannot be imported"):
        VLLMEngine(str(tiny_model), engine_args={"worker_extension_cls": "no_such_module.Cls"})


def assert_generated_by(model: Any, tokenizer: Any, trained: Sequence[Any], version: int) -> None:
    """Every group of ``trained`` carries ``version``, and its behaviour logprobs are ``model``'s."""
    for group in trained:
        assert {s.version for s in group.samples} == {version}
        sample = group.samples[0]
        ids = tokenizer(group.group.prompt)["input_ids"]
        with torch.no_grad():
            logits = model(torch.tensor([ids + list(sample.token_ids)])).logits[0, len(ids) - 1:-1]
        expected = torch.log_softmax(logits, -1)[torch.arange(len(sample.token_ids)), torch.tensor(sample.token_ids)]
        assert max(abs(a - float(b)) for a, b in zip(sample.logprobs, expected)) < 1e-3


@pytest.mark.torch
@pytest.mark.parametrize("storage", ["shared", "http", "s3"])
def test_a_worker_process_follows_delta_versions(worker_server: object, tiny_model: Path, perturbed_model: Path,
                                                 tmp_path: Path, storage: str, request: pytest.FixtureRequest) -> None:
    """Through the shipped worker process (``python -m rollout_queue.workers --engine torch``): the
    trainer publishes a full version and then deltas of one layer; the groups generated after each
    carry its version, and their behaviour logprobs are those of the trainer's weights. ``http``:
    the worker shares no folder with the trainer and fetches every version from an HTTP server;
    ``s3``: the trainer uploads every version to an S3 bucket (a local S3 server), the worker has
    only the bucket's URI and the standard AWS variables."""
    import uuid

    from transformers import AutoModelForCausalLM, AutoTokenizer

    from rollout_queue.weights import WeightPublisher
    from tests.helpers import wait_until
    from tests.workers.runtime_helpers import open_queue, spawn_worker, submit, train

    url = worker_server.url  # type: ignore[attr-defined]
    name = f"wv-{uuid.uuid4().hex[:10]}"
    q = open_queue(url, name, max_staleness=0)
    model = AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32).eval()
    new = AutoModelForCausalLM.from_pretrained(perturbed_model, dtype=torch.float32).state_dict()
    tokenizer = AutoTokenizer.from_pretrained(tiny_model)
    if storage == "http":
        root, base, _ = request.getfixturevalue("store")
        publisher = WeightPublisher(q, root, transport="delta", uri_base=base)
    elif storage == "s3":
        publisher = WeightPublisher(q, tmp_path / "weights", transport="delta",
                                    uri_base=request.getfixturevalue("s3_store"), upload=True)
    else:
        publisher = WeightPublisher(q, tmp_path / "weights", transport="delta")
    publisher.publish(model, 1)
    env = {"ROLLOUT_WEIGHTS_CACHE": str(tmp_path / "worker-cache")}
    worker = spawn_worker(url, name, "delta-worker", "--engine", "torch", "--model", str(tiny_model),
                          "--max-tokens", "8", "--reward", "length_reward", "--seed", "3", env=env)
    try:
        kinds = []
        for version, layer in ((2, "model.layers.1."), (3, "model.layers.0.")):
            model.load_state_dict({**model.state_dict(), **{k: v for k, v in new.items() if k.startswith(layer)}})
            publisher.publish(model, version)
            assert publisher.last is not None
            kinds.append(publisher.last.kind)
            submit(q, 2, n=2, prefix=f"v{version}", target_len=6)
            _, trained = train(q, {f"v{version}-0", f"v{version}-1"}, timeout=120)
            assert_generated_by(model, tokenizer, trained, version)
        assert kinds == ["delta", "delta"]
        assert publisher.last is not None
        assert publisher.last.uri.startswith({"http": "http", "s3": "s3://"}.get(storage, "/"))
        assert (tmp_path / "worker-cache").is_dir() == (storage != "shared")
        wait_until(lambda: q.stats().committed == 4, 10)
    finally:
        worker.terminate()
        _, err = worker.communicate(timeout=60)
    assert worker.returncode == 0, err[-2000:]


@pytest.mark.torch
def test_a_worker_process_started_before_the_recorded_folder_is_written_starts_behind_and_catches_up(
        worker_server: object, tiny_model: Path, perturbed_model: Path, tmp_path: Path) -> None:
    """Issue 29 item 4, through the shipped worker process: the queue's version names a folder not
    written yet (``transport="dist"`` records a version before it writes its folder). The worker
    does not exit: it starts on the newest older version beside it that loads (v1), logs what it
    waits for, generates on v1 (samples and logprobs say so), and moves to v2 once it is written."""
    import json
    import threading
    import uuid

    from transformers import AutoModelForCausalLM, AutoTokenizer

    from rollout_queue.weights.store import version_folder
    from tests.helpers import wait_until
    from tests.workers.runtime_helpers import open_queue, spawn_worker, submit, train

    url = worker_server.url  # type: ignore[attr-defined]
    name = f"wb-{uuid.uuid4().hex[:10]}"
    q = open_queue(url, name, max_staleness=1)
    root = tmp_path / "weights"
    model = AutoModelForCausalLM.from_pretrained(perturbed_model, dtype=torch.float32).eval()
    tokenizer = AutoTokenizer.from_pretrained(tiny_model)
    q.publish_version(1, str(write_version(root, 1, model=model)))
    pending = version_folder(root, 2, unique=True)
    q.publish_version(2, str(pending))  # recorded; its folder comes later
    worker = spawn_worker(url, name, "behind-worker", "--engine", "torch", "--model", str(tiny_model),
                          "--max-tokens", "8", "--reward", "length_reward", "--seed", "3", "--json-logs")
    logs: list[dict[str, Any]] = []
    reader = threading.Thread(target=lambda: logs.extend(json.loads(line) for line in worker.stderr  # type: ignore[union-attr]
                                                         if line.startswith("{")), daemon=True)
    reader.start()
    try:
        submit(q, 2, n=2, prefix="early", target_len=6)
        _, trained = train(q, {"early-0", "early-1"}, timeout=120)
        assert_generated_by(model, tokenizer, trained, 1)  # the newest version it could load
        behind = [x for x in logs if x.get("event") == "StartedBehind"]
        assert behind and (behind[0]["version"], behind[0]["loaded"]) == (2, 1), logs
        assert behind[0]["weights_uri"] == str(pending) and behind[0]["loaded_uri"] == str(root / "v0000001")
        tiny = AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32).state_dict()
        model.load_state_dict({**model.state_dict(), **{k: v for k, v in tiny.items() if "layers.0." in k}})
        write_version(root, 2, model=model, target=pending)  # the folder appears
        wait_until(lambda: any(x.get("msg") == "weights updated" and x.get("version") == 2 for x in logs), 60,
                   message="the worker to load version 2")
        submit(q, 2, n=2, prefix="late", target_len=6)
        _, trained = train(q, {"late-0", "late-1"}, timeout=120)
        assert_generated_by(model, tokenizer, trained, 2)
    finally:
        worker.terminate()
        worker.wait(60)
        reader.join(10)
    assert worker.returncode == 0, logs[-20:]


def test_the_torch_engine_loads_a_remote_version(store: tuple[Path, str, list[str]], tiny_model: Path,
                                                 perturbed_model: Path, tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("fsspec")
    pytest.importorskip("aiohttp")
    from transformers import AutoModelForCausalLM

    from rollout_queue.workers.engines.base import SamplingConfig
    from rollout_queue.workers.engines.torch import TorchEngine

    root, url, _ = store
    monkeypatch.setenv("ROLLOUT_WEIGHTS_CACHE", str(tmp_path / "worker-cache"))
    remote = write_version(root, 1, model=AutoModelForCausalLM.from_pretrained(perturbed_model, dtype=torch.float32))
    greedy = SamplingConfig(max_tokens=12, temperature=0)

    async def scenario() -> tuple[list[int], list[int]]:
        engine = TorchEngine(str(tiny_model))
        await engine.start()
        try:
            await engine.load_weights(f"{url}/{remote.name}")
            fetched = (await engine.generate("remote", [1, 2, 3, 4], greedy)).token_ids
            await engine.load_weights(str(perturbed_model))
            local = (await engine.generate("local", [1, 2, 3, 4], greedy)).token_ids
        finally:
            await engine.close()
        return fetched, local

    fetched, local = asyncio.run(scenario())
    assert fetched == local
    assert (tmp_path / "worker-cache").is_dir()


@pytest.mark.vllm
def test_vllm_keep_kv_mode_keeps_requests_in_flight_and_never_serves_old_prefixes(
        runner: LoopRunner, tiny_model: Path, perturbed_model: Path, long_prompt: list[int]) -> None:
    """``kv_on_update="keep"`` (``--weights-mode keep-kv``): no cache reset and no recompute at an
    update, yet a new request whose prompt is in the prefix cache from the old weights is served by
    the new ones (the cache is salted per weights), and a request in flight runs to its end."""
    pytest.importorskip("vllm")
    from rollout_queue.workers.engines.vllm import VLLMEngine

    prompts = [long_prompt, long_prompt[:200] + long_prompt[:100]]
    engine = VLLMEngine(str(tiny_model), multiprocessing=False, max_model_len=1024, max_num_seqs=8,
                        kv_cache_memory_bytes=64 * 2**20, kv_on_update="keep")

    async def scenario() -> tuple[list[list[int]], list[list[int]], SampleOutput]:
        await engine.start()
        try:
            before = await generate_all(engine, "keep-before", prompts)  # fills the prefix cache
            in_flight = asyncio.create_task(
                engine.generate("keep-in-flight", long_prompt, SamplingConfig(max_tokens=300, seed=1)))
            await asyncio.sleep(0.05)
            await engine.load_weights(str(perturbed_model))
            after = await generate_all(engine, "keep-after", prompts)
            return before, after, await in_flight
        finally:
            await engine.close()

    before, after, survivor = runner.run(scenario(), timeout=300)
    reference = TorchEngine(str(tiny_model))
    runner.run(reference.start())
    try:
        assert runner.run(walk_once(reference, tiny_model, prompts)) == before
        assert runner.run(walk_once(reference, perturbed_model, prompts)) == after
    finally:
        runner.run(reference.close())
    assert after != before
    assert survivor.finish_reason in ("length", "stop") and len(survivor.token_ids) == len(survivor.logprobs)
    with pytest.raises(ValueError, match="kv_on_update"):
        VLLMEngine(str(tiny_model), kv_on_update="sometimes")
