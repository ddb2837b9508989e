"""The miles and slime seams as pinned, checked without the frameworks (so drift shows in the default
suite; scripts/test_frameworks.sh runs the same classes against the real ones).

Read at radixark/miles@31f1ca961a94cb860cec3b2dea34ec332bfa8f76 and
THUDM/slime@624b824a898ab0ec1fcb4d373004c7f3852bf515: the abstract methods of each base class and
the module-level names miles' buffer uses.
"""

from __future__ import annotations

import inspect
import re

import rollout_queue.integrations.miles.buffer as buffer_module
from rollout_queue.integrations.convert.slime import QueueDataSource as SlimeDataSource
from rollout_queue.integrations.convert.slime import generate_rollout
from rollout_queue.integrations.miles import QueueDataBuffer, QueueDataSource, record_version

#: class -> (base, the base's abstract methods at the pinned commit)
PINNED = {
    QueueDataBuffer: ("miles/rollout/fully_async_data_buffer.py: DataBuffer", {"put", "get", "get_metrics"}),
    QueueDataSource: ("miles/rollout/data_source.py: DataSource", {"get_samples", "add_samples", "save", "load"}),
    SlimeDataSource: ("slime/rollout/data_source.py: DataSource",
                      {"get_samples", "add_samples", "save", "load", "__len__"}),
}
#: what QueueDataBuffer takes from miles' buffer module (``_miles(name)``)
MILES_NAMES = {"DataBufferInput", "MetricGatherer", "call_dynamic_filter", "group_oldest_weight_version",
               "iter_samples", "load_function"}


def test_every_pinned_abstract_method_is_implemented() -> None:
    for cls, (_, methods) in PINNED.items():
        for name in methods:
            assert name in cls.__dict__, f"{cls.__name__} lacks {name}"


def test_signatures_as_the_frameworks_call_them() -> None:
    assert list(inspect.signature(QueueDataBuffer.put).parameters) == ["self", "input"]
    get = inspect.signature(QueueDataBuffer.get).parameters
    assert "current_version" in get and any(p.kind is p.VAR_KEYWORD for p in get.values())
    assert inspect.iscoroutinefunction(QueueDataBuffer.put) and inspect.iscoroutinefunction(QueueDataBuffer.get)
    assert list(inspect.signature(QueueDataSource.load).parameters) == ["self", "rollout_id"]
    assert list(inspect.signature(record_version).parameters) == ["args", "version_dir", "rollout_engines"]
    assert list(inspect.signature(generate_rollout).parameters) == ["args", "rollout_id", "data_source", "evaluation"]


def test_the_buffer_uses_only_the_pinned_miles_names() -> None:
    source = inspect.getsource(buffer_module)
    used = set(re.findall(r'_miles\("(\w+)"\)', source))
    assert used == MILES_NAMES


#: NeMo-RL's ``PromptGroupSampler`` protocol at NVIDIA-NeMo/RL@7ea279abfbeb698b092856d0dab61e7cf39bc909
#: (``nemo_rl/algorithms/async_utils/staleness_sampler.py``): member -> its parameters after self
#: (keyword-only where NeMo-RL calls them by keyword); coroutines marked.
NEMO_RL_PROTOCOL = {
    "admit": (["trainer_version_fn"], True),
    "select": (["current_train_weight", "min_prompt_groups", "max_prompt_groups"], True),
    "evict": (["current_train_weight"], True),
    "should_abort_inflight": (["start_weight_version", "current_train_weight"], False),
    "required_buffer_capacity": (["groups_per_step"], False),
    "set_dispatch_index": (["resume_from_step"], False),
}


def test_the_nemo_rl_sampler_has_the_pinned_protocol() -> None:
    from rollout_queue.integrations.nemo_rl.sampler import QueueSampler

    for name, (params, is_coroutine) in NEMO_RL_PROTOCOL.items():
        method = getattr(QueueSampler, name)
        assert list(inspect.signature(method).parameters)[1:] == params, name
        assert inspect.iscoroutinefunction(method) is is_coroutine, name
    assert isinstance(QueueSampler.is_on_policy, property)
    # the branch that adds it (amahishi/partial-rollout-*) requires a bool class attribute
    assert QueueSampler.supports_buffer_checkpoint is False
    # create_sampler calls cls(buffer, **extra_keys): buffer first, the rest by keyword
    params = list(inspect.signature(QueueSampler.__init__).parameters.values())
    assert params[1].name == "buffer" and all(p.kind is p.KEYWORD_ONLY for p in params[2:])
