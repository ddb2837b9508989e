"""The miles, slime, NeMo-RL and verl seams as pinned, checked without the frameworks (so drift
shows in the default suite; scripts/test_frameworks.sh runs the same classes against the real ones).

Read at radixark/miles@31f1ca961a94cb860cec3b2dea34ec332bfa8f76 and
THUDM/slime@624b824a898ab0ec1fcb4d373004c7f3852bf515: the abstract methods of each base class and
the module-level names miles' buffer uses; NeMo-RL and verl 0.9.1: below, with their files.
"""

from __future__ import annotations

import ast
import importlib.util
import inspect
import re
from pathlib import Path

import pytest

import rollout_queue

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


# -- verl 0.9.1 ---------------------------------------------------------------------------------------
# Our verl modules import verl (and ray, transfer_queue) at module level, so their own tests skip
# without it. These read both sides as source (ast), importing neither: our classes against this
# recorded copy of verl 0.9.1 (PyPI, verl-0.9.1-py3-none-any.whl), and, where verl is installed
# (scripts/test_frameworks.sh verl), the recorded copy against verl's own files.

VERL = "verl 0.9.1"
#: (verl file, class) -> method -> (is coroutine, parameters as ``_params`` writes them)
VERL_091: dict[tuple[str, str], dict[str, tuple[bool, list[str]]]] = {
    ("verl/trainer/ppo/v1/replay_buffer.py", "ReplayBuffer"): {
        "__init__": (False, ["self", "trainer_mode", "trainer_config", "max_off_policy_threshold",
                             "max_off_policy_strategy", "sampler_kwargs", "poll_interval=", "refill_fn=",
                             "filter_groups_metric=", "train_batch_size=", "gen_batch_size=",
                             "max_inflight_gen_batches=", "sync_refill_failed_groups="]),
        "sample": (False, ["self", "global_steps", "partition_id", "batch_size"]),
    },
    ("verl/trainer/ppo/v1/replay_buffer.py", "ReplayBufferAsync"): {
        "get_sampleable_count": (False, ["self", "global_steps", "partition_id"]),
        "wait_for_sampleable": (False, ["self", "global_steps", "partition_id", "target_count"]),
        "sample": (False, ["self", "global_steps", "partition_id", "batch_size"]),
    },
    ("verl/trainer/ppo/checkpoint_callback.py", "CheckpointCallback"): {
        "__init__": (False, ["self", "config="]),
        "on_save": (False, ["self", "trainer", "global_step", "checkpoint_dir", "async_save=", "**kwargs"]),
    },
    ("verl/checkpoint_engine/base.py", "CheckpointEngine"): {   # every method abstract
        "prepare": (False, ["self"]),
        "build_topology": (False, ["cls", "actor_wg_world_size", "rollout_world_size", "metadata"]),
        "init_process_group": (False, ["self", "**kwargs"]),
        "finalize": (False, ["self"]),
        "send_weights": (True, ["self", "weights", "global_steps="]),
        "receive_weights": (True, ["self", "global_steps="]),
    },
    ("verl/experimental/fully_async_policy/message_queue.py", "MessageQueue"): {
        "__init__": (False, ["self", "config", "max_queue_size="]),
        **{name: (True, ["self"]) for name in ("get_sample", "get_queue_size", "get_statistics", "clear_queue",
                                                "shutdown", "get_memory_usage", "get_validate")},
        "put_sample": (True, ["self", "sample"]),
        "put_validate": (True, ["self", "data"]),
    },
}
#: what ``PPOTrainer._build_replay_buffer`` passes a custom sampler (trainer_base.py, 0.9.1: only these)
VERL_CUSTOM_SAMPLER_KWARGS = {"trainer_mode", "trainer_config", "max_off_policy_threshold",
                              "max_off_policy_strategy", "sampler_kwargs", "refill_fn"}
#: how verl builds a backend: ``CheckpointEngineRegistry.new(backend, bucket_size=..., **engine_kwargs)``
#: (checkpoint_engine/base.py) and, on the actor, with ``is_master=`` too (workers/engine_workers.py)
VERL_ENGINE_KWARGS = {"bucket_size", "is_master"}
#: ``_save_checkpoint`` calls ``on_save`` with these keywords (trainer_base.py); verl builds the
#: callback as ``callback_cls(config=config)`` (checkpoint_callback.py ``build_checkpoint_callback``)
VERL_ON_SAVE_KEYWORDS = {"trainer", "global_step", "checkpoint_dir", "async_save"}
#: verl's actor options and the import our 2-line patch replaces (fully_async_main.py)
VERL_MQ_REMOTE = "ray.remote(num_cpus=2, max_concurrency=20)"
VERL_MQ_IMPORT = "from verl.experimental.fully_async_policy.message_queue import MessageQueue, MessageQueueClient"

OURS = Path(rollout_queue.__file__).parent / "integrations" / "verl"


def _params(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> list[str]:
    """A def's parameters by name: ``x=`` with a default, ``*args``/``*``, ``**kwargs`` (no annotations)."""
    a = fn.args
    positional = a.posonlyargs + a.args
    defaults: list[ast.expr | None] = [None] * (len(positional) - len(a.defaults)) + list(a.defaults)
    out = [p.arg + ("=" if d is not None else "") for p, d in zip(positional, defaults)]
    if a.vararg:
        out.append("*" + a.vararg.arg)
    elif a.kwonlyargs:
        out.append("*")
    out += [p.arg + ("=" if d is not None else "") for p, d in zip(a.kwonlyargs, a.kw_defaults)]
    if a.kwarg:
        out.append("**" + a.kwarg.arg)
    return out


def _class(path: Path, name: str) -> ast.ClassDef:
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.ClassDef) and node.name == name:
            return node
    raise AssertionError(f"{path}: no class {name}")


