"""Partial rollouts through the worker runtime (issue 30 section 1; DESIGN: Partial rollouts).

An attempt cut short for a reason that is not its group's fault (a weight update in abort mode, a
drain) hands its samples so far back with the abort; the next attempt, on any worker, continues each
sample from them: the trained sample is the prefix plus the continuation, with one segment per
version, and every token is generated once. Each test here fails on a build without progress
records (the next attempt regenerated every sample from the prompt).
"""

from __future__ import annotations

import json
import signal
import struct
import uuid
from pathlib import Path
from typing import Any

import pytest


from rollout_queue import CompletedGroup, RolloutQueue, Sample, SourceGroup
from rollout_queue.devtools.local_server import LocalServer
from rollout_queue.workers.engines.base import SamplingConfig
from rollout_queue.workers.engines.scripted import ScriptedEngine
from rollout_queue.workers.runtime import WorkerOptions, WorkerRuntime
from tests.helpers import wait_until
from tests.workers.runtime_helpers import (
    RuntimeThread,
    open_queue,
    pel_owners,
    saved_record,
    spawn_worker,
    submit,
    train,
    worker_server,  # noqa: F401  # a fixture, used by name
)
from tests.workers.test_runtime_process import drain_once, finish

MAX_TOKENS = 20


@pytest.fixture
def url(worker_server: LocalServer) -> str:  # noqa: F811  # the fixture above, by name
    return worker_server.url


@pytest.fixture
def name() -> str:
    return f"p-{uuid.uuid4().hex[:10]}"


def start(url: str, name: str, engine: ScriptedEngine, **options: Any) -> RuntimeThread:
    opts = WorkerOptions(**{"block_ms": 200, "sampling": SamplingConfig(max_tokens=MAX_TOKENS), **options})
    return RuntimeThread(WorkerRuntime(url, name, engine, opts, worker_id=f"wk-{uuid.uuid4().hex[:6]}")).start()


def check_continued(trained: list[CompletedGroup], before: int, after: int) -> None:
    """Every sample: MAX_TOKENS tokens, its first half at version ``before``, the rest at ``after``."""
    for g in trained:
        assert g.attempt == 2
        for s in g.samples:
            assert len(s.token_ids) == MAX_TOKENS == len(s.logprobs)
            assert (s.version, s.versions, s.segments) == (before, (before, after), ((0, before), (10, after)))
            assert s.token_versions == (before,) * 10 + (after,) * 10


def test_an_attempt_aborted_by_a_weight_update_is_continued_not_restarted(url: str, name: str) -> None:
    q = open_queue(url, name, max_staleness=2)
    submit(q, 2, n=2)
    engine = ScriptedEngine(hang=True, tokens=MAX_TOKENS, abort_share=0.5)
    rt = start(url, name, engine, weights_mode="abort")
    wait_until(lambda: engine.running == 4, 10)
    engine.hang = False  # the continuations finish normally
    q.publish_version(1, "file:///weights/v1")
    _, trained = train(q, {"g-0", "g-1"})
    check_continued(trained, 0, 1)
    stats = rt.runtime.stats
    assert rt.drain() is None
    # Every trained token was generated once: 10 per sample before the update, 10 after.
    assert (stats.generated["aborted"], stats.generated["completed"], stats.continued) == (40, 40, 40)
    st = q.stats()
    assert (st.counters["partial_continued"], st.counters["partial_saved"]) == (40, 2)
    assert (st.partial_records, st.counters["partial_bytes"], st.terminals["aborted"]) == (0, 0, 2)


def test_a_drained_workers_attempts_are_continued_by_another_worker(url: str, name: str) -> None:
    q = open_queue(url, name, max_staleness=2)
    submit(q, 1, n=2)
    first = ScriptedEngine(hang=True, tokens=MAX_TOKENS, abort_share=0.5)
    rt1 = start(url, name, first, drain_timeout_s=0.0)
    wait_until(lambda: first.running == 2, 10)
    assert rt1.drain() is None  # SIGTERM's path: the drain deadline aborts what still generates
    assert q.stats().partial_records == 1
    q.publish_version(2, "file:///weights/v2")  # within max_staleness of the prefix; the next worker starts on v3 (adopted before it reserves)
    second = ScriptedEngine(tokens=MAX_TOKENS)
    rt2 = start(url, name, second)
    _, trained = train(q, {"g-0"})
    assert rt2.drain() is None and second.loads == ["file:///weights/v2"]
    check_continued(trained, 0, 2)
    assert rt2.runtime.stats.continued == 20 and rt2.runtime.stats.generated["completed"] == 20


