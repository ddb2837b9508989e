"""Weights pushed over torch.distributed (gloo here), the queue as the rendezvous (weights/push.py).

Rounds first, between a trainer and members on threads (every dtype arrives bit for bit; a member
that joined and never takes part costs the round its deadline, not the trainer's run; the retry
round reaches the live members that missed it); then through the shipped worker processes: two
torch workers receive every version by push and generate exactly what the trainer's weights
give, a worker stopped or killed mid-push is dropped, catches up from the folder, and a worker
started mid-run joins the next round.
"""

from __future__ import annotations

import dataclasses
import signal
import socket
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from rollout_queue import RolloutQueue  # noqa: E402
from rollout_queue.core.errors import VersionRegression, WeightsError, WorkerNotLive  # noqa: E402
from rollout_queue.core.models import PushTicket  # noqa: E402
from rollout_queue.weights.push import ALIGN, PushPlan, WeightPush, make_plan, receive  # noqa: E402
from tests.helpers import wait_until  # noqa: E402
from tests.workers.runtime_helpers import open_queue, worker_server  # noqa: E402,F401  # a fixture, used by name

STATE = {
    "f32": torch.randn(33, 7),
    "bf16": torch.randn(5, 3, dtype=torch.bfloat16),
    "f16": torch.randn(11, dtype=torch.float16),
    "i64": torch.arange(9, dtype=torch.int64),
    "u8": torch.randint(0, 255, (13,), dtype=torch.uint8),
    "scalar": torch.tensor(2.5),
    "empty": torch.empty(0, 4),
    "nan": torch.tensor([float("nan"), 1.0]),
}


def same(a: dict[str, Any], b: dict[str, Any]) -> bool:
    return set(a) == set(b) and all(
        a[n].dtype == b[n].dtype and a[n].shape == b[n].shape
        and torch.equal(a[n].reshape(-1).view(torch.uint8), b[n].reshape(-1).view(torch.uint8)) for n in a)


def member(q: RolloutQueue, worker_id: str, out: dict[str, Any], newer_than: int = -1, take_part: bool = True,
           reach: str | None = None, stop: threading.Event | None = None) -> threading.Thread:
    """A worker thread: heartbeats, joins each joinable round until one delivers (as the worker's
    PushFollower does), or, not ``take_part``, joins one and never shows up: a member stopped
    mid-push. ``reach``: the address it connects to instead of the ticket's (one where nothing
    listens: a live worker whose network cannot reach the trainer); ``stop``: set to end its
    tries early. ``out[worker_id]``: what it staged, its ticket, or its last error;
    ``out[(worker_id, "rounds")]``: the epochs it joined; ``out[(worker_id, "ended")]``: when each
    of its receives returned or raised (time.monotonic)."""
    w = q.worker(worker_id)
    w.heartbeat()
    joins: list[int] = out.setdefault((worker_id, "rounds"), [])
    ended: list[float] = out.setdefault((worker_id, "ended"), [])

    def run() -> None:
        deadline, joined = time.monotonic() + 30, 0
        while time.monotonic() < deadline and not (stop is not None and stop.is_set()):
            ticket = w.join_push(0, newer_than)
            if ticket is None or ticket.epoch <= joined:
                time.sleep(0.01)
                continue
            joined = ticket.epoch
            joins.append(joined)
            if not take_part:
                out[worker_id] = ticket
                return
            try:
                out[worker_id] = receive(ticket if reach is None else dataclasses.replace(ticket, addr=reach))
                return
            except WeightsError as exc:
                out[worker_id] = exc
            finally:
                ended.append(time.monotonic())

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


@pytest.fixture
def queue(worker_server: Any) -> RolloutQueue:  # noqa: F811  # the fixture, by name
    return open_queue(worker_server.url, f"push-{uuid.uuid4().hex[:8]}", worker_timeout_s=30)


def test_the_plan_packs_every_dtype_aligned_and_reads_back() -> None:
    plan = make_plan(STATE, world=3, bucket_bytes=256)
    assert PushPlan.from_json(plan.to_json()) == plan
    assert all(e.offset % ALIGN == 0 and e.offset + e.nbytes <= plan.buckets[e.bucket] for e in plan.tensors)
    assert len(plan.buckets) > 1  # 256 bytes per bucket split the 924-byte f32 tensor off
    with pytest.raises(WeightsError):
        PushPlan.from_json(b'{"world": 2}')


