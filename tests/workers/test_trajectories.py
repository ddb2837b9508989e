"""Multi-turn trajectories through the worker runtime (scripted engine, scripted environments, real Redis).

What is checked: every token of a trajectory (model turns from the engine, observations from the
environment), its loss mask, logprobs (0 on observations) and turn boundaries; the environment's
reward and step record; the limits (turns, token budget, wall clock) ending a trajectory as data;
an environment that raises, hangs or returns garbage failing the attempt with its reason until the
group is dead-lettered; the queue's own drain aborting a trajectory mid-step without counting; and
a worker process SIGKILLed mid-trajectory, after which the group is trained exactly once.
Issue 29: tool calls that never return fail only their own attempts (other trajectories go on, the
worker stops at --env-max-hung, a SIGTERMed worker still exits); a step value that cannot be read
fails only its attempt; token ids outside the vocabulary never reach the buffer; weight updates
landing anywhere (also while environments are built) never stop a worker.
"""

from __future__ import annotations

import asyncio
import signal
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from rollout_queue import Sample, SourceGroup, Turn
from rollout_queue.devtools.local_server import LocalServer
from rollout_queue.workers.engines.base import SamplingConfig
from rollout_queue.workers.engines.scripted import OFFSET, ScriptedEngine
from rollout_queue.workers.environments import EnvironmentHost, load_environment
from rollout_queue.workers.rewards import Scorer
from rollout_queue.core.errors import EnvironmentsHung
from rollout_queue.workers.runtime import WorkerFailed, WorkerOptions, WorkerRuntime
from rollout_queue.workers.trajectory import TrajectoryLimits
from tests.helpers import after_settling, wait_until
from tests.workers import envs
from tests.workers.runtime_helpers import (
    RuntimeThread,
    open_queue,
    pel_owners,
    saved_record,
    serving_workers,
    spawn_worker,
    train,
    worker_server,  # noqa: F401  # a fixture, used by name
)


@pytest.fixture
def url(worker_server: LocalServer) -> str:  # noqa: F811  # the fixture above, by name
    return worker_server.url


@pytest.fixture
def name() -> str:
    return f"t-{uuid.uuid4().hex[:10]}"


@pytest.fixture
def stuck() -> Iterator[None]:
    """envs.Stuck calls hang for the test, and all return once it ended."""
    envs.STUCK.clear()
    yield
    envs.STUCK.set()


def start(url: str, name: str, env: Any, engine: ScriptedEngine | None = None, *, step_timeout_s: float = 5.0,
          limits: TrajectoryLimits | None = None, scorer: Scorer | None = None,
          host_options: dict[str, Any] | None = None, **options: Any) -> RuntimeThread:
    opts = WorkerOptions(**{"block_ms": 200, "sampling": SamplingConfig(max_tokens=32), **options})
    engine = engine or ScriptedEngine(text_fn=envs.turn_text)
    host = EnvironmentHost(env, step_timeout_s=step_timeout_s, **(host_options or {}))
    return RuntimeThread(WorkerRuntime(url, name, engine, opts, worker_id=f"wk-{uuid.uuid4().hex[:6]}",
                                       scorer=scorer, environment=host, trajectory=limits)).start()


def ids(text: str) -> list[int]:
    return [b + OFFSET for b in text.encode()]


def logprob(token: int) -> float:
    """The scripted engine's logprob of a token (ScriptedEngine._resolve)."""
    return -0.1 - (token % 7) / 10


def expected_trajectory(turns: int) -> tuple[list[int], list[int], list[Turn]]:
    """(tokens, loss mask, turns) of a ScriptedTool trajectory of ``turns`` model turns."""
    tokens: list[int] = []
    mask: list[int] = []
    spans: list[Turn] = []
    for i in range(turns):
        model = ids(f"m{i}.")
        tokens += model
        mask += [1] * len(model)
        spans.append(Turn("model", len(model), 0))
        if i + 1 < turns:
            obs = ids(f"<o{i}>")
            tokens += obs
            mask += [0] * len(obs)
            spans.append(Turn("observation", len(obs)))
    return tokens, mask, spans


