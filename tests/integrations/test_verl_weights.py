"""verl 0.9.1's weights seam, for real: the ``rollout_queue`` CheckpointEngine found through verl's own
registry and ``custom_backend_module`` import, driven as ``ActorRolloutRefWorker.update_weights``
drives a backend on two gloo ranks (``verl_weight_rank.py``), and a ``python -m rollout_queue.workers
--engine torch`` process that generates with each version rank 0 published.

verl is not in the default environment; ``scripts/test_frameworks.sh verl`` runs this file in a
side environment.
"""

from __future__ import annotations

import inspect
import os
import re
import socket
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import orjson
import pytest

from rollout_queue import QueueConfig, RolloutQueue, SourceGroup
from rollout_queue.core.errors import IntegrationConfigError, QueueNotFound
from tests.workers.runtime_helpers import spawn_worker, train

weights = pytest.importorskip("rollout_queue.integrations.verl.weights",
                              reason="verl 0.9.1 is not installed (scripts/test_frameworks.sh verl)")
torch = pytest.importorskip("torch")
OmegaConf = pytest.importorskip("omegaconf").OmegaConf
pytestmark = pytest.mark.torch

REPO = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    from rollout_queue.workers.tiny_model import build_tiny_model, perturb_weights

    tiny = build_tiny_model(tmp_path_factory.mktemp("models") / "tiny")
    return {"tiny": tiny, "new": perturb_weights(tiny, tiny.parent / "tiny-v2", seed=1)}


def engine_config(url: str, name: str, root: Path, model: Path, **kwargs: Any) -> dict[str, Any]:
    """verl's ``checkpoint_engine`` node as a worker sees it: verl's own rollout.yaml defaults, then
    the block docs/integrations/verl.md tells a user to add, resolved against this model path."""
    import verl

    text = (REPO / "docs" / "integrations" / "verl.md").read_text()
    block = re.search(r"^<!-- verl-weights-config:.*?-->\n```yaml\n(.*?)^```$", text, re.S | re.M)
    assert block, "docs/integrations/verl.md lost its verl-weights-config block"
    defaults = OmegaConf.load(Path(verl.__file__).parent / "trainer" / "config" / "rollout" / "rollout.yaml")
    cfg = OmegaConf.create({"actor_rollout_ref": {"model": {"path": str(model)},
                                                  "rollout": {"checkpoint_engine": defaults.checkpoint_engine}}})
    cfg = OmegaConf.merge(cfg, OmegaConf.create(block.group(1)))
    cfg.actor_rollout_ref.rollout.checkpoint_engine.engine_kwargs.rollout_queue.update(
        url=url, queue=name, root=str(root), **kwargs)
    node: Any = OmegaConf.to_container(cfg.actor_rollout_ref.rollout.checkpoint_engine, resolve=True)
    return node