def test_a_round_delivers_every_dtype_bit_for_bit_to_every_member(queue: RolloutQueue) -> None:
    push = WeightPush(queue, join_s=5, deadline_s=20, host="127.0.0.1", bucket_bytes=512)
    got: dict[str, Any] = {}
    threads = [member(queue, f"w{i}", got) for i in (1, 2)]
    report = push.push(STATE, 1, "/weights/v0000001")
    for t in threads:
        t.join(10)
    assert sorted(report.acked) == ["w1", "w2"] and not report.dropped
    assert len(report.rounds) == 1 and report.rounds[0].outcome == "done"
    for worker_id in ("w1", "w2"):
        staged = got[worker_id]
        assert staged.version == 1 and staged.uri == "/weights/v0000001"
        assert same(staged.tensors, STATE)
    record = queue.client.hgetall(queue.keys["push"])
    assert record[b"state"] == b"done" and record[b"acked"] == b"2" and record[b"world"] == b"3"
    # Sealed on the second join, not at the end of the 5 s window.
    assert report.seconds < 4


def test_a_member_that_never_takes_part_costs_its_round_and_the_retry_reaches_the_rest(queue: RolloutQueue) -> None:
    """w2 joins and stops (SIGSTOP, in effect): the first round cannot even form its group, so it
    fails for w1 too at its deadline; the retry round, joined by w1 alone, delivers; the trainer
    was never held past the deadlines."""
    push = WeightPush(queue, join_s=2, deadline_s=4, host="127.0.0.1")
    got: dict[str, Any] = {}
    stalled = member(queue, "w2", got, take_part=False)
    live = member(queue, "w1", got)
    began = time.monotonic()
    report = push.push(STATE, 1, "/weights/v0000001")
    took = time.monotonic() - began
    live.join(10)
    stalled.join(10)
    assert isinstance(got["w2"], PushTicket) and got["w2"].epoch == report.rounds[0].epoch
    assert [r.outcome for r in report.rounds] == ["failed", "done"]
    assert report.acked == ("w1",) and report.dropped == ("w2",)
    assert not isinstance(got["w1"], Exception) and same(got["w1"].tensors, STATE)  # from the retry
    assert took < 4 + 4 + 2  # two round deadlines and a little