def check_scripted(s: Sample, turns: int) -> None:
    tokens, mask, spans = expected_trajectory(turns)
    assert list(s.token_ids) == tokens
    assert list(s.loss_mask) == mask
    assert s.turns == tuple(spans)
    assert list(s.logprobs) == pytest.approx([logprob(t) if m else 0.0 for t, m in zip(tokens, mask)], abs=1e-6)
    assert s.reward == pytest.approx(0.25 * (turns - 1) + 1.0)
    assert s.finish_reason == "stop" and s.version == 0
    assert s.metadata is not None and s.metadata["step_rewards"] == [0.25] * (turns - 1) + [1.0]
    assert [step["i"] for step in s.metadata["steps"]] == list(range(turns))


@pytest.mark.parametrize("env", [envs.ScriptedTool, envs.AsyncScriptedTool])
def test_trajectories_have_every_token_mask_logprob_and_turn_boundary(url: str, name: str, env: Any) -> None:
    q = open_queue(url, name)
    q.submit([SourceGroup("three", "Q three", 2, {"turns": 3}), SourceGroup("one", "Q one", 2, {"turns": 1})])
    rt = start(url, name, env)
    committed, trained = train(q, {"three", "one"})
    assert rt.drain() is None
    assert set(committed.values()) == {1}
    by_id = {g.group.source_id: g for g in trained}
    for s in by_id["three"].samples:
        check_scripted(s, 3)
    for s in by_id["one"].samples:
        check_scripted(s, 1)
    cols = by_id["three"].columns()  # the trainer's columnar view carries the same mask
    assert list(cols.loss_mask()) == [b for s in by_id["three"].samples for b in s.loss_mask]


def test_lease_batch_trains_only_the_model_tokens(url: str, name: str) -> None:
    torch = pytest.importorskip("torch")
    from rollout_queue.rl.trainer import lease_batch

    q = open_queue(url, name)
    q.submit([SourceGroup("three", "Q three", 2, {"turns": 3}, prompt_token_ids=(1, 5, 6))])
    rt = start(url, name, envs.ScriptedTool)
    wait_until(lambda: q.stats().completed == 1, 20, message="the trajectory group to complete")
    assert rt.drain() is None
    lease = q.lease(1, block_ms=1000)
    assert lease is not None
    with lease:
        batch = lease_batch(lease)
    tokens, mask, _ = expected_trajectory(3)
    assert batch.response_ids[0].tolist() == tokens
    assert batch.response_mask[0].tolist() == [float(m) for m in mask]
    assert batch.num_response_tokens == 2 * sum(mask)
    assert torch.all(batch.behaviour_logprobs[0][torch.tensor(mask) == 0] == 0)


def test_limits_end_trajectories_as_data(url: str, name: str) -> None:
    q = open_queue(url, name)
    q.submit([SourceGroup("turns", "Q turns", 1)])
    rt = start(url, name, envs.NeverDone, limits=TrajectoryLimits(max_turns=3))
    _, (g,) = train(q, {"turns"})
    assert rt.drain() is None
    (s,) = g.samples
    assert s.finish_reason == "turns" and [t.role for t in s.turns] == ["model", "observation"] * 3
    assert s.reward == pytest.approx(1.5)

    q.submit([SourceGroup("budget", "Q budget", 1)])
    rt = start(url, name, envs.NeverDone, limits=TrajectoryLimits(max_turns=50, max_tokens=20))
    _, (g,) = train(q, {"budget"})
    assert rt.drain() is None
    (s,) = g.samples
    assert s.finish_reason == "length" and len(s.token_ids) == 20  # model turns and observations together

    q.submit([SourceGroup("slow", "Q slow", 1)])
    rt = start(url, name, envs.NeverDone, ScriptedEngine(text_fn=envs.turn_text, latency_s=0.3),
               limits=TrajectoryLimits(max_turns=50, timeout_s=1.0))
    _, (g,) = train(q, {"slow"})
    assert rt.drain() is None
    (s,) = g.samples
    assert s.finish_reason == "deadline" and 1 <= sum(t.trained for t in s.turns) <= 4