def test_a_prefix_older_than_the_staleness_bound_is_regenerated(url: str, name: str) -> None:
    q = open_queue(url, name, max_staleness=None)  # strictly on-policy: no prefix of an older version
    submit(q, 1, n=2)
    engine = ScriptedEngine(hang=True, tokens=MAX_TOKENS, abort_share=0.5)
    rt = start(url, name, engine, weights_mode="abort")
    wait_until(lambda: engine.running == 2, 10)
    engine.hang = False
    q.publish_version(1, "file:///weights/v1")
    _, trained = train(q, {"g-0"})
    assert rt.drain() is None
    for s in trained[0].samples:
        assert (len(s.token_ids), s.version, s.segments) == (MAX_TOKENS, 1, ())
    st = q.stats()
    assert (st.counters["partial_stale"], st.counters.get("partial_continued", 0)) == (20, 0)


def _head(q: Any, key: str, eid: str) -> tuple[int, int]:
    """(attempt, tokens) of an entry's progress record head ((0, 0): none)."""
    raw = q.client.hget(key, eid)
    if not raw:
        return (0, 0)
    attempt, tokens, *_ = raw.decode().split("|")
    return int(attempt), int(tokens)


def test_the_worker_process_continues_across_a_weight_update_and_a_sigterm_drain(url: str, name: str) -> None:
    """The shipped worker: aborted by a weight update in abort mode (10 tokens of 20 kept at v0), it
    continues at v1 and is drained by SIGTERM (5 more kept); a second worker process finishes each
    sample. The trained sample is the first attempts' tokens plus the last one's, with segments over
    both versions, and the fleet generated exactly the tokens trained."""
    q = open_queue(url, name, max_staleness=2)
    [eid] = submit(q, 1, n=2)
    hanging = ("--engine-arg", "hang=true", "--engine-arg", "abort_share=0.5", "--engine-arg", f"tokens={MAX_TOKENS}",
               "--max-tokens", str(MAX_TOKENS), "--weights-mode", "abort", "--drain-timeout", "0", "--json-logs",
               "--save-progress-every-s", "0.1")
    first = spawn_worker(url, name, "first", *hanging)
    try:
        wait_until(lambda: pel_owners(url, name).get("first") == 1, 20, message="the first attempt reserved")
        q.publish_version(1, "file:///weights/v1")  # abort mode: the attempt is aborted, its progress kept
        wait_until(lambda: q.stats().counters.get("partial_continued", 0) == 20, 20,
                   message="the aborted attempt continued by the same worker")
        # SIGTERM once the continuation runs in the engine: its periodic save holds the 10 tokens it
        # took over plus what it has generated (the scripted engine keeps half of the 10 left, 5 a
        # sample). Executing alone is not enough: a drain between the reservation and the engine's
        # first step keeps only the 10 (seen on a loaded machine: partial_continued 40, not 50).
        head = q.keys["partial_head"]
        code, err = drain_once(first, lambda: q.stats().executing_groups == 1 and _head(q, head, eid)[:2] == (2, 30),
                               "the continuation running in the engine")
    finally:
        first.kill()
    assert code == 0, err
    assert q.stats().partial_records == 1
    second = spawn_worker(url, name, "second", "--engine-arg", f"tokens={MAX_TOKENS}", "--max-tokens", str(MAX_TOKENS),
                          "--json-logs")
    try:
        _, trained = train(q, {"g-0"})
        second.send_signal(signal.SIGTERM)
        code, err2 = finish(second)
    finally:
        second.kill()
    assert code == 0, err2
    [g] = trained
    assert (g.entry_id, g.attempt) == (eid, 3)
    for s in g.samples:
        assert len(s.token_ids) == MAX_TOKENS == len(s.logprobs)
        assert (s.version, s.versions, s.segments) == (0, (0, 1), ((0, 0), (10, 1)))
    st = q.stats()
    # 2 x 10 handed to the continuation at v1, then 2 x 15 to the second worker.
    assert (st.counters["partial_continued"], st.terminals["aborted"], st.partial_records) == (50, 2, 0)
    generated = [json.loads(line) for line in (err + err2).splitlines() if line.startswith("{")]
    closed = [e for e in generated if e.get("msg") == "worker closed"]
    assert len(closed) == 2
    made = sum(v for e in closed for k, v in e.items() if k.startswith("tokens_"))
    assert made == 2 * MAX_TOKENS  # every trained token generated once, nothing thrown away