def send(config: dict[str, Any], out: Path, publish: list[str], *, lora: bool = False) -> tuple[list[int], list[Any]]:
    """Two actor ranks sending ``publish`` (STEP:FOLDER each); their exit codes and rank 0's results."""
    port, env = free_port(), {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    procs = []
    for rank in (0, 1):
        argv = [sys.executable, "tests/integrations/verl_weight_rank.py", "--rank", str(rank), "--world", "2",
                "--port", str(port), "--config", orjson.dumps(config).decode(), "--out", f"{out}.{rank}",
                *(a for item in publish for a in ("--publish", item)), *(["--lora"] if lora else [])]
        procs.append(subprocess.Popen(argv, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                      text=True))
    codes = []
    for proc in procs:
        _, err = proc.communicate(timeout=300)
        codes.append(proc.returncode)
        assert proc.returncode in (0, 4), err[-3000:]
    return codes, orjson.loads(Path(f"{out}.0").read_bytes())


def check_generated_by(model: Any, tokenizer: Any, trained: list[Any], version: int) -> None:
    """Each group was generated at ``version`` and its behaviour logprobs are ``model``'s."""
    for group in trained:
        assert {s.version for s in group.samples} == {version}
        sample = group.samples[0]
        ids = list(group.group.prompt_token_ids or tokenizer(group.group.prompt)["input_ids"])
        with torch.no_grad():
            logits = model(torch.tensor([ids + list(sample.token_ids)])).logits[0, len(ids) - 1:-1]
        expected = torch.log_softmax(logits, -1)[torch.arange(len(sample.token_ids)), torch.tensor(sample.token_ids)]
        assert max(abs(a - float(b)) for a, b in zip(sample.logprobs, expected)) < 1e-3


def test_verl_finds_the_backend_by_its_configured_module_and_it_keeps_the_abcs_signatures() -> None:
    from verl.checkpoint_engine.base import CheckpointEngine, CheckpointEngineRegistry
    from verl.utils.import_utils import import_external_libs

    import_external_libs("rollout_queue.integrations.verl.weights")
    cls = CheckpointEngineRegistry.get("rollout_queue")
    assert cls is weights.QueueCheckpointEngine and issubclass(cls, CheckpointEngine) and not inspect.isabstract(cls)
    for name in ("prepare", "build_topology", "init_process_group", "finalize", "send_weights", "receive_weights"):
        ours, theirs = (
            [(p.name, p.kind, p.default) for p in inspect.signature(getattr(c, name)).parameters.values()]
            for c in (cls, CheckpointEngine))
        assert ours[:len(theirs)] == theirs, name   # verl's arguments, by name, kind and default
    assert inspect.iscoroutinefunction(cls.send_weights) and inspect.isasyncgenfunction(cls.receive_weights)


def test_two_ranks_publish_each_step_and_a_torch_worker_generates_with_it(
        private_redis_url: str, fresh_name: str, models: dict[str, Path], tmp_path: Path) -> None:
    """Steps 0 and 1 (and step 1 again: verl syncs two replica pools with one step) become versions
    1 and 2 of a fresh queue; a worker started before either follows them. Then a trainer resumed
    from checkpoint 1 sends step 1 again: it is published above the killed run's versions (3)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    q = RolloutQueue.from_url(private_redis_url, fresh_name, QueueConfig(max_staleness=0))
    root = tmp_path / "weights"
    config = engine_config(private_redis_url, fresh_name, root, models["tiny"])
    worker = spawn_worker(private_redis_url, fresh_name, "verl-w", "--engine", "torch", "--model",
                          str(models["tiny"]), "--max-tokens", "6", "--reward", "length_reward", "--seed", "3")
    tokenizer = AutoTokenizer.from_pretrained(models["tiny"])
    try:
        codes, results = send(config, tmp_path / "run1", [f"0:{models['tiny']}", f"1:{models['new']}",
                                                          f"1:{models['new']}"])
        assert codes == [0, 0]
        assert [r["rollout_queue/weights_version"] for r in results] == [1.0, 2.0, 2.0]
        assert results[2].get("rollout_queue/weights_replay") == 1.0 and q.version == 2
        folder = root / "v0000002"   # an HF folder of its own: config and tokenizer beside the tensors
        files = {p.name for p in folder.iterdir()}
        assert {"config.json", "tokenizer.json", "manifest.json", "model.safetensors"} <= files
        new = AutoModelForCausalLM.from_pretrained(models["new"], dtype=torch.float32).eval()
        loaded = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).state_dict()
        assert all(torch.equal(loaded[k], v) for k, v in new.state_dict().items())
        q.submit([SourceGroup(f"a{i}", f"What is {i} plus {i}?", 2, {}) for i in range(2)])
        _, trained = train(q, {"a0", "a1"}, timeout=120)
        check_generated_by(new, tokenizer, trained, 2)

        codes, results = send(config, tmp_path / "run2", [f"1:{models['tiny']}"])   # the resumed trainer
        assert codes == [0, 0] and results[0]["rollout_queue/weights_version"] == 3.0 and q.version == 3
        q.submit([SourceGroup(f"b{i}", f"What is {i} plus {i}?", 2, {}) for i in range(2)])
        _, trained = train(q, {"b0", "b1"}, timeout=120)
        check_generated_by(AutoModelForCausalLM.from_pretrained(models["tiny"], dtype=torch.float32).eval(),
                           tokenizer, trained, 3)
    finally:
        worker.terminate()
        _, err = worker.communicate(timeout=60)
        q.close()
    assert worker.returncode == 0, err[-2000:]


def test_rank_zero_refuses_weights_no_worker_loads_after_every_rank_walked_them(
        private_redis_url: str, fresh_name: str, models: dict[str, Path], tmp_path: Path) -> None:
    """An unmerged LoRA's tensors: rank 0 raises only once the iterator is spent, so rank 1 is never
    left in a gather (it finishes, and both reach the barrier after the send); nothing is published."""
    q = RolloutQueue.from_url(private_redis_url, fresh_name, QueueConfig(max_staleness=0))
    config = engine_config(private_redis_url, fresh_name, tmp_path / "weights", models["tiny"])
    codes, results = send(config, tmp_path / "lora", [f"1:{models['tiny']}"], lora=True)
    assert codes == [4, 0] and results[0]["error"] == "IntegrationConfigError" and "lora.merge" in results[0]["message"]
    assert q.version == 0 and not (tmp_path / "weights").exists()
    q.close()


def test_settings_fail_at_construction_with_the_key_to_set(private_redis_url: str, models: dict[str, Path],
                                                           tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from verl.checkpoint_engine.base import CheckpointEngineRegistry

    monkeypatch.delenv("REDIS_URL", raising=False)
    monkeypatch.delenv("ROLLOUT_QUEUE", raising=False)
    good = {"url": private_redis_url, "queue": f"absent-{uuid.uuid4().hex[:8]}", "root": str(tmp_path),
            "model_path": str(models["tiny"])}
    for kwargs, error, match in [
        ({**good, "roots": "x"}, IntegrationConfigError, "unknown"),
        ({k: v for k, v in good.items() if k != "url"}, IntegrationConfigError, r"rollout_queue\.url"),
        ({**good, "transport": "dist"}, IntegrationConfigError, "'folder' or 'delta'"),
        ({**good, "dtype": "bf16"}, IntegrationConfigError, "not a torch dtype"),
        ({**good, "model_path": str(tmp_path)}, IntegrationConfigError, "no config.json"),
        (good, QueueNotFound, "absent-"),
    ]:
        with pytest.raises(error, match=match):
            CheckpointEngineRegistry.new("rollout_queue", is_master=True, bucket_size=1 << 20, **kwargs)
    # other ranks and verl's rollout workers need no queue: they refuse a misspelt key all the same
    CheckpointEngineRegistry.new("rollout_queue", bucket_size=1 << 20)
    with pytest.raises(IntegrationConfigError, match="unknown"):
        CheckpointEngineRegistry.new("rollout_queue", bucket_size=1 << 20, roots="x")


@pytest.mark.parametrize(("step", "current", "offset", "expected"), [
    (0, 0, None, (1, 1)),      # a fresh queue: version 0 is its unpublished state
    (5, 0, None, (5, 0)),      # above the queue: the step itself
    (3, 7, None, (8, 5)),      # a resumed trainer below the killed run's versions
    (4, 8, 5, (9, 5)),         # once fixed, the offset keeps the steps' spacing
])
def test_queue_version(step: int, current: int, offset: int | None, expected: tuple[int, int]) -> None:
    assert weights.queue_version(step, current, offset) == expected


def test_verls_rollout_side_receives_no_tensors() -> None:
    import asyncio

    from verl.checkpoint_engine.base import CheckpointEngineRegistry

    engine = CheckpointEngineRegistry.new("rollout_queue", bucket_size=1 << 20)

    async def received() -> list[Any]:
        return [item async for item in engine.receive_weights(global_steps=3)]
    assert asyncio.run(received()) == []