def test_the_trajectory_deadline_cuts_a_slow_step_without_blaming_the_environment(url: str, name: str) -> None:
    q = open_queue(url, name, max_attempts=1)
    q.submit([SourceGroup("g", "hang forever", 1)])
    rt = start(url, name, envs.HangingAsync, step_timeout_s=60, limits=TrajectoryLimits(timeout_s=1.0))
    _, (g,) = train(q, {"g"})
    assert rt.drain() is None
    (s,) = g.samples
    assert s.finish_reason == "deadline" and [t.role for t in s.turns] == ["model"] and s.reward == 0.0


def test_oversized_observations_and_unstorable_step_records_keep_the_sample(url: str, name: str) -> None:
    q = open_queue(url, name)
    q.submit([SourceGroup("flood", "Q flood", 1)])
    rt = start(url, name, envs.Flood, limits=TrajectoryLimits(max_tokens=64))
    _, (g,) = train(q, {"flood"})
    assert rt.drain() is None
    (s,) = g.samples
    assert s.finish_reason == "length" and len(s.token_ids) == 64 and s.turns[-1].role == "observation"

    q.submit([SourceGroup("odd", "Q odd", 1)])
    rt = start(url, name, envs.OddInfo)
    _, (g,) = train(q, {"odd"})
    assert rt.drain() is None
    (s,) = g.samples
    assert s.metadata == {"step_rewards": [0.5, 0.5], "steps_dropped": True} and s.reward == 1.0


def test_step_rewards_that_sum_past_a_float_fail_the_attempt(url: str, name: str) -> None:
    q = open_queue(url, name, max_attempts=1)
    q.submit([SourceGroup("big", "Q big", 1)])
    rt = start(url, name, envs.Overflow)
    wait_until(lambda: q.stats().dead == 1, 20, message="the dead letter")
    assert rt.drain() is None
    (letter,) = after_settling(q).dead_letters()
    assert "step rewards sum to inf" in letter.history[-1]["r"]


@pytest.mark.parametrize(("env", "prompt", "reason"), [
    (envs.Raising, "boom", "environment step raised RuntimeError('tool crashed')"),
    (envs.HangingSync, "hang", "environment step exceeded its 0.3 s deadline"),
    (envs.HangingAsync, "hang", "environment step exceeded its 0.3 s deadline"),
    (envs.Garbage, "garbage", "environment step returned dict, not a Step"),
])
def test_a_broken_environment_fails_the_attempt_with_its_reason_until_dead_lettered(
        url: str, name: str, env: Any, prompt: str, reason: str) -> None:
    q = open_queue(url, name, max_attempts=2)
    q.submit([SourceGroup("bad", f"{prompt} here", 2), SourceGroup("ok", "fine", 2)])
    rt = start(url, name, env, step_timeout_s=0.3)
    if env is not envs.Garbage:  # Garbage breaks every trajectory
        committed, _ = train(q, {"ok"})
        assert committed == {"ok": 1}
    wait_until(lambda: q.stats().dead == (2 if env is envs.Garbage else 1), 20, message="the dead letter")
    assert rt.drain() is None
    letter = next(d for d in after_settling(q).dead_letters() if d.source_id == "bad")
    assert letter.attempt == 2 and [h["t"] for h in letter.history] == ["failed", "failed"]
    assert all(reason in h["r"] for h in letter.history), letter.history