PREFIX = 6  # tokens the version-0 attempt had when it was cut short


def greedy_prefix(model_dir: Path, prompt: list[int], count: int) -> tuple[tuple[int, ...], tuple[float, ...]]:
    """``count`` greedy tokens under the weights in ``model_dir`` and their raw logprobs (float32, as
    the queue stores them): what a version-0 attempt had generated when the abort came."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    ids, lps = list(prompt), []
    with torch.no_grad():
        for _ in range(count):
            row = torch.log_softmax(model(torch.tensor([ids])).logits[0, -1], -1)
            ids.append(int(row.argmax()))
            lps.append(float(row.max()))
    return tuple(ids[len(prompt):]), tuple(struct.unpack(f"<{count}f", struct.pack(f"<{count}f", *lps)))


def forced_rows(model_dir: Path, prompt: list[int], tokens: tuple[int, ...]) -> Any:
    """log p(. | prompt + tokens[:i]) for every i under the weights in ``model_dir``: one forward
    pass, as a trainer recomputes them (rows of log-softmax over the vocabulary)."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    with torch.no_grad():
        logits = model(torch.tensor([prompt + list(tokens)])).logits[0, len(prompt) - 1:-1]
    return torch.log_softmax(logits, -1)


@pytest.mark.torch
def test_the_torch_engine_continues_a_version_0_prefix_under_version_1(
        url: str, name: str, tiny_model: Path, perturbed_model: Path) -> None:
    """A prefix saved under version 0 (the tiny model), continued by a TorchEngine worker on version 1
    (the perturbed model): the engine's prompt is prompt + prefix, so the new tokens are version 1's
    greedy continuation of it with version 1's logprobs, and the prefix keeps version 0's."""
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from transformers import AutoTokenizer

    from rollout_queue.workers.engines.torch import TorchEngine

    text = "What is 12 plus 30?"
    prompt = AutoTokenizer.from_pretrained(tiny_model)(text)["input_ids"]
    q = open_queue(url, name, max_staleness=2)
    q.submit([SourceGroup("g-0", text, 2)])
    prefix, prefix_lps = greedy_prefix(tiny_model, prompt, PREFIX)
    hand = q.worker("wk-v0")
    [res] = hand.reserve(1)
    saved = Sample(slot=0, token_ids=prefix, logprobs=prefix_lps, version=0, finish_reason="abort")
    assert hand.abort(res.receipt, "weight update", progress=[saved]) == "ready"  # slot 1 had nothing yet
    hand.close()
    q.publish_version(1, str(perturbed_model))
    options = WorkerOptions(block_ms=200, sampling=SamplingConfig(max_tokens=MAX_TOKENS, temperature=0))
    rt = RuntimeThread(WorkerRuntime(url, name, TorchEngine(str(tiny_model), max_batch_size=8), options,
                                     worker_id=f"wk-{uuid.uuid4().hex[:6]}")).start()
    try:
        _, [g] = train(q, {"g-0"}, timeout=120)
    finally:
        error = rt.drain(timeout=60)
    assert error is None and rt.runtime.loaded_version == 1
    continued, fresh = g.samples
    new = continued.token_ids[PREFIX:]
    assert continued.token_ids[:PREFIX] == prefix and continued.logprobs[:PREFIX] == prefix_lps
    assert len(continued.token_ids) == MAX_TOKENS == len(continued.logprobs) and len(new) >= 1
    assert (continued.version, continued.versions, continued.segments) == (0, (0, 1), ((0, 0), (PREFIX, 1)))
    assert continued.token_versions == (0,) * PREFIX + (1,) * len(new)
    assert (fresh.version, fresh.segments, len(fresh.token_ids)) == (1, (), MAX_TOKENS)  # no progress: from the prompt
    # The new tokens are what version 1 computes given prompt + prefix: its greedy picks, its logprobs.
    rows = forced_rows(perturbed_model, prompt, continued.token_ids)[PREFIX:]
    assert [int(i) for i in rows.argmax(-1)] == list(new)
    picked = [float(rows[i, t]) for i, t in enumerate(new)]
    assert max(abs(a - b) for a, b in zip(picked, continued.logprobs[PREFIX:])) < 1e-3
    # The prefix's logprobs are version 0's (kept, not recomputed); the new ones are not version 0's.
    old = forced_rows(tiny_model, prompt, continued.token_ids)
    assert max(abs(float(old[i, t]) - lp) for i, (t, lp) in enumerate(zip(prefix, prefix_lps))) < 1e-4
    assert max(abs(float(old[PREFIX + i, t]) - lp) for i, (t, lp) in enumerate(
        zip(new, continued.logprobs[PREFIX:]))) > 1e-2
    st = q.stats()
    assert (st.partial_records, st.counters["partial_bytes"], st.counters["partial_continued"]) == (0, 0, PREFIX)
    assert rt.runtime.stats.continued == PREFIX


