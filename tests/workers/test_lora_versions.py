"""LoRA adapter versions (rollout_queue/weights/lora.py): published as adapters, applied by both
engines over the base model they serve, generating exactly what the merged model generates; and a
LoRA run trained through the queue, each published adapter version generating its samples."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
peft = pytest.importorskip("peft")

from rollout_queue.core.errors import WeightsError  # noqa: E402
from rollout_queue.weights import read_manifest, write_version  # noqa: E402
from rollout_queue.workers.engines.base import SamplingConfig  # noqa: E402
from rollout_queue.workers.engines.torch import TorchEngine  # noqa: E402
from rollout_queue.workers.testing import LoopRunner  # noqa: E402
from tests.workers.runtime_helpers import worker_server  # noqa: E402,F401  # a fixture, used by name

GREEDY = SamplingConfig(max_tokens=16, temperature=0)


def adapter_model(base_dir: Path, seed: int, targets: Sequence[str] = ("q_proj", "v_proj")) -> Any:
    """The tiny model with a rank-8 adapter of random A and B (peft's default B = 0 would be a no-op)."""
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    base = AutoModelForCausalLM.from_pretrained(base_dir, dtype=torch.float32)
    model = peft.get_peft_model(base, peft.LoraConfig(r=8, lora_alpha=16, target_modules=list(targets),
                                                      lora_dropout=0.0, init_lora_weights=False))
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "lora_B" in name:
                param.mul_(4.0)  # enough to change greedy tokens
    return model.eval()


@pytest.fixture(scope="module")
def adapters(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Three adapter versions (the third on other modules) and, for each, the merged model in full."""
    root = tmp_path_factory.mktemp("adapters")
    merged_root = tmp_path_factory.mktemp("merged")
    out: dict[str, Path] = {}
    for version, targets in ((1, ("q_proj", "v_proj")), (2, ("q_proj", "v_proj")), (3, ("k_proj", "o_proj"))):
        model = adapter_model(tiny_model, version, targets)
        out[f"v{version}"] = write_version(root, version, model=model)
        merged = model.merge_and_unload()
        merged.save_pretrained(merged_root / f"v{version}")
        out[f"merged{version}"] = merged_root / f"v{version}"
    return out


async def generate_all(engine: Any, tag: str, prompts: Sequence[Sequence[int]]) -> list[list[int]]:
    outputs = await asyncio.gather(*(engine.generate(f"{tag}-{i}", p, GREEDY) for i, p in enumerate(prompts)))
    return [o.token_ids for o in outputs]


def test_an_adapter_version_is_written_as_lora(adapters: dict[str, Path]) -> None:
    manifest = read_manifest(adapters["v1"])
    assert manifest is not None and manifest.kind == "lora" and manifest.chain == ("v0000001",)
    assert "adapter_config.json" in manifest.files and "adapter_config.json" in manifest.sha256


def run_adapters(runner: LoopRunner, engine: Any, adapters: dict[str, Path], prompts: list[list[int]],
                 base: Path) -> dict[str, list[list[int]]]:
    out: dict[str, list[list[int]]] = {"base": runner.run(generate_all(engine, "base", prompts), timeout=300)}
    for version in ("v1", "v2", "v3", "v1"):  # back to v1: v3's targets return to their base values
        runner.run(engine.load_weights(str(adapters[version])), timeout=300)
        out[version] = runner.run(generate_all(engine, version, prompts), timeout=300)
    return out


def test_the_torch_engine_generates_under_each_adapter_what_the_merged_model_generates(
        runner: LoopRunner, tiny_model: Path, adapters: dict[str, Path], long_prompt: list[int]) -> None:
    prompts = [long_prompt, long_prompt[:150]]
    engine = TorchEngine(str(tiny_model))
    runner.run(engine.start())
    try:
        out = run_adapters(runner, engine, adapters, prompts, tiny_model)
        reference = {}
        for version in ("1", "2", "3"):
            runner.run(engine.load_weights(str(adapters[f"merged{version}"])))
            reference[version] = runner.run(generate_all(engine, f"m{version}", prompts))
        # A DoRA adapter is refused before anything moves: the engine keeps the merged v3.
        dora = adapters["v1"].parent / "dora"
        dora.mkdir(exist_ok=True)
        for f in adapters["v1"].iterdir():
            (dora / f.name).write_bytes(f.read_bytes())
        cfg = (dora / "adapter_config.json").read_text().replace('"use_dora": false', '"use_dora": true')
        (dora / "adapter_config.json").write_text(cfg)
        (dora / "manifest.json").unlink()  # a plain peft folder
        with pytest.raises(WeightsError, match="use_dora"):
            runner.run(engine.load_weights(str(dora)))
        assert runner.run(generate_all(engine, "kept", prompts)) == reference["3"]
    finally:
        runner.run(engine.close())
    assert out["v1"] == reference["1"] and out["v2"] == reference["2"] and out["v3"] == reference["3"]
    assert len({str(out[k]) for k in ("base", "v1", "v2", "v3")}) == 4  # each adapter generates differently


@pytest.mark.vllm
def test_vllm_serves_each_adapter_like_the_merged_model_and_keeps_only_max_loras(
        runner: LoopRunner, tiny_model: Path, adapters: dict[str, Path], long_prompt: list[int]) -> None:
    pytest.importorskip("vllm")
    from rollout_queue.workers.engines.vllm import VLLMEngine

    prompts = [long_prompt, long_prompt[:150]]
    engine = VLLMEngine(str(tiny_model), multiprocessing=False, max_model_len=1024, max_num_seqs=8,
                        kv_cache_memory_bytes=64 * 2**20,
                        engine_args={"enable_lora": True, "max_lora_rank": 8, "max_loras": 2})
    runner.run(engine.start(), timeout=300)
    try:
        out = run_adapters(runner, engine, adapters, prompts, tiny_model)
        resident = runner.run(engine._engine.list_loras(), timeout=60)  # type: ignore[union-attr]
        assert len(resident) == 2  # the newest two adapters; older ones removed once idle
        with pytest.raises(WeightsError, match="full version"):
            runner.run(engine.load_weights(str(adapters["merged1"])), timeout=300)
    finally:
        runner.run(engine.close(), timeout=120)
    reference = TorchEngine(str(tiny_model))
    runner.run(reference.start())
    try:
        expected = run_adapters(runner, reference, adapters, prompts, tiny_model)
    finally:
        runner.run(reference.close())
    assert out == expected


@pytest.mark.torch
def test_a_lora_run_trains_through_the_queue_and_each_adapter_version_generates_its_samples(
        worker_server: Any, tiny_model: Path, tmp_path: Path) -> None:  # noqa: F811
    """``GrpoTrainer`` with ``lora_rank=8`` (``rollout-queue train --lora-rank 8``) and a torch worker
    process: every step's groups were generated by the adapter version before it (strictly
    on-policy), which the test checks by recomputing their behaviour logprobs under that published
    adapter (peft's own forward over the folder) or, for version 0, the base model."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from rollout_queue import QueueConfig, RolloutQueue, SourceGroup
    from rollout_queue.demo.grpo import GrpoSettings, GrpoTrainer
    from tests.workers.runtime_helpers import spawn_worker

    url, name = worker_server.url, f"lora-{uuid.uuid4().hex[:8]}"
    q = RolloutQueue.from_url(url, name, QueueConfig(max_staleness=0, batch_groups=2))
    q.submit([SourceGroup(f"g{i}", f"What is {i} plus {i}?", 4) for i in range(16)])
    # The demo's reward (the share of digits): samples of a group differ, so every step has a gradient.
    worker = spawn_worker(url, name, "lora-worker", "--engine", "torch", "--model", str(tiny_model),
                          "--max-tokens", "8", "--reward", "rollout_queue.demo.task:digit_reward", "--seed", "5",
                          "--temperature", "1.0")
    trained: list[Any] = []
    try:
        trainer = GrpoTrainer(q, tiny_model, tmp_path / "weights", GrpoSettings(steps=4, batch_groups=2, lr=0.05,
                                                                                 lora_rank=8))
        train_on = trainer._train_on

        def recording(lease: Any, wait_s: float) -> None:
            trained.extend(lease.groups)
            train_on(lease, wait_s)

        trainer._train_on = recording  # type: ignore[method-assign]
        records = trainer.run()
    finally:
        worker.terminate()
        _, err = worker.communicate(timeout=60)
    assert worker.returncode == 0, err[-3000:]
    assert [r.step for r in records] == [1, 2, 3, 4] and q.version == 4
    folders = {int(p.name[1:]): p for p in (tmp_path / "weights").iterdir() if p.name.startswith("v")}
    assert all(read_manifest(f).kind == "lora" for f in folders.values())  # type: ignore[union-attr]
    assert sum(f.stat().st_size for f in folders[4].iterdir()) < 200_000  # an adapter, not the model

    tokenizer = AutoTokenizer.from_pretrained(tiny_model)
    by_version: dict[int, Any] = {}
    plain = AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32).eval()
    moved: dict[int, float] = {}  # per version, how far the base model's logprobs are from the samples'
    for group in trained:
        (version,) = {s.version for s in group.samples}
        if version not in by_version:
            base = AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32)
            by_version[version] = (base if version == 0 else peft.PeftModel.from_pretrained(base, folders[version])).eval()
        model = by_version[version]
        ids = tokenizer(group.group.prompt)["input_ids"]
        for sample in group.samples:
            with torch.no_grad():
                logits = model(torch.tensor([ids + list(sample.token_ids)])).logits[0, len(ids) - 1:-1]
            expected = torch.log_softmax(logits, -1)[torch.arange(len(sample.token_ids)), torch.tensor(sample.token_ids)]
            assert max(abs(a - float(b)) for a, b in zip(sample.logprobs, expected)) < 1e-3, (version, group.group.source_id)
            with torch.no_grad():
                logits = plain(torch.tensor([ids + list(sample.token_ids)])).logits[0, len(ids) - 1:-1]
            under_base = torch.log_softmax(logits, -1)[torch.arange(len(sample.token_ids)), torch.tensor(sample.token_ids)]
            moved[version] = max(moved.get(version, 0.0), max(abs(a - float(b)) for a, b in zip(sample.logprobs, under_base)))
    assert sorted(by_version) == [0, 1, 2, 3]  # each step trained on the adapter published before it
    assert all(moved[v] > 1e-2 for v in (1, 2, 3)), moved  # and each adapter is not the base model
    assert "weights updated" in err