def test_a_drain_mid_step_aborts_the_trajectory_uncounted(url: str, name: str) -> None:
    """...and the worker counts the tokens of its finished model turn as generated and thrown away
    (aborted), and of a trajectory trained its model turns only, never the observations."""
    q = open_queue(url, name, max_attempts=1)
    q.submit([SourceGroup("g", "hang then finish", 1)])
    rt = start(url, name, envs.HangingAsync, step_timeout_s=60, drain_timeout_s=0.3)
    wait_until(lambda: q.stats().executing_groups == 1, 10, message="the trajectory to start")
    wait_until(lambda: rt.runtime.engine.finished >= 1, 10, message="the first model turn to finish")
    assert rt.drain() is None  # the drain deadline aborts the step in flight: within the 60 s step timeout
    st = q.stats()
    assert (st.ready, st.dead, st.terminals["aborted"]) == (1, 0, 1)  # max_attempts=1: an abort never counts
    assert rt.runtime.stats.generated["aborted"] == len(ids("m0.")) and sum(rt.runtime.stats.generated.values()) == 3
    rt = start(url, name, envs.ScriptedTool)
    committed, (g,) = train(q, {"g"})
    assert rt.drain() is None
    assert committed == {"g": 1} and g.attempt == 2 and g.samples[0].turns
    assert rt.runtime.stats.generated["completed"] == g.samples[0].model_tokens == len(ids("m0.m1.m2."))
    assert g.samples[0].model_tokens < len(g.samples[0].token_ids)  # the observations were not generated


def test_a_worker_killed_mid_trajectory_is_reaped_and_the_group_trained_once(url: str, name: str) -> None:
    q = open_queue(url, name, worker_timeout_s=0.5)
    q.submit([SourceGroup(f"g{i}", f"Q {i}", 2) for i in range(3)])
    proc = spawn_worker(url, name, "doomed", "--env", "tests.workers.envs:SlowTool")
    try:
        wait_until(lambda: q.stats().executing_groups == 3, 20, message="three trajectories in their first step")
    finally:
        proc.kill()
    proc.communicate()
    assert pel_owners(url, name).get("doomed") == 3
    assert wait_until(lambda: q.reap().lost, 10, message="the reaper to requeue the dead worker's work") == 3
    rt = start(url, name, envs.ScriptedTool)
    committed, trained = train(q, {"g0", "g1", "g2"})
    assert rt.drain() is None
    assert set(committed.values()) == {1} and {g.attempt for g in trained} == {2}
    for g in trained:
        for s in g.samples:
            check_scripted(s, 3)
    assert rt.runtime.stats.continued == 0  # no snapshot/restore: nothing kept, every trajectory restarted
    st = q.stats()
    assert (st.committed, st.dead, st.terminals["lost"]) == (3, 0, 3)


def test_hung_tool_calls_fail_only_their_own_attempts(url: str, name: str, stuck: None) -> None:
    """Issue 29 item 8: 40 synchronous tool calls that never return (more than the 32 threads of the
    pool every trajectory used to share) fail their own attempts; every other trajectory goes on, and
    a drain does not wait for the threads they still hold."""
    q = open_queue(url, name, max_attempts=1)
    q.submit([SourceGroup(f"hang-{i}", f"hang {i}", 1) for i in range(40)])
    rt = start(url, name, envs.Stuck, step_timeout_s=0.3)
    wait_until(lambda: q.stats().dead == 40, 30, message="the hung tool calls to fail their attempts")
    assert all("environment step exceeded its 0.3 s deadline" in d.history[-1]["r"] for d in after_settling(q).dead_letters())
    host = rt.runtime.environment
    assert host is not None and host.hung == 40  # still running, one thread each
    q.submit([SourceGroup(f"ok-{i}", f"fine {i}", 2) for i in range(10)])
    committed, _ = train(q, {f"ok-{i}" for i in range(10)})
    assert set(committed.values()) == {1}
    assert rt.drain() is None
    st = q.stats()
    assert (st.dead, st.committed, st.terminals["lost"]) == (40, 10, 0)