# -- periodic saves (--save-progress-every-s) --------------------------------------------------------

def test_an_attempt_still_generating_saves_its_progress_and_its_completion_drops_it(url: str, name: str) -> None:
    """While the attempt runs (its requests hang), each interval saves the engine's tokens so far; the
    record is this attempt's, and the completion that follows drops it."""
    q = open_queue(url, name)
    [eid] = submit(q, 1, n=2)
    engine = ScriptedEngine(hang=True, tokens=MAX_TOKENS, abort_share=0.5)
    rt = start(url, name, engine, save_progress_every_s=0.2)
    wait_until(lambda: len(saved_record(url, name, eid, 2)) == 2, 20, message="a periodic save of both slots")
    record = saved_record(url, name, eid, 2)
    assert q.stats().executing_groups == 1  # saved on its way, not at an end
    params = SamplingConfig(max_tokens=MAX_TOKENS)
    for slot, s in record.items():
        assert (len(s.token_ids), s.finish_reason, s.version, s.reward) == (10, "abort", 0, None)
        # the first half of what the engine is generating for that slot's request, in order
        assert s.token_ids == engine.tokens_for(f"{eid}/1/{slot}", "What is 0 plus 0?", params)[:10]
    rt.on_loop(engine.finish_hanging)
    _, [g] = train(q, {"g-0"})
    assert rt.drain() is None
    for s in g.samples:
        assert s.token_ids[:10] == record[s.slot].token_ids and len(s.token_ids) == MAX_TOKENS
    st = q.stats()
    assert (st.partial_records, st.counters["partial_bytes"], g.attempt) == (0, 0, 1)


def test_a_sigkilled_worker_loses_at_most_one_interval_another_continues_from_its_save(url: str, name: str) -> None:
    """The shipped worker generates slowly (40 tokens over 20 s a sample) and saves its progress every
    0.5 s; SIGKILLed past several intervals it settles nothing, the reaper requeues the group, and a
    worker on version 1 continues each sample from the last save: the trained sample starts with the
    saved tokens and logprobs at version 0, and the rest is version 1's."""
    q = open_queue(url, name, worker_timeout_s=1, max_staleness=2)
    [eid] = submit(q, 1, n=2)
    slow = spawn_worker(url, name, "doomed", "--engine-arg", "tokens=40", "--engine-arg", "latency_s=20",
                        "--max-tokens", "40", "--save-progress-every-s", "0.5")
    try:
        wait_until(lambda: (r := saved_record(url, name, eid, 2)) and min(len(s.token_ids) for s in r.values()) >= 3
                   and len(r) == 2, 30, message="saves of both slots past one interval")
    finally:
        slow.kill()  # SIGKILL: no abort, no close; only the periodic saves are left
    slow.communicate()
    record = saved_record(url, name, eid, 2)
    assert q.stats().executing_groups == 1 and pel_owners(url, name).get("doomed") == 1
    q.publish_version(1, "file:///weights/v1")
    assert wait_until(lambda: q.reap().lost, 10, message="the reaper to requeue the dead worker's group") == 1
    rt = start(url, name, ScriptedEngine(tokens=40), sampling=SamplingConfig(max_tokens=40))
    _, [g] = train(q, {"g-0"})
    assert rt.drain() is None
    assert g.attempt == 2
    for s in g.samples:
        prefix = record[s.slot]
        k = len(prefix.token_ids)
        assert prefix.version == 0 and prefix.finish_reason == "abort" and k >= 3
        assert s.token_ids[:k] == prefix.token_ids and s.logprobs[:k] == prefix.logprobs
        assert len(s.token_ids) == 40 == len(s.logprobs)
        assert (s.version, s.versions, s.segments) == (0, (0, 1), ((0, 0), (k, 1)))
        assert s.token_versions == (0,) * k + (1,) * (40 - k)
    saved = sum(len(s.token_ids) for s in record.values())
    assert rt.runtime.stats.continued == saved and rt.runtime.stats.generated["completed"] == 80 - saved
    st = q.stats()
    assert (st.counters["partial_continued"], st.terminals["lost"], st.partial_records) == (saved, 1, 0)