def nothing_listens() -> str:
    """A loopback address where nothing listens (connecting is refused until the round's deadline)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{s.getsockname()[1]}"


def test_a_live_worker_that_cannot_reach_the_trainer_is_left_out_of_the_retry(queue: RolloutQueue) -> None:
    """Issue 29 item 3: w2 is live (it heartbeats, it joins) but its network cannot reach the
    trainer's rendezvous. The first round fails at its deadline for w1 too (the group cannot form
    without w2); the retry round does not admit w2, so it seals on w1's join and delivers. Before:
    w2 rejoined the retry, both rounds failed, w1 never got the push and the publish cost two
    deadlines."""
    push = WeightPush(queue, join_s=2, deadline_s=4, host="127.0.0.1")
    got: dict[str, Any] = {}
    stop = threading.Event()
    cut_off = member(queue, "w2", got, reach=nothing_listens(), stop=stop)
    healthy = member(queue, "w1", got)
    began = time.monotonic()
    report = push.push(STATE, 1, "/weights/v0000001")
    took = time.monotonic() - began
    healthy.join(10)
    stop.set()
    cut_off.join(10)
    assert [r.outcome for r in report.rounds] == ["failed", "done"]
    assert report.acked == ("w1",) and report.dropped == ("w2",)
    assert not isinstance(got["w1"], Exception) and same(got["w1"].tensors, STATE)
    first, retry = report.rounds
    assert sorted(first.members) == ["w1", "w2"] and retry.members == {"w1": 1}
    assert got[("w2", "rounds")] == [first.epoch]  # the retry refused it (its joins answered None)
    assert first.unreached == ("w2",)
    assert took < 4 + 2 + 2  # one deadline, then a retry that sealed on w1's join


#: How far past its deadline a round may end (its acks are read for 0.05 s, then push_close), and
#: a member may give up: a margin for a machine five times slower, far below one more deadline.
PAST_DEADLINE_S = 1.5


def stall_group(monkeypatch: pytest.MonkeyPatch, rank: int, until_left_s: float | None) -> threading.Event:
    """Make ``rank``'s first group construction stall (a process SIGSTOPped, or gloo hung in C++):
    until ``until_left_s`` before the round's deadline, then it goes on; or, None, until the
    returned event is set (the test sets it at its end), then it fails (so nothing lingers)."""
    from rollout_queue.weights import push as push_module

    real = push_module._group
    release = threading.Event()
    stalled: list[int] = []

    def group(backend: str, store: Any, r: int, world: int, timeout_s: float) -> Any:
        if r == rank and not stalled:
            stalled.append(r)
            if until_left_s is None:
                release.wait()
                raise RuntimeError("the hung group construction was released by the test")
            release.wait(max(0.0, timeout_s - until_left_s))
        return real(backend, store, r, world, timeout_s)

    monkeypatch.setattr(push_module, "_group", group)
    return release


def test_a_late_member_does_not_carry_the_round_past_its_deadline_when_another_is_unreachable(
        queue: RolloutQueue, monkeypatch: pytest.MonkeyPatch) -> None:
    """The chaos run's round 33 (5,000 groups, seed 31: 8.31 s for a 5 s deadline). Ranks 1 and 2
    reach the store; rank 1 stalls (SIGSTOP) before forming the group and resumes 1.5 s before the
    deadline; rank 3 cannot reach the trainer. gloo's constructor waits for each peer's address in
    rank order, each wait with the whole timeout: rank 1 showing up late restarted the clock for
    rank 3, and the trainer and rank 2 ended a timeout after rank 1 resumed (~1.75 deadlines). Now
    the round and every member end at the deadline, and the retry round, after an abandoned group,
    delivers bit for bit."""
    deadline = 6.0
    stall_group(monkeypatch, 1, until_left_s=1.5)
    push = WeightPush(queue, join_s=5, deadline_s=deadline, expect=3, host="127.0.0.1")
    got: dict[str, Any] = {}
    stop = threading.Event()
    began = time.monotonic()
    thread, out = push_in_thread(push, STATE, 1, "/weights/v0000001")
    live = [member(queue, w, got) for w in ("w1", "w2")]
    wait_until(lambda: queue.client.hlen(queue.keys["push_members"]) == 2, 20, message="w1 and w2 joined")
    ghost = member(queue, "ghost", got, reach=nothing_listens(), stop=stop)  # so it takes rank 3
    thread.join(4 * deadline)
    for t in live:
        t.join(10)
    stop.set()
    ghost.join(10)
    report = out["report"]
    first, retry = report.rounds
    assert first.members["ghost"] == 3 and first.outcome == "failed" and first.unreached == ("ghost",)
    assert first.seconds < deadline + PAST_DEADLINE_S, first
    for w in ("w1", "w2"):  # each gave up on the first round by its deadline
        assert got[(w, "ended")][0] - began < deadline + PAST_DEADLINE_S, (w, got[(w, "ended")], first)
        assert not isinstance(got[w], Exception) and same(got[w].tensors, STATE)  # from the retry
    assert retry.outcome == "done" and sorted(retry.acked) == ["w1", "w2"]


@pytest.mark.parametrize("hung", [0, 1], ids=["trainer", "member"])
def test_a_group_that_hangs_costs_its_round_the_deadline_and_no_more(
        queue: RolloutQueue, monkeypatch: pytest.MonkeyPatch, hung: int) -> None:
    """gloo hung for good in one rank's group construction (a peer that accepted the connection
    and froze, a driver stuck): the other ranks time out, and the hung one is abandoned at the
    deadline; the trainer's round and each member's receive end by then, with nothing acked.
    Before: the hung rank's caller waited for as long as the hang lasted."""
    deadline = 4.0
    release = stall_group(monkeypatch, hung, until_left_s=None)
    push = WeightPush(queue, join_s=2, deadline_s=deadline, expect=2, retries=0, host="127.0.0.1")
    got: dict[str, Any] = {}
    stop = threading.Event()  # no second round: the members stop trying after their first
    try:
        began = time.monotonic()
        thread, out = push_in_thread(push, STATE, 1, "/weights/v0000001")
        members = [member(queue, w, got, stop=stop) for w in ("w1", "w2")]
        thread.join(deadline + PAST_DEADLINE_S + 5)
        stop.set()
        for t in members:
            t.join(deadline + PAST_DEADLINE_S + 5)
        assert "report" in out, "the trainer's push never returned"
        (only,) = out["report"].rounds
        assert only.outcome == "failed" and not only.acked and only.seconds < deadline + PAST_DEADLINE_S, only
        for w in ("w1", "w2"):
            assert isinstance(got.get(w), WeightsError), (w, got.get(w), "its receive never returned")
            assert got[(w, "ended")][0] - began < deadline + PAST_DEADLINE_S, (w, got[(w, "ended")])
    finally:
        release.set()