def test_too_many_hung_tool_calls_stop_the_worker_returning_its_work_uncounted(
        url: str, name: str, stuck: None) -> None:
    """Rule 4 of environments.py: only a new process frees hung threads, so at --env-max-hung the
    worker stops (a fatal error that is no group's fault: what it holds goes back uncounted)."""
    q = open_queue(url, name, max_attempts=1)
    q.submit([SourceGroup(f"hang-{i}", f"hang {i}", 1) for i in range(2)])
    rt = start(url, name, envs.Stuck, step_timeout_s=0.3, host_options={"max_hung": 2})
    wait_until(lambda: q.stats().dead == 2, 30, message="the hung tool calls to fail their attempts")
    q.submit([SourceGroup("next", "fine", 2)])
    error = rt.join(30)
    assert isinstance(error, WorkerFailed) and isinstance(error.__cause__, EnvironmentsHung)
    st = q.stats()
    assert (st.dead, st.ready, st.terminals["lost"], st.terminals["aborted"]) == (2, 1, 0, 1)
    assert rt.runtime.worker_id not in pel_owners(url, name)


@pytest.mark.parametrize(("env", "args"), [("Stuck", ()), ("Stubborn", ("--exit-grace", "1"))])
def test_sigterm_during_a_tool_call_that_never_returns_exits_in_bounded_time(
        url: str, name: str, tmp_path: Path, env: str, args: tuple[str, ...]) -> None:
    """Issue 29 item 9: the drain returns the trajectory uncounted and the process exits 0, whatever
    the tool call does: a thread that never returns (no more joined at exit), or a coroutine that
    swallows its cancellation (past --exit-grace the process ends itself)."""
    q = open_queue(url, name, max_attempts=1)
    q.submit([SourceGroup("g", "hang here", 1)])
    mark = tmp_path / "started"
    proc = spawn_worker(url, name, "stuck", "--env", f"tests.workers.envs:{env}", "--env-step-timeout", "600",
                        "--drain-timeout", "0.2", *args, env={"ROLLOUT_TEST_MARK": str(mark)})
    try:
        wait_until(mark.exists, 60, message="the tool call to start")
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, err
    assert "worker closed" in err
    st = q.stats()
    assert (st.ready, st.dead, st.terminals["aborted"]) == (1, 0, 1)


@pytest.mark.parametrize(("kind", "reasons"), [
    ("huge", ("environment step returned reward int 1000000", "rewards must be finite numbers")),
    ("nan", ("environment step returned reward float nan", "rewards must be finite numbers")),
    ("text", ("environment step returned reward str '1.0'", "rewards must be finite numbers")),
    ("ambiguous", ("environment step returned something that cannot be read: ValueError",)),
])
def test_a_step_that_cannot_be_read_fails_only_its_own_attempt(
        url: str, name: str, kind: str, reasons: tuple[str, ...]) -> None:
    """Issue 29 item 10: a reward of 10**400 (no float holds it) or a done flag whose truth raises
    used to raise out of the worker, and every group it held came back counted lost."""
    q = open_queue(url, name, max_attempts=1)
    q.submit([SourceGroup("bad", f"{kind} step", 1), SourceGroup("ok", "fine step", 1)])
    rt = start(url, name, envs.BadStep)
    committed, _ = train(q, {"ok"})
    wait_until(lambda: q.stats().dead == 1, 20, message="the dead letter")
    assert rt.drain() is None  # the worker lived through it
    (letter,) = after_settling(q).dead_letters()
    assert letter.source_id == "bad" and all(r in letter.history[-1]["r"] for r in reasons), letter.history
    assert committed == {"ok": 1} and q.stats().terminals["lost"] == 0


