"""Converters from a leased group to verl, AReaL, slime / miles and prime-rl sample shapes.

Each converter is checked against the field list read from the framework's source at a pinned
commit (FIELDS below; the pages in docs/integrations/ name the same commits), and against the
framework's real class wherever its package imports here (``importorskip``: verl and AReaL install
from PyPI and import on a CPU; slime, miles and prime-rl install from their source only;
scripts/test_frameworks.sh runs this file in a side environment with them). The slime rollout
source is also driven against a real Redis: rollouts committed once, checkpointed, restored.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from rollout_queue import CompletedGroup, QueueConfig, RolloutQueue, Sample, SourceGroup
from rollout_queue.integrations.convert import flat
from rollout_queue.integrations.convert.prime_rl import to_training_samples
from rollout_queue.integrations.convert.slime import QueueRollout, to_samples
from rollout_queue.integrations.convert.verl import to_agent_loop_outputs
from tests.integrations.helpers import fill

#: framework -> (repository@commit, path, required fields, optional fields), read from the source
FIELDS: dict[str, tuple[str, str, set[str], set[str]]] = {
    "verl": ("verl-project/verl@1dda039b9c6311889a9c9a26040677e1254814f9",
             "verl/experimental/agent_loop/agent_loop.py: AgentLoopOutput",
             {"prompt_ids", "response_ids", "response_mask", "metrics"},
             {"response_logprobs", "routed_experts", "multi_modal_data", "reward_score", "num_turns",
              "extra_fields", "mm_processor_kwargs"}),
    "slime": ("THUDM/slime@624b824a898ab0ec1fcb4d373004c7f3852bf515", "slime/utils/types.py: Sample",
              set(),
              {"group_index", "index", "rollout_id", "prompt", "tokens", "multimodal_inputs",
               "multimodal_train_inputs", "multimodal_train_input_id", "apply_chat_template_kwargs", "response",
               "response_length", "label", "reward", "loss_mask", "weight_versions", "rollout_log_probs",
               "rollout_top_p_token_ids", "rollout_top_p_token_offsets", "rollout_routed_experts", "remove_sample",
               "teacher_log_probs", "status", "metadata", "generate_function_path", "custom_rm_path",
               "train_metadata", "session_id", "non_generation_time", "spec_info", "prefix_cache_info"}),
    "miles": ("radixark/miles@31f1ca961a94cb860cec3b2dea34ec332bfa8f76", "miles/utils/types.py: Sample",
              set(),
              {"group_index", "index", "rollout_id", "prompt", "tokens", "multimodal_inputs",
               "multimodal_train_inputs", "response", "response_length", "label", "reward", "loss_mask",
               "weight_versions", "rollout_log_probs", "rollout_routed_experts", "rollout_indexer_topk",
               "remove_sample", "teacher_log_probs", "opd_reverse_kl", "status", "metadata",
               "generate_function_path", "train_metadata", "non_generation_time", "spec_info",
               "prefix_cache_info", "adapter", "reward_spec", "routing_key"}),
    "prime-rl": ("PrimeIntellect-ai/prime-rl@559b44772e471d1538537b8805cc77f3824a5e64",
                 "src/prime_rl/transports/rollouts/types.py: TrainingSample",
                 {"token_ids", "mask", "logprobs", "temperatures", "env_name"},
                 {"ref_logprobs", "mm_kwargs", "routed_experts", "mm_token_type_ids", "rl_weights", "ce_weights",
                  "ref_kl_weights", "advantages"}),
}


def group(prompt: tuple[int, ...] = (5, 6, 7)) -> CompletedGroup:
    # sample 0: its first token generated under version 2, the second under 3 (an update landed between)
    samples = (Sample(0, (10, 11), (-0.5, -0.25), reward=1.0, version=2, versions=(2, 3), segments=((0, 2), (1, 3))),
               Sample(1, (12, 13, 14), (-1.0, -0.75, -0.125), reward=0.0, version=3, finish_reason="length"),
               Sample(2, (15,), (-2.0,), reward=0.5, version=2))
    return CompletedGroup("7-0", SourceGroup("q7", "what is 2+2?", 3, {"answer": "4"}, prompt), samples,
                          attempt=1, min_version=2)


def areal_reward(prompt: Any, completions: Any, prompt_ids: Any, completion_ids: Any, **_: Any) -> float:
    """The leased sample's reward, for AReaL's workflow (module level: AReaL runs rewards in a pool)."""
    return float(next(s.reward for s in group().samples if list(s.token_ids) == list(completion_ids)))


def check_fields(framework: str, rows: list[dict[str, Any]]) -> None:
    _, _, required, optional = FIELDS[framework]
    for row in rows:
        assert required <= set(row) <= required | optional, (framework, set(row) - required - optional)


def test_flat_samples_carry_advantages_versions_and_prompt() -> None:
    s = flat(group())
    assert [x.response_ids for x in s] == [[10, 11], [12, 13, 14], [15]] and s[0].prompt_ids == [5, 6, 7]
    assert s[0].token_versions == [2, 3] and s[1].token_versions == [3, 3, 3]  # per token, else the sample's
    assert s[0].advantage > s[2].advantage > s[1].advantage and abs(sum(x.advantage for x in s)) < 1e-6


def test_versions_are_not_read_as_per_token_even_when_they_are_as_many_as_the_tokens() -> None:
    """Issue 30: ``versions`` lists the versions a sample ran under, not which token each made; two
    tokens that ran under (3, 5) with no segments were both generated at 3 as far as the queue knows
    (main read them as one version per token whenever the lengths matched)."""
    sample = Sample(0, (10, 11), (-0.5, -0.25), reward=1.0, version=3, versions=(3, 5))
    g = CompletedGroup("9-0", SourceGroup("q9", "p", 1, {}, (5,)), (sample,), attempt=1, min_version=3)
    assert flat(g)[0].token_versions == [3, 3]


def test_every_converter_carries_per_token_versions_where_its_format_can() -> None:
    verl = to_agent_loop_outputs(group(), as_dicts=True)
    assert [r["extra_fields"]["token_versions"] for r in verl] == [[2, 3], [3, 3, 3], [2]]
    assert verl[0]["response_logprobs"] == [-0.5, -0.25]
    slime = to_samples(group(), as_dicts=True)
    assert [r["weight_versions"] for r in slime] == [["2", "3"], ["3"], ["2"]]  # one per version, oldest first
    assert slime[0]["metadata"]["token_versions"] == [2, 3] and slime[0]["rollout_log_probs"] == [-0.5, -0.25]
    prime = to_training_samples(group(), as_dicts=True)
    assert prime[0]["logprobs"][-2:] == [-0.5, -0.25]  # prime-rl has no version field: the logprobs only


# -- verl ---------------------------------------------------------------------------------------


def test_verl_rows_have_agent_loop_output_fields() -> None:
    rows = to_agent_loop_outputs(group(), as_dicts=True)
    check_fields("verl", rows)
    assert rows[1]["response_mask"] == [1, 1, 1] and rows[1]["response_logprobs"] == [-1.0, -0.75, -0.125]
    assert rows[0]["reward_score"] == 1.0 and rows[0]["extra_fields"]["policy_version"] == 2


def test_verl_builds_its_real_agent_loop_output() -> None:
    agent_loop = pytest.importorskip("verl.experimental.agent_loop.agent_loop")
    (out, *_) = to_agent_loop_outputs(group())
    assert isinstance(out, agent_loop.AgentLoopOutput)
    assert out.prompt_ids == [5, 6, 7] and out.response_ids == [10, 11] and out.num_turns == 2


# -- AReaL --------------------------------------------------------------------------------------


def test_areal_trajectory_tensors_follow_rlvr_workflow() -> None:
    torch = pytest.importorskip("torch")
    from rollout_queue.integrations.convert.areal import to_areal_trajectory

    t = to_areal_trajectory(group())
    assert {k: (v.dtype, tuple(v.shape)) for k, v in t.items()} == {
        "input_ids": (torch.int32, (3, 6)), "loss_mask": (torch.int32, (3, 6)), "logprobs": (torch.float32, (3, 6)),
        "versions": (torch.int32, (3, 6)), "attention_mask": (torch.bool, (3, 6)), "rewards": (torch.float32, (3,))}
    assert t["input_ids"][0].tolist() == [5, 6, 7, 10, 11, 0]
    assert t["loss_mask"][0].tolist() == [0, 0, 0, 1, 1, 0]
    assert t["versions"][0].tolist() == [-1, -1, -1, 2, 3, 0]  # -1 on the prompt, 0 on padding (AReaL's own)
    assert t["logprobs"][1].tolist() == [0.0, 0.0, 0.0, -1.0, -0.75, -0.125]
    assert t["attention_mask"][2].tolist() == [True, True, True, True, False, False]


def test_areal_trajectory_equals_what_its_own_rlvr_workflow_builds() -> None:
    """AReaL's RLVRWorkflow + GroupedRolloutWorkflow run on an engine that replays the group's
    samples: their tensors and ours must be equal, key for key, dtype for dtype."""
    import asyncio
    import logging

    torch = pytest.importorskip("torch")
    rlvr = pytest.importorskip("areal.workflow.rlvr")
    from areal.api import AsyncRewardWrapper, ModelResponse
    from areal.api.cli_args import GenerationHyperparameters
    from areal.infra.remote_inf_engine import GroupedRolloutWorkflow

    from rollout_queue.integrations.convert.areal import to_areal_trajectory

    g = group()
    samples = flat(g)

    class Replay:  # AReaL's inference engine, answering with the leased samples in order
        def __init__(self) -> None:
            self.k = 0

        async def agenerate(self, req: Any) -> Any:
            s, self.k = samples[self.k], self.k + 1
            return ModelResponse(input_tokens=list(req.input_ids), output_tokens=s.response_ids,
                                 output_logprobs=s.logprobs, output_versions=s.token_versions)

    class Tok:
        eos_token_id, pad_token_id = 2, 0

        def decode(self, ids: Any) -> str:
            return " ".join(map(str, ids))

    wf = rlvr.RLVRWorkflow.__new__(rlvr.RLVRWorkflow)
    wf.reward_fn, wf.async_reward_fn = areal_reward, AsyncRewardWrapper(areal_reward)
    wf.tokenizer, wf.gconfig, wf.enable_thinking = Tok(), GenerationHyperparameters(), False
    wf.get_input_ids_fn = lambda data, tokenizer, thinking: list(g.group.prompt_token_ids)
    wf.data_extract_prompt_fn = lambda data: data["messages"]
    theirs = asyncio.run(GroupedRolloutWorkflow(wf, len(samples), logging.getLogger()).arun_episode(
        Replay(), {"messages": []}))
    ours = to_areal_trajectory(g)
    assert set(theirs) == set(ours)
    for key, value in theirs.items():
        assert value.dtype == ours[key].dtype and torch.equal(value, ours[key]), key


# -- slime / miles ------------------------------------------------------------------------------


def test_slime_rows_have_sample_fields_of_slime_and_miles() -> None:
    rows = to_samples(group(), group_index=4, first_index=12, as_dicts=True)
    check_fields("slime", rows)
    check_fields("miles", rows)
    r = rows[1]
    assert r["tokens"] == [5, 6, 7, 12, 13, 14] and r["response_length"] == 3 == len(r["loss_mask"])
    assert len(r["rollout_log_probs"]) == 3 and r["weight_versions"] == ["3"] and r["status"] == "TRUNCATED"
    assert [x["index"] for x in rows] == [12, 13, 14] and {x["group_index"] for x in rows} == {4}
    assert r["metadata"]["answer"] == "4" and r["metadata"]["queue_entry"] == "7-0"


def test_slime_builds_its_real_sample() -> None:
    types = pytest.importorskip("slime.utils.types")
    (s, *_) = to_samples(group())
    assert isinstance(s, types.Sample) and s.status == types.Sample.Status.COMPLETED
    assert s.tokens == [5, 6, 7, 10, 11] and s.response_length == 2


@pytest.fixture
def q(redis_url: str, queue_name: str) -> Any:
    queue = RolloutQueue.from_url(redis_url, queue_name, QueueConfig(max_staleness=8))
    yield queue
    queue.close()


def test_slime_rollouts_commit_once_checkpoint_and_restore(q: RolloutQueue) -> None:
    fill(q, 12, n=4, tokenized=True)
    args = SimpleNamespace(rollout_batch_size=2)
    source = QueueRollout(q)
    for rollout_id in (0, 1):
        groups = source.generate_rollout(args, rollout_id, None)
        assert len(groups) == 2 and all(len(g) == 4 for g in groups)
    assert q.stats().committed == 4 and q.stats().leased == 0  # each rollout committed as it is handed out
    source.save(1)
    assert q.stats().committed == 4 and q.stats().leased == 0
    source.generate_rollout(args, 2, None)
    source.generate_rollout(args, 3, None)  # then the trainer dies
    resumed = QueueRollout(q)
    resumed.load(1)  # slime resumes from its checkpoint at rollout 1
    s = q.stats()
    assert (s.committed, s.ready, s.leased) == (4, 4, 0)  # rollouts 2 and 3 requeued (to generate again), once


# -- prime-rl -----------------------------------------------------------------------------------


def test_prime_rl_rows_have_training_sample_fields() -> None:
    rows = to_training_samples(group(), temperature=0.7, as_dicts=True)
    check_fields("prime-rl", rows)
    r = rows[0]
    assert r["token_ids"] == [5, 6, 7, 10, 11] and r["mask"] == [False, False, False, True, True]
    assert r["logprobs"] == [0.0, 0.0, 0.0, -0.5, -0.25] and r["temperatures"] == [0.7] * 5
    assert r["advantages"][:3] == [0.0] * 3 and r["advantages"][3] > 0 and r["env_name"] == "rollout-queue"
    assert all(len(x["token_ids"]) == len(x["mask"]) == len(x["logprobs"]) == len(x["advantages"]) for x in rows)


def test_prime_rl_builds_its_real_training_sample() -> None:
    types = pytest.importorskip("prime_rl.transports.rollouts.types")
    msgspec = pytest.importorskip("msgspec")
    (s, *_) = to_training_samples(group())
    assert isinstance(s, types.TrainingSample)
    again = msgspec.msgpack.decode(msgspec.msgpack.encode(s), type=types.TrainingSample)
    assert again.token_ids == [5, 6, 7, 10, 11] and again.mask[-1] is True


# -- trajectories (multi-turn samples) -----------------------------------------------------------


def trajectory_group() -> CompletedGroup:
    from rollout_queue import Turn

    turns = (Turn("model", 2, 3), Turn("observation", 2), Turn("model", 1, 4))
    samples = (Sample(0, (10, 11, 20, 21, 12), (-0.5, -0.25, 0.0, 0.0, -1.0), reward=1.0, version=3, versions=(3, 4),
                      turns=turns, metadata={"step_rewards": [0.0, 1.0]}),
               Sample(1, (13, 14), (-0.5, -0.5), reward=0.0, version=3))
    return CompletedGroup("8-0", SourceGroup("q8", "use the tool", 2, {}, (5, 6)), samples, attempt=1, min_version=3)


def test_every_converter_masks_a_trajectorys_observations() -> None:
    (t, s) = flat(trajectory_group())
    assert t.loss_mask == [1, 1, 0, 0, 1] and s.loss_mask == [1, 1]
    assert t.token_versions == [3, 3, -1, -1, 4] and t.num_turns == 4 and s.num_turns == 2
    assert t.metadata == {"step_rewards": [0.0, 1.0]}
    verl = to_agent_loop_outputs(trajectory_group(), as_dicts=True)
    check_fields("verl", verl)
    assert verl[0]["response_mask"] == [1, 1, 0, 0, 1] and verl[0]["num_turns"] == 4
    assert verl[0]["extra_fields"]["step_rewards"] == [0.0, 1.0] and verl[0]["extra_fields"]["queue_entry"] == "8-0"
    slime = to_samples(trajectory_group(), as_dicts=True)
    assert slime[0]["loss_mask"] == [1, 1, 0, 0, 1] and slime[0]["response_length"] == 5
    prime = to_training_samples(trajectory_group(), as_dicts=True)
    assert prime[0]["mask"] == [False, False, True, True, False, False, True]


def test_areal_trajectory_masks_observations_and_marks_their_versions() -> None:
    pytest.importorskip("torch")
    from rollout_queue.integrations.convert.areal import to_areal_trajectory

    t = to_areal_trajectory(trajectory_group())
    assert t["loss_mask"][0].tolist() == [0, 0, 1, 1, 0, 0, 1]
    assert t["versions"][0].tolist() == [-1, -1, 3, 3, -1, -1, 4]
    assert t["logprobs"][0].tolist() == [0.0, 0.0, -0.5, -0.25, 0.0, 0.0, -1.0]


def test_nemo_rl_records_keep_observations_out_of_the_loss() -> None:
    """NeMo-RL trains assistant messages that carry generation_logprobs (integrations/nemo_rl/records.py)."""
    from rollout_queue.core.errors import InvalidInput
    from rollout_queue.integrations.nemo_rl import to_record

    record = to_record(trajectory_group(), 7, as_dict=True)
    assert record["prompt_idx"] == 7 and record["prompt"][0]["token_ids"].tolist() == [5, 6]
    traj, single = record["completions"]
    assert [m["role"] for m in traj["message_log"]] == ["user", "assistant", "tool", "assistant"]
    assert [m["token_ids"].tolist() for m in traj["message_log"][1:]] == [[10, 11], [20, 21], [12]]
    assert "generation_logprobs" not in traj["message_log"][2]
    assert traj["message_log"][3]["generation_logprobs"].tolist() == [-1.0] and traj["reward"] == 1.0
    assert [m["role"] for m in single["message_log"]] == ["user", "assistant"] and not single["truncated"]
    assert traj["message_log"][0] is not single["message_log"][0]   # NeMo-RL writes masks into each in place
    assert record["metadata"]["queue_entry"] == "8-0" and record["metadata"]["source_id"] == "q8"
    bare = CompletedGroup("9-0", SourceGroup("q9", "p", 1, {}, (5,)), (Sample(0, (1, 2), (), reward=1.0),),
                          attempt=1, min_version=0)
    with pytest.raises(InvalidInput, match="behaviour logprobs"):
        to_record(bare, 0, as_dict=True)
    unscored = CompletedGroup("9-1", SourceGroup("q9", "p", 1, {}, (5,)), (Sample(0, (1,), (-0.1,)),),
                              attempt=1, min_version=0)
    with pytest.raises(InvalidInput, match="no reward"):
        to_record(unscored, 0, as_dict=True)