def test_an_id_that_never_heartbeat_cannot_take_a_live_worker_s_place(queue: RolloutQueue) -> None:
    """Issue 29 item 1, through WeightPush and gloo: a never-registered id tries to join the round
    before the live worker does. It is refused, the round waits for w1 and delivers. Before: the id
    took rank 1, the seal (every live worker: one) fixed the world on it, w1 was refused, and the
    round failed at its deadline."""
    push = WeightPush(queue, join_s=5, deadline_s=10, host="127.0.0.1", retries=0)
    ghost = queue.worker("ghost")
    tried: list[Any] = []

    def ghost_joins() -> None:
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            try:
                if ghost.join_push(0) is not None:
                    tried.append("joined")
                    return
            except WorkerNotLive as exc:
                tried.append(exc)
                return
            time.sleep(0.01)

    w1 = queue.worker("w1")
    w1.heartbeat()
    got: dict[str, Any] = {}

    def w1_joins() -> None:
        # Only once the id's join was answered and, had it taken a rank, the trainer sealed on it.
        wait_until(lambda: (tried and isinstance(tried[0], WorkerNotLive))
                   or queue.client.hget(queue.keys["push"], "state") == b"sealed", 20, interval=0.005,
                   message="the id's join answered")
        ticket = w1.join_push(0)
        got["w1"] = receive(ticket) if ticket is not None else None

    threads = [threading.Thread(target=f, daemon=True) for f in (ghost_joins, w1_joins)]
    for t in threads:
        t.start()
    report = push.push(STATE, 1, "/weights/v0000001")
    for t in threads:
        t.join(15)
    assert isinstance(tried[0], WorkerNotLive)
    assert report.rounds[0].members == {"w1": 1} and report.acked == ("w1",)
    assert same(got["w1"].tensors, STATE)


def test_rounds_refuse_what_they_must(queue: RolloutQueue) -> None:
    queue.publish_version(5)
    push = WeightPush(queue, join_s=0.2, deadline_s=2, host="127.0.0.1")
    with pytest.raises(VersionRegression):
        push.push(STATE, 5, "/weights/v5")
    # Nobody joins: the round is empty and ends with its join window.
    report = push.push(STATE, 6, "/weights/v6")
    assert report.rounds[0].outcome == "empty" and not report.acked
    w = queue.worker("late")
    assert w.join_push(0) is None  # the round was closed
    epoch = queue.open_push(7, "/weights/v7", push.addr, "gloo", 5, 10)
    with pytest.raises(WorkerNotLive):  # joinable, but not by an id that never heartbeat
        w.join_push(0, newer_than=6)
    w.heartbeat()
    assert w.join_push(epoch, newer_than=7) is None  # a version the worker holds is not joined
    ticket = w.join_push(0, newer_than=6)
    assert ticket is not None and ticket.rank == 1 and ticket.epoch == epoch
    assert w.join_push(epoch, newer_than=6) == ticket or w.join_push(epoch, newer_than=6).rank == 1
    queue.open_push(8, "/weights/v8", push.addr, "gloo", 5, 10)  # supersedes the round
    assert queue.seal_push(epoch) is None
    assert w.join_push(epoch) is None


def test_a_member_gives_up_at_the_round_deadline_when_the_trainer_is_gone(queue: RolloutQueue) -> None:
    """A ticket whose trainer never sends a plan: receive raises WeightsError by the deadline."""
    push = WeightPush(queue, join_s=1, deadline_s=1.5, host="127.0.0.1")
    epoch = queue.open_push(1, "/w/v1", push.addr, "gloo", 1, 1.5)
    w = queue.worker("w")
    w.heartbeat()
    ticket = w.join_push(epoch)
    assert ticket is not None
    began = time.monotonic()
    with pytest.raises(WeightsError, match="push round"):
        receive(ticket)
    assert time.monotonic() - began < 5