@pytest.mark.parametrize("max_turns", [1, 3])
def test_token_ids_outside_the_vocabulary_never_reach_the_buffer(url: str, name: str, max_turns: int) -> None:
    """Issue 29 item 11: an observation holding an id the model cannot embed (here after the last
    model turn, or between turns) fails the attempt, counted; the trainer never sees it."""
    q = open_queue(url, name, max_attempts=1)
    q.submit([SourceGroup("g", "Q", 1)])
    rt = start(url, name, envs.OutOfVocabulary, limits=TrajectoryLimits(max_turns=max_turns))
    wait_until(lambda: q.stats().dead == 1, 20, message="the dead letter")
    assert rt.drain() is None
    st = q.stats()
    assert (st.completed, st.committed, st.terminals["failed"]) == (0, 0, 1)
    (letter,) = after_settling(q).dead_letters()
    assert "observation holds token id 1000, outside the model's vocabulary of 259" in letter.history[-1]["r"]


class SmallVocabulary(ScriptedEngine):
    """A model whose every generated id is past its vocabulary (an engine gone wrong)."""

    @property
    def vocab_size(self) -> int:
        return OFFSET


def test_a_model_turn_outside_the_vocabulary_fails_the_attempt(url: str, name: str) -> None:
    q = open_queue(url, name, max_attempts=1)
    q.submit([SourceGroup("g", "Q", 1)])
    rt = start(url, name, envs.ScriptedTool, SmallVocabulary(text_fn=envs.turn_text))
    wait_until(lambda: q.stats().dead == 1, 20, message="the dead letter")
    assert rt.drain() is None
    assert "the engine returned token id 112, outside its vocabulary of 3" in after_settling(q).dead_letters()[0].history[-1]["r"]


def test_weight_updates_landing_anywhere_in_trajectories_never_stop_a_worker(url: str, name: str) -> None:
    """Issue 29 item 13, its reproduction: two scripted-engine worker processes (--weights-mode abort,
    the default then; continue is now), a two-turn environment whose constructor blocks 50 ms, a trainer publishing a
    version per commit. Updates land while environments are built, stepped and between turns: each
    aborts its trajectories uncounted, no worker dies, nothing is lost, every group trains once."""
    q = open_queue(url, name)
    expected = {f"g{i}" for i in range(20)}
    q.submit([SourceGroup(g, f"Q {g}", 2, {"turns": 2}) for g in sorted(expected)])
    # Two groups at a time each, so trajectories are always in flight when a version is published.
    procs = [spawn_worker(url, name, f"w{i}", "--env", "tests.workers.envs:SlowBuild", "--max-samples", "4",
                          "--weights-mode", "abort")
             for i in range(2)]
    try:
        wait_until(lambda: len(serving_workers(url, name)) == 2, 60, message="both workers to serve")
        versions = iter(range(1, 1000))

        def publish(_: int) -> None:
            version = next(versions)
            q.publish_version(version, f"file:///weights/v{version}")

        committed, _ = train(q, expected, timeout=120, step=publish)
        assert [p.poll() for p in procs] == [None, None]  # both still serving
    finally:
        for p in procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        errs = [p.communicate(timeout=60)[1] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], errs
    assert set(committed.values()) == {1}
    st = q.stats()
    assert (st.dead, st.terminals["lost"], st.terminals["failed"]) == (0, 0, 0)
    assert st.terminals["aborted"] > 0  # the updates did abort trajectories