def _methods(cls: ast.ClassDef) -> dict[str, tuple[bool, list[str], list[str]]]:
    """method -> (is coroutine, parameters, decorators as source)."""
    return {f.name: (isinstance(f, ast.AsyncFunctionDef), _params(f), [ast.unparse(d) for d in f.decorator_list])
            for f in cls.body if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef))}


def _named(params: list[str]) -> tuple[set[str], set[str], bool]:
    """(every named parameter, those without a default, takes **kwargs), self/cls left out."""
    names = [p for p in params[1:] if not p.startswith("*")]
    return {p.rstrip("=") for p in names}, {p for p in names if not p.endswith("=")}, params[-1].startswith("**")


def _recorded(file: str, cls: str, method: str) -> tuple[bool, list[str]]:
    return VERL_091[(file, cls)][method]


def test_the_verl_sampler_and_checkpoint_callback_take_what_verl_passes() -> None:
    source = _class(OURS / "sampler.py", "QueueReplayBuffer")
    assert [ast.unparse(b) for b in source.bases] == ["ReplayBufferAsync"]
    ours = _methods(source)
    named, required, var_kw = _named(ours["__init__"][1])
    assert required <= VERL_CUSTOM_SAMPLER_KWARGS, f"{VERL} passes a custom sampler only {VERL_CUSTOM_SAMPLER_KWARGS}"
    assert VERL_CUSTOM_SAMPLER_KWARGS <= named or var_kw
    verl_init = _named(_recorded("verl/trainer/ppo/v1/replay_buffer.py", "ReplayBuffer", "__init__")[1])
    assert named <= verl_init[0], "super().__init__ gets these: ReplayBuffer.__init__ must take them"
    for method in ("sample", "get_sampleable_count", "wait_for_sampleable"):   # what the trainers call
        assert ours[method][:2] == _recorded("verl/trainer/ppo/v1/replay_buffer.py", "ReplayBufferAsync", method)

    callback = _methods(_class(OURS / "sampler.py", "QueueCheckpointCallback"))
    assert "__init__" not in callback, f"{VERL} builds the callback as callback_cls(config=config)"
    on_save = _recorded("verl/trainer/ppo/checkpoint_callback.py", "CheckpointCallback", "on_save")
    assert callback["on_save"][:2] == on_save
    named, required, var_kw = _named(callback["on_save"][1])
    assert required <= VERL_ON_SAVE_KEYWORDS <= named and var_kw


def test_the_verl_checkpoint_engine_implements_every_pinned_abstract_method() -> None:
    engine = _class(OURS / "weights.py", "QueueCheckpointEngine")
    assert [ast.unparse(b) for b in engine.bases] == ["CheckpointEngine"]
    assert any(ast.unparse(d).startswith("CheckpointEngineRegistry.register(") for d in engine.decorator_list)
    ours = _methods(engine)
    for method, recorded in VERL_091[("verl/checkpoint_engine/base.py", "CheckpointEngine")].items():
        assert ours[method][:2] == recorded, method
    assert "classmethod" in ours["build_topology"][2]
    named, required, var_kw = _named(ours["__init__"][1])
    assert required <= {"bucket_size"} and VERL_ENGINE_KWARGS <= named and var_kw


def test_the_verl_message_queue_has_verls_interface_and_the_patch_its_import() -> None:
    source = (OURS / "message_queue.py").read_text()
    ours = _methods(_class(OURS / "message_queue.py", "QueueMessageQueue"))
    public = {name: sig[:2] for name, sig in ours.items() if not name.startswith("_") or name == "__init__"}
    assert public == VERL_091[("verl/experimental/fully_async_policy/message_queue.py", "MessageQueue")]
    assert f"MessageQueue = {VERL_MQ_REMOTE}(QueueMessageQueue)" in source
    patch = (OURS / "patches" / "fully_async_message_queue.patch").read_text().splitlines()
    assert [line[1:] for line in patch if line.startswith("-") and not line.startswith("---")] == [VERL_MQ_IMPORT]


def test_the_recorded_verl_signatures_match_the_installed_verl() -> None:
    """In verl's side environment: the record above against verl's own files (read, not imported)."""
    spec = importlib.util.find_spec("verl")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("verl is not installed (scripts/test_frameworks.sh verl checks the record against it)")
    root = Path(next(iter(spec.submodule_search_locations))).parent
    assert (root / "verl/version/version").read_text().strip() == "0.9.1", "the record is of verl 0.9.1: re-read it"
    for (file, cls), methods in VERL_091.items():
        theirs = _methods(_class(root / file, cls))
        for method, recorded in methods.items():
            assert theirs[method][:2] == recorded, f"{file} {cls}.{method}"
    remote = root / "verl/experimental/fully_async_policy/message_queue.py"
    assert f"@{VERL_MQ_REMOTE}\nclass MessageQueue" in remote.read_text()
    assert VERL_MQ_IMPORT in (root / "verl/experimental/fully_async_policy/fully_async_main.py").read_text()