# -- into the engines ------------------------------------------------------------------------------


def push_in_thread(push: WeightPush, state: dict[str, Any], version: int, uri: str) -> tuple[threading.Thread, dict[str, Any]]:
    out: dict[str, Any] = {}
    thread = threading.Thread(target=lambda: out.setdefault("report", push.push(state, version, uri)), daemon=True)
    thread.start()
    return thread, out


def wait_ticket(w: Any, newer_than: int = -1) -> PushTicket:
    box: list[PushTicket] = []
    wait_until(lambda: bool(box.append(t) if (t := w.join_push(0, newer_than)) else False) or bool(box), 20,
               interval=0.01, message="a joinable push round")
    return box[0]


def make_engine(kind: str, model: Path) -> Any:
    if kind == "torch":
        from rollout_queue.workers.engines.torch import TorchEngine

        return TorchEngine(str(model))
    pytest.importorskip("vllm")
    from rollout_queue.workers.engines.vllm import VLLMEngine

    # The default multiprocess mode: the push is received in vLLM's own worker process.
    return VLLMEngine(str(model), multiprocessing=True, max_model_len=1024, max_num_seqs=8,
                      kv_cache_memory_bytes=64 * 2**20)


@pytest.mark.parametrize("kind", ["torch", pytest.param("vllm", marks=pytest.mark.vllm)])
def test_an_engine_generates_after_a_push_exactly_what_it_does_after_a_folder_reload(
        kind: str, queue: RolloutQueue, runner: Any, tiny_model: Path, perturbed_model: Path,
        long_prompt: list[int], tmp_path: Path) -> None:
    """The perturbed model's weights pushed into an engine serving the tiny model, then the same
    weights reloaded from their folder: the greedy tokens agree, over prompts longer than one KV
    block. The push's URI names no folder, so it can only have come from the staged tensors."""
    from transformers import AutoModelForCausalLM

    from rollout_queue.weights import write_version
    from rollout_queue.workers.engines.base import SamplingConfig

    greedy = SamplingConfig(max_tokens=24, temperature=0)
    prompts = [long_prompt, long_prompt[:150]]
    new = AutoModelForCausalLM.from_pretrained(perturbed_model, dtype=torch.float32)
    folder = write_version(tmp_path, 2, model=new)
    engine = make_engine(kind, tiny_model)

    async def generate(tag: str) -> list[list[int]]:
        import asyncio

        outs = await asyncio.gather(*(engine.generate(f"{tag}-{i}", p, greedy) for i, p in enumerate(prompts)))
        return [o.token_ids for o in outs]

    runner.run(engine.start(), timeout=300)
    try:
        before = runner.run(generate("before"), timeout=300)
        w = queue.worker(f"engine-{kind}")
        w.heartbeat()
        push = WeightPush(queue, join_s=10, deadline_s=60, host="127.0.0.1", expect=1)
        thread, out = push_in_thread(push, dict(new.state_dict()), 2, str(tmp_path / "nowhere"))
        ticket = wait_ticket(w)
        runner.run(engine.receive_push(ticket), timeout=120)
        thread.join(60)
        assert out["report"].acked == (f"engine-{kind}",)
        assert runner.run(generate("staged"), timeout=300) == before  # staged, not applied
        runner.run(engine.load_weights(str(tmp_path / "nowhere")), timeout=300)
        pushed = runner.run(generate("pushed"), timeout=300)
        runner.run(engine.load_weights(str(tiny_model)), timeout=300)
        assert runner.run(generate("back"), timeout=300) == before
        runner.run(engine.load_weights(str(folder)), timeout=300)
        reloaded = runner.run(generate("reloaded"), timeout=300)
        assert pushed == reloaded and pushed != before
        # Nothing staged any more: the same URI now means its folder, which does not exist.
        with pytest.raises(WeightsError):
            runner.run(engine.load_weights(str(tmp_path / "nowhere")), timeout=300)
    finally:
        runner.run(engine.close(), timeout=120)