@pytest.mark.parametrize("init", ["pissa", "olora", True, "gaussian", "orthogonal"])
def test_an_adapter_is_applied_exactly_as_peft_merges_it_or_refused_before_anything_moves(
        runner: LoopRunner, tiny_model: Path, tmp_path: Path, long_prompt: list[int], init: Any,
        worker_server: Any) -> None:  # noqa: F811
    """Whatever peft initialisation an adapter was trained from (issue 29 item 6): a worker applies
    exactly peft's ``merge_and_unload``, or refuses the folder (``WeightsError``) and generates as
    before. PiSSA and OLoRA move the base weights at initialisation (peft subtracts the initial
    product), so they are refused, and the publisher refuses such a model without writing anything."""
    from transformers import AutoModelForCausalLM

    from rollout_queue import QueueConfig, RolloutQueue
    from rollout_queue.weights import WeightPublisher
    from rollout_queue.weights.lora import merged_weights

    torch.manual_seed(0)
    base = AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32)
    model = peft.get_peft_model(base, peft.LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"],
                                                      lora_dropout=0.0, init_lora_weights=init))
    with torch.no_grad():  # some training: A and B move away from their initial values
        for name, param in model.named_parameters():
            if "lora_" in name:
                param.add_(torch.randn_like(param) * 0.05)
    folder = tmp_path / "adapter"
    model.save_pretrained(folder)  # peft's own adapter folder; its config names the initialisation
    refused = init in ("pissa", "olora")
    q = RolloutQueue.from_url(worker_server.url, f"lora-init-{uuid.uuid4().hex[:8]}", QueueConfig())
    try:
        if refused:
            with pytest.raises(WeightsError, match="init_lora_weights"):
                WeightPublisher(q, tmp_path / "published").publish(model, 1)
            assert not any((tmp_path / "published").glob("v*")) and not q.stats().version_published
    finally:
        q.close()
    merged = model.merge_and_unload()  # the trainer's policy
    expected = {k: v.detach().clone() for k, v in merged.state_dict().items()}
    merged.save_pretrained(tmp_path / "merged")
    served = AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32).state_dict()

    if refused:
        with pytest.raises(WeightsError, match="init_lora_weights"):
            merged_weights(folder, served)
    else:
        applied = merged_weights(folder, served)
        assert applied and max(float((applied[k] - expected[k]).abs().max()) for k in applied) < 1e-5
    prompts = [long_prompt[:120]]
    engine = TorchEngine(str(tiny_model))
    runner.run(engine.start())
    try:
        before = runner.run(generate_all(engine, "before", prompts))
        if refused:
            with pytest.raises(WeightsError, match="init_lora_weights"):
                runner.run(engine.load_weights(str(folder)))
            assert runner.run(generate_all(engine, "kept", prompts)) == before  # nothing applied
        else:
            runner.run(engine.load_weights(str(folder)))
            adapted = runner.run(generate_all(engine, "adapted", prompts))
            runner.run(engine.load_weights(str(tmp_path / "merged")))
            assert runner.run(generate_all(engine, "merged", prompts)) == adapted
    finally:
        runner.run(engine.close())