def test_a_model_turn_cancelled_with_its_attempt_frees_its_engine_slot(url: str, name: str) -> None:
    """The chaos stall (seeds 41, 42): one slot's environment fails while a sibling slot's model turn
    runs, so the attempt cancels that turn. The scripted engine used to keep the cancelled request's
    running slot for ever (the cancellation cancelled its future, and abort skips a done future);
    with every slot leaked, each later trajectory waited out its deadline (30 s in the chaos run)
    and the worker reserved nothing more. Here two slots (both turns of the attempt run at once),
    one such attempt, then a healthy group."""
    def latency(prompt: str, request_id: str) -> float:  # the sibling's turn runs when slot 0 fails
        return 60.0 if "boom" in prompt and request_id.endswith("/1#0") else 0.0

    q = open_queue(url, name, max_attempts=1)
    engine = ScriptedEngine(text_fn=envs.turn_text, max_concurrency=2, latency_fn=latency)
    q.submit([SourceGroup("bad", "boom here", 2)])
    rt = start(url, name, envs.Raising, engine)
    wait_until(lambda: q.stats().dead == 1, 20, message="the failing attempt")
    assert "tool crashed" in after_settling(q).dead_letters()[0].history[-1]["r"]
    wait_until(lambda: engine.running == 0, 20, message="the cancelled turn to give its slot back")
    assert engine.aborted == 1  # aborted inside the engine, as base.py's rules say a cancellation does
    q.submit([SourceGroup("ok", "fine", 1)])
    committed, _ = train(q, {"ok"}, timeout=20)
    assert rt.drain() is None
    assert committed == {"ok": 1}


def test_a_cancelled_scripted_request_is_aborted_and_frees_its_slot() -> None:
    """The engine rule behind the test above, without Redis: cancelling ``generate`` aborts the
    request in the engine, so the next one runs at once."""
    async def go() -> None:
        engine = ScriptedEngine(max_concurrency=1, latency_s=60.0)
        await engine.start()
        first = asyncio.ensure_future(engine.generate("a", [1, 5], SamplingConfig(max_tokens=4)))
        await asyncio.sleep(0)  # admitted: it holds the one slot
        assert engine.running_ids == {"a"}
        first.cancel()
        with pytest.raises(asyncio.CancelledError):
            await first
        assert (engine.running, engine.aborted) == (0, 1)
        engine.latency_s = 0.0
        out = await asyncio.wait_for(engine.generate("b", [1, 5], SamplingConfig(max_tokens=4)), 30)
        assert out.finish_reason != "abort"
        await engine.close()

    asyncio.run(go())


def test_load_environment_names_what_to_fix() -> None:
    assert load_environment("echo").__name__ == "Echo"
    assert load_environment("tests.workers.envs:ScriptedTool") is envs.ScriptedTool
    with pytest.raises(ValueError, match="not a built-in"):
        load_environment("nope")
    with pytest.raises(ValueError, match="cannot import"):
        load_environment("no_such_module_xyz:Env")


# -- progress: trajectories resumed from their last complete turn (rule 6 of trajectory.py) -----------

def check_resumed(g: Any, record: dict[int, Sample]) -> int:
    """Each sample of ``g``: the saved turn 0 and its observation, then turn 1 generated after a restore
    (the environment's ``ran`` went on from the snapshot). Returns the tokens taken from the record."""
    for s in g.samples:
        prefix = record[s.slot]
        k = len(prefix.token_ids)
        assert s.token_ids[:k] == prefix.token_ids and s.logprobs[:k] == prefix.logprobs
        assert s.turns[:2] == prefix.turns and [t.role for t in s.turns] == ["model", "observation", "model"]
        assert list(s.token_ids[k:]) == ids("m1.")  # the model saw the restored observation
        assert s.metadata is not None and "env" not in s.metadata
        assert s.metadata["step_rewards"] == [0.25, 1.0] and s.reward == pytest.approx(1.25)
        assert [step["ran"] for step in s.metadata["steps"]] == [[0], [0, 1]]  # restored, not reset
        assert s.finish_reason == "stop" and s.version == 0
    return sum(len(record[s.slot].token_ids) for s in g.samples)


def check_checkpoint(record: dict[int, Sample]) -> None:
    assert sorted(record) == [0, 1]
    for s in record.values():
        assert [t.role for t in s.turns] == ["model", "observation"] and s.finish_reason == "abort"
        assert s.metadata is not None and s.metadata["env"] == {"turns": 2, "ran": [0]}