def test_the_scripted_engine_takes_part_in_rounds_only_when_asked(queue: RolloutQueue, runner: Any) -> None:
    """The test engine with ``push=True`` (what the chaos run's shipped workers use) joins a round over
    real gloo like the model engines: it receives and stages, loads the recorded URI from what was
    staged (counted in ``pushed_loads``), and a URI it was not pushed from its folder. Without
    ``push`` it declares no support and refuses a ticket, as before."""
    from rollout_queue.workers.engines.scripted import ScriptedEngine

    plain = ScriptedEngine()
    assert not plain.supports_push
    with pytest.raises(WeightsError, match="push=True"):
        runner.run(plain.receive_push(PushTicket(1, 1, 1, "/w/v1", "127.0.0.1:1", "gloo", 1000)), timeout=10)
    engine = ScriptedEngine(push=True)
    runner.run(engine.start(), timeout=120)
    assert engine.supports_push
    w = queue.worker("scripted")
    w.heartbeat()
    push = WeightPush(queue, join_s=5, deadline_s=20, host="127.0.0.1", expect=1)
    thread, out = push_in_thread(push, {"w": torch.full((64,), 2.0)}, 2, "/weights/v2")
    runner.run(engine.receive_push(wait_ticket(w)), timeout=60)
    thread.join(30)
    assert out["report"].acked == ("scripted",)
    assert runner.run(engine.load_weights("/weights/v3"), timeout=10) and engine.pushed_loads == 0  # not pushed
    assert runner.run(engine.load_weights("/weights/v2"), timeout=10) and engine.pushed_loads == 0  # taken: gone
    thread, out = push_in_thread(push, {"w": torch.full((64,), 4.0)}, 4, "/weights/v4")
    runner.run(engine.receive_push(wait_ticket(w, newer_than=3)), timeout=60)
    thread.join(30)
    assert runner.run(engine.load_weights("/weights/v4"), timeout=10) and engine.pushed_loads == 1
    assert engine.weights_uri == "/weights/v4"
    runner.run(engine.close(), timeout=10)


# -- through the shipped worker processes ----------------------------------------------------------


