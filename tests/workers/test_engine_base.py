"""The engine interface's value types and factory: pure Python, no torch or vLLM needed."""

from __future__ import annotations

import subprocess
import sys

import pytest

from rollout_queue.workers.engines.base import SampleOutput, SamplingConfig, make_engine


def test_sampling_config_defaults_and_greedy() -> None:
    config = SamplingConfig()
    assert (config.max_tokens, config.temperature, config.top_p, config.stop, config.seed) == (
        64,
        1.0,
        1.0,
        (),
        None,
    )
    assert not config.is_greedy
    assert SamplingConfig(temperature=0).is_greedy


@pytest.mark.parametrize(
    "kwargs, error",
    [
        ({"max_tokens": 0}, ValueError),
        ({"max_tokens": 2.5}, TypeError),
        ({"max_tokens": True}, TypeError),
        ({"temperature": -0.1}, ValueError),
        ({"temperature": float("nan")}, ValueError),
        ({"top_p": 0.0}, ValueError),
        ({"top_p": 1.5}, ValueError),
        ({"stop": ("",)}, ValueError),
        ({"stop": (3,)}, ValueError),
        ({"seed": -1}, ValueError),
        ({"seed": 2**63}, ValueError),
        ({"seed": "7"}, TypeError),
    ],
)
def test_sampling_config_rejects_bad_values(
    kwargs: dict[str, object], error: type[Exception]
) -> None:
    with pytest.raises(error):
        SamplingConfig(**kwargs)  # type: ignore[arg-type]


def test_sampling_config_freezes_stop_strings() -> None:
    stops = ["\n\n", "</answer>"]
    config = SamplingConfig(stop=stops)  # type: ignore[arg-type]
    stops.append("late")
    assert config.stop == ("\n\n", "</answer>")
    assert SamplingConfig(stop="###").stop == ("###",)  # type: ignore[arg-type]
    assert hash(config) == hash(SamplingConfig(stop=("\n\n", "</answer>")))


def test_sample_output_checks_lengths_and_reason() -> None:
    out = SampleOutput(token_ids=[5, 6], logprobs=[-0.5, -1.0], finish_reason="length")  # type: ignore[arg-type]
    assert out.token_ids == (5, 6) and out.logprobs == (-0.5, -1.0)
    with pytest.raises(ValueError, match="logprob"):
        SampleOutput(token_ids=(5, 6), logprobs=(-0.5,), finish_reason="stop")
    with pytest.raises(ValueError, match="finish_reason"):
        SampleOutput(token_ids=(), logprobs=(), finish_reason="error")  # type: ignore[arg-type]


def test_make_engine_rejects_unknown_kind() -> None:
    with pytest.raises(ValueError, match="unknown engine kind"):
        make_engine("tensorrt", "/models/x")


def test_interface_imports_neither_torch_nor_vllm() -> None:
    """The runtime and scheduler import the interface on machines without torch or vLLM."""
    code = (
        "import sys, rollout_queue.workers, rollout_queue.workers.engines, rollout_queue.workers.engines.base, rollout_queue.workers.testing; "
        "heavy = {'torch', 'vllm', 'transformers'} & set(sys.modules); "
        "assert not heavy, heavy"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