def test_a_trajectory_killed_in_its_slow_tool_call_resumes_from_its_last_complete_turn(url: str, name: str) -> None:
    """The shipped worker saves each trajectory's checkpoint (its turns and the environment's
    snapshot) periodically; SIGKILLed during the slow second tool call, its group is reaped and
    another worker restores the environment and generates only the second model turn."""
    q = open_queue(url, name, worker_timeout_s=1)
    [eid] = q.submit([SourceGroup("g", "Q", 2, {"turns": 2})])
    proc = spawn_worker(url, name, "doomed", "--env", "tests.workers.envs:Resumable", "--save-progress-every-s", "0.3",
                        env={"ROLLOUT_TEST_SLOW_TOOL": "1"})
    try:
        wait_until(lambda: len(saved_record(url, name, eid, 2)) == 2, 30, message="both checkpoints saved")
    finally:
        proc.kill()  # SIGKILL during the slow tool call: only the periodic saves are left
    proc.communicate()
    record = saved_record(url, name, eid, 2)
    check_checkpoint(record)
    assert wait_until(lambda: q.reap().lost, 10, message="the reaper to requeue the dead worker's group") == 1
    rt = start(url, name, envs.Resumable)
    _, [g] = train(q, {"g"})
    assert rt.drain() is None and g.attempt == 2
    assert rt.runtime.stats.continued == check_resumed(g, record)
    assert rt.runtime.stats.generated["completed"] == 2 * len(ids("m1."))  # only the second model turns


def test_a_drained_trajectory_aborts_with_its_checkpoint_and_the_next_attempt_resumes_it(
        url: str, name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The abort path: a drain past its deadline aborts the trajectories in their slow tool call, and
    the abort carries their checkpoints (no periodic save involved)."""
    q = open_queue(url, name)
    [eid] = q.submit([SourceGroup("g", "Q", 2, {"turns": 2})])
    monkeypatch.setenv("ROLLOUT_TEST_SLOW_TOOL", "1")
    engine = ScriptedEngine(text_fn=envs.turn_text)
    first = start(url, name, envs.Resumable, engine, drain_timeout_s=0.0, save_progress_every_s=0)
    # Both second model turns done: both trajectories are in their slow tool call, checkpointed before.
    wait_until(lambda: engine.finished == 4, 20, message="both trajectories in their slow tool call")
    assert first.drain() is None
    record = saved_record(url, name, eid, 2)
    check_checkpoint(record)
    monkeypatch.delenv("ROLLOUT_TEST_SLOW_TOOL")
    second = start(url, name, envs.Resumable)
    _, [g] = train(q, {"g"})
    assert second.drain() is None and g.attempt == 2
    assert second.runtime.stats.continued == check_resumed(g, record)
    st = q.stats()
    assert (st.terminals["aborted"], st.partial_records, st.counters["partial_continued"]) == (1, 0, sum(
        len(s.token_ids) for s in record.values()))


def test_a_checkpoint_keeps_matching_its_turns_after_the_trajectory_goes_on() -> None:
    """A checkpoint is what an abort or a save sends while the trajectory runs on: the next step's
    reward and record must not leak into it (a record whose rewards outnumber its model turns would
    not resume), and it resumes to the same turns."""
    from rollout_queue.workers.attempt import to_sample
    from rollout_queue.workers.trajectory import _Trajectory

    t = _Trajectory(vocab_size=300)
    t.model_turn((10, 11), (-0.5, -0.25), (0,))
    t.step(0.25, {"tool": "probe"})
    t.observe([20, 21, 22], 100)
    cp = t.checkpoint({"memory": [1, 2]})
    t.model_turn((12,), (-1.0,), (0,))
    t.step(1.0, {"tool": "finish"})
    assert cp.metadata == {"step_rewards": [0.25], "steps": [{"tool": "probe"}], "env": {"memory": [1, 2]}}
    saved = to_sample(0, cp, None)
    again = _Trajectory(vocab_size=300)
    assert again.can_resume(saved) and again.resume(saved) == 1
    assert (again.token_ids, again.turns, again.rewards) == ([10, 11, 20, 21, 22], list(saved.turns), [0.25])