@pytest.mark.torch
def test_worker_processes_take_pushes_and_a_stopped_or_killed_member_only_misses_its_round(
        worker_server: Any, tiny_model: Path, perturbed_model: Path, tmp_path: Path) -> None:  # noqa: F811
    """``python -m rollout_queue.workers --engine torch`` twice, the trainer publishing with
    ``transport="dist"``. Every version's samples carry it and its behaviour logprobs are the
    trainer's weights'. v3: worker b is SIGSTOPped after joining the round; v4: SIGKILLed after
    joining. Each time the trainer's publish ends within its round deadlines, a gets the version
    by push, b catches up from the folder (after SIGCONT, or restarted), and a worker started
    mid-run joins the next round."""
    import os

    from transformers import AutoModelForCausalLM, AutoTokenizer

    from rollout_queue.core.keys import QueueKeys
    from rollout_queue.weights import WeightPublisher
    from tests.workers.runtime_helpers import serving_workers, spawn_worker, submit, train

    url = worker_server.url
    name = f"wp-{uuid.uuid4().hex[:8]}"
    q = open_queue(url, name, max_staleness=0)
    members_key, push_key = QueueKeys(name)["push_members"], QueueKeys(name)["push"]
    model = AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32).eval()
    new = AutoModelForCausalLM.from_pretrained(perturbed_model, dtype=torch.float32).state_dict()
    tokenizer = AutoTokenizer.from_pretrained(tiny_model)
    push = WeightPush(q, join_s=3, deadline_s=8, host="127.0.0.1")
    publisher = WeightPublisher(q, tmp_path / "weights", transport="dist", push=push)
    publisher.publish(model, 1)  # nobody to push to: written, then recorded
    assert publisher.last is not None and publisher.last.push is not None and not publisher.last.push.acked
    args = ("--engine", "torch", "--model", str(tiny_model), "--max-tokens", "6", "--reward", "length_reward",
            "--seed", "3", "--heartbeat-interval", "0.5")
    workers = {w: spawn_worker(url, name, w, *args) for w in ("a", "b")}
    layers = iter(["model.layers.1.", "model.layers.0.", "model.embed_tokens.", "lm_head.", "model.norm."])

    def generates(version: int, tag: str) -> None:
        submit(q, 2, n=2, prefix=tag, target_len=4)
        _, trained = train(q, {f"{tag}-0", f"{tag}-1"}, timeout=120)
        for group in trained:
            assert {s.version for s in group.samples} == {version}, tag
            sample = group.samples[0]
            ids = tokenizer(group.group.prompt)["input_ids"]
            with torch.no_grad():
                logits = model(torch.tensor([ids + list(sample.token_ids)])).logits[0, len(ids) - 1:-1]
            expected = torch.log_softmax(logits, -1)[torch.arange(len(sample.token_ids)), torch.tensor(sample.token_ids)]
            assert max(abs(a - float(b)) for a, b in zip(sample.logprobs, expected)) < 1e-3, tag

    def publish(version: int, fault: signal.Signals | None = None, victim: str = "b") -> tuple[float, Any]:
        """Publish the next version; with ``fault``, send it to ``victim`` once it joined the round."""
        layer = next(layers)
        model.load_state_dict({**model.state_dict(), **{k: v for k, v in new.items() if k.startswith(layer)}})
        push.expect = 3 if fault else 0  # a fault: keep the window open until it is sent
        began = time.monotonic()
        thread = threading.Thread(target=publisher.publish, args=(model, version), daemon=True)
        thread.start()
        if fault:
            wait_until(lambda: q.client.hget(push_key, "version") == str(version).encode()
                       and q.client.hexists(members_key, victim), 20, interval=0.005, message=f"{victim} joined")
            os.kill(workers[victim].pid, fault)
        thread.join(60)
        assert not thread.is_alive()
        assert publisher.last is not None and publisher.last.push is not None
        return time.monotonic() - began, publisher.last.push

    def pause(worker: str) -> None:
        os.kill(workers[worker].pid, signal.SIGSTOP)

    def resume(worker: str) -> None:
        os.kill(workers[worker].pid, signal.SIGCONT)

    try:
        wait_until(lambda: set(serving_workers(url, name)) >= {"a", "b"}, 120, message="both workers serving")
        took, report = publish(2)
        assert sorted(report.acked) == ["a", "b"] and len(report.rounds) == 1 and took < 3, report
        generates(2, "v2")

        took, report = publish(3, signal.SIGSTOP)  # b stopped mid-push
        assert report.acked == ("a",) and report.dropped == ("b",), report
        assert took < 3 + 8 + 3 + 5  # join window, the failed round's deadline, the retry's window
        generates(3, "v3a")  # a, by push (b is stopped)
        resume("b")
        pause("a")
        generates(3, "v3b")  # b, from the folder
        resume("a")

        took, report = publish(4, signal.SIGKILL)  # b killed mid-push
        assert report.acked == ("a",) and "b" in report.dropped, report
        assert took < 3 + 8 + 3 + 5
        workers["b"].communicate(timeout=30)
        workers["c"] = spawn_worker(url, name, "c", *args)  # started mid-run: adopts v4 from its folder
        wait_until(lambda: "c" in serving_workers(url, name), 120, message="c serving")
        pause("a")
        generates(4, "v4c")
        resume("a")

        took, report = publish(5)  # c joins its first round
        assert sorted(report.acked) == ["a", "c"], report
        generates(5, "v5")
        record = q.client.hgetall(push_key)
        assert record[b"state"] in (b"done", b"partial") and int(record[b"acked"]) == 2

        layer = next(layers)  # the trainer chooses per update: v6 goes by folder only
        model.load_state_dict({**model.state_dict(), **{k: v for k, v in new.items() if k.startswith(layer)}})
        publisher.publish(model, 6, push=False)
        assert publisher.last is not None and publisher.last.push is None
        assert int(q.client.hget(push_key, "epoch")) == int(record[b"epoch"])  # no round opened
        generates(6, "v6")
    finally:
        for proc in workers.values():
            if proc.poll() is None:
                os.kill(proc.pid, signal.SIGCONT)
                proc.terminate()
        errors = {w: proc.communicate(timeout=60)[1] for w, proc in workers.items()}
    for w in ("a", "c"):
        assert workers[w].returncode == 0, errors.get(w, "")[-3000:]
        assert "weights received by push" in errors[w]


def test_operators_see_the_last_round_in_stats(queue: RolloutQueue) -> None:
    """`rollout-queue stats` (text and --json) says how the last push went."""
    from rollout_queue.cli.render import policy_section
    from rollout_queue.cli.status import snapshot_json
    from rollout_queue.ops.views import snapshot

    assert queue.run(snapshot(queue.keys)).push is None
    push = WeightPush(queue, join_s=5, deadline_s=20, host="127.0.0.1")
    got: dict[str, Any] = {}
    thread = member(queue, "w1", got)
    push.push(STATE, 3, "/weights/v0000003")
    thread.join(10)
    snap = queue.run(snapshot(queue.keys))
    assert snap.push is not None and (snap.push.version, snap.push.state, snap.push.acked, snap.push.world) == (
        3, "done", 1, 2)
    rows = dict(policy_section(snap).rows)
    assert rows["last weights push"].startswith("round 1 of version 3: done, 1 of 1 members received it")
    assert snapshot_json(snap)["push"]["state"] == "done"


