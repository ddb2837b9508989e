"""Fixtures for the engine tests: offline settings, one event loop thread, the tiny model.

A test module shares one started engine (vLLM takes seconds to start); every test drives it through
the session's ``LoopRunner`` (``workers.testing``), the loop that engine is bound to.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from rollout_queue.workers.testing import LoopRunner

# Nothing may be fetched from a hub and nothing reported anywhere; set before vLLM or
# transformers are imported (they read some of these at import). The root conftest sets the same
# when it exists; setdefault leaves a deliberate override alone.
for _name, _value in {
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "HF_DATASETS_OFFLINE": "1",
    "VLLM_NO_USAGE_STATS": "1",
    "DO_NOT_TRACK": "1",
    "TOKENIZERS_PARALLELISM": "false",
    "VLLM_LOGGING_LEVEL": "WARNING",
}.items():
    os.environ.setdefault(_name, _value)


@pytest.fixture(scope="session")
def runner() -> Iterator[LoopRunner]:
    loop_runner = LoopRunner()
    yield loop_runner
    loop_runner.close()


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from rollout_queue.workers.tiny_model import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("models") / "tiny")


@pytest.fixture(scope="session")
def perturbed_model(tiny_model: Path) -> Path:
    """The tiny model with different weights: the 'next policy version' of weight-push tests."""
    from rollout_queue.workers.tiny_model import perturb_weights

    return perturb_weights(tiny_model, tiny_model.parent / "tiny-v2", seed=1)


@pytest.fixture(scope="session")
def long_prompt(tiny_model: Path) -> list[int]:
    """About 300 tokens: longer than two 128-token vLLM CPU blocks, so prefix caching applies."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_model)
    text = " ".join(
        f"Step {i}: the worker reserves group {i * 7 % 13} and generates samples."
        for i in range(20)
    )
    ids: list[int] = tokenizer(text)["input_ids"][:300]
    assert len(ids) == 300
    return ids