@pytest.mark.vllm
def test_one_round_reaches_two_vllm_and_two_torch_engines_and_each_then_generates_the_folder_s_tokens(
        queue: RolloutQueue, runner: Any, tiny_model: Path, perturbed_model: Path, long_prompt: list[int],
        tmp_path: Path) -> None:
    """The issue's bar: one push from the trainer to two vLLM engines (each in its own worker
    process, vLLM's default mode) and two torch engines in one round of world 5; each engine's
    greedy tokens after the push equal its tokens after a folder reload of the same weights, over
    prompts longer than one KV block, and all four engines agree."""
    import asyncio

    from transformers import AutoModelForCausalLM

    from rollout_queue.weights import write_version
    from rollout_queue.workers.engines.base import SamplingConfig

    greedy = SamplingConfig(max_tokens=24, temperature=0)
    prompts = [long_prompt, long_prompt[:150]]
    new = AutoModelForCausalLM.from_pretrained(perturbed_model, dtype=torch.float32)
    folder = write_version(tmp_path, 2, model=new)
    engines = {"vllm-1": make_engine("vllm", tiny_model), "vllm-2": make_engine("vllm", tiny_model),
               "torch-1": make_engine("torch", tiny_model), "torch-2": make_engine("torch", tiny_model)}

    async def generate(engine: Any, tag: str) -> list[list[int]]:
        outs = await asyncio.gather(*(engine.generate(f"{tag}-{i}", p, greedy) for i, p in enumerate(prompts)))
        return [o.token_ids for o in outs]

    async def everyone(step: Any) -> dict[str, Any]:
        return dict(zip(engines, await asyncio.gather(*(step(name, e) for name, e in engines.items()))))

    for engine in engines.values():
        runner.run(engine.start(), timeout=300)
    try:
        handles = {name: queue.worker(name) for name in engines}
        for w in handles.values():
            w.heartbeat()
        push = WeightPush(queue, join_s=20, deadline_s=120, host="127.0.0.1")
        thread, out = push_in_thread(push, dict(new.state_dict()), 2, str(tmp_path / "pushed"))

        async def join_and_receive(name: str, engine: Any) -> None:
            ticket = await asyncio.to_thread(wait_ticket, handles[name])
            await engine.receive_push(ticket)

        runner.run(everyone(join_and_receive), timeout=180)
        thread.join(120)
        report = out["report"]
        assert sorted(report.acked) == sorted(engines) and report.rounds[0].members.keys() == engines.keys()
        assert len(report.rounds) == 1 and max(report.rounds[0].members.values()) == 4  # world 5

        async def pushed(name: str, engine: Any) -> list[list[int]]:
            await engine.load_weights(str(tmp_path / "pushed"))  # no such folder: only the staged tensors
            return await generate(engine, "pushed")

        async def reloaded(name: str, engine: Any) -> list[list[int]]:
            await engine.load_weights(str(folder))
            return await generate(engine, "reloaded")

        after_push = runner.run(everyone(pushed), timeout=300)
        after_reload = runner.run(everyone(reloaded), timeout=300)
    finally:
        for engine in engines.values():
            runner.run(engine.close(), timeout=120)
    assert after_push == after_reload
    assert len({str(tokens) for tokens in after_push.values()}) == 1  # vLLM and torch agree (fp32)


def test_announcements_on_the_versions_channel_are_told_apart() -> None:
    from rollout_queue.workers.heartbeat import PushNotice, VersionNotice, parse_announcement

    assert parse_announcement(b"push|7|12") == PushNotice(7, 12)
    assert parse_announcement(b"12|/w/v0000012") == VersionNotice(12, "/w/v0000012")
    assert parse_announcement("12|") == VersionNotice(12, None)
    for garbage in (b"push|x|1", b"push|1", b"push", b"nope", b"|x", "\u00e9|x"):
        assert parse_announcement(garbage) is None
