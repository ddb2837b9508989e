"""Kill -> trainer error: how long a trainer waits once every worker is SIGKILLed (issue 31, section 5).

Each scenario runs real ``rollout-queue worker`` processes on a private Redis, lets the trainer
commit a few steps, SIGKILLs every worker at once and times how long the trainer takes to raise
WorkersGone (core/liveness.py). Before, the same trainer waited ``wait_s`` (600 s by default) or,
in a bare lease loop, for ever. The documented bound is ``worker_timeout_s + grace_s`` after the
last heartbeat plus two waits (``block_ms``); the figure printed beside each is that bound.

- ``stream``: TrainingStream in this process, two scripted-engine workers;
- ``ranks``: RankedStream over two gloo rank processes (tests/integrations/rank_trainer.py), two
  scripted-engine workers; timed to the last rank's error (rank 0: WorkersGone, rank 1: RankFailed
  carrying its text);
- ``slime``: slime's rollout function (``generate_rollout`` over ``QueueDataSource``), two
  scripted-engine workers;
- ``miles``: miles' fully-async buffer (``QueueDataBuffer.get``) fed by two scripted-engine workers
  (needs miles: ``$MILES_SRC``, scripts/test_frameworks.sh miles);
- ``nemo-rl``: NeMo-RL's ``create_sampler`` over the queue sampler (integrations/nemo_rl), its own
  ``TQReplayBuffer`` and data plane, two scripted-engine workers (needs NeMo-RL: run it in the side
  environment of scripts/test_frameworks.sh nemo-rl);
- ``verl``: verl 0.9.1's V1 sampler (``QueueReplayBuffer.sample``, built by verl from the documented
  config, TransferQueue on a local Ray), two scripted-engine workers (needs verl: run it in the side
  environment of scripts/test_frameworks.sh verl);
- ``trl``: examples/trl_grpo.py (TRL's GRPOTrainer on CPU, the tiny model), two torch-engine
  workers; timed to WorkersGone in the trainer's log (its traceback, as train() raised it), and to
  the process's exit (``kill_to_exit_s``, its teardown included).

    python scripts/bench_hang.py                        # all three, worker_timeout_s 2, grace = timeout
    python scripts/bench_hang.py --scenarios stream --worker-timeout 5 --grace 10 --json hang.json

tests/integrations/test_hang_to_error.py runs the same functions with a generous slack.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from rollout_queue import QueueConfig, RolloutQueue, SourceGroup, WorkersGone  # noqa: E402
from rollout_queue.core.keys import QueueKeys  # noqa: E402
from rollout_queue.integrations.stream import TrainingStream  # noqa: E402

#: Groups submitted: more than the workers make before the kill, so generation is still owed then.
GROUPS = 4000
#: The trainer's wait per lease call (TrainingStream's default block_ms), part of the bound.
BLOCK_S = 1.0


def env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1", "TRL_EXPERIMENTAL_SILENCE": "1"}


def spawn_worker(url: str, name: str, worker_id: str, log: Path, *args: str) -> subprocess.Popen[bytes]:
    """A real worker process (``--engine scripted`` unless ``args`` name another)."""
    # 2 workers x 4 slots / 0.2 s: 20 groups/s, slow enough that the queue still holds work at the kill
    engine = () if "--engine" in args else ("--engine", "scripted", "--engine-arg", "latency_s=0.2",
                                            "--engine-arg", "max_concurrency=4")
    cmd = [sys.executable, "-m", "rollout_queue.workers", "--url", url, "--queue", name, "--worker-id", worker_id,
           "--block-ms", "200", *engine, *args]
    return subprocess.Popen(cmd, cwd=REPO, env=env(), stdout=log.open("wb"), stderr=subprocess.STDOUT)


def serving(url: str, name: str) -> int:
    """Workers whose heartbeat thread has beaten (a progress line: past their engine's start-up)."""
    import redis

    client = redis.Redis.from_url(url)
    try:
        return int(client.hlen(QueueKeys(name)["progress"]))
    finally:
        client.close()


def wait_for(predicate: Callable[[], Any], timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise TimeoutError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(0.05)


def kill_all(procs: list[subprocess.Popen[bytes]]) -> float:
    """SIGKILL every process; the wall time of the kill."""
    at = time.time()
    for p in procs:
        if p.poll() is None:
            p.send_signal(signal.SIGKILL)
    for p in procs:
        p.wait(30)
    return at


def result(scenario: str, timeout_s: float, grace_s: float, seconds: float, error: str) -> dict[str, Any]:
    return {"scenario": scenario, "worker_timeout_s": timeout_s, "grace_s": grace_s,
            "bound_s": timeout_s + grace_s + 2 * BLOCK_S, "kill_to_error_s": round(seconds, 2), "error": error}


def measure_stream(url: str, name: str, logs: Path, timeout_s: float = 2.0, grace_s: float | None = None,
                   steps: int = 3) -> dict[str, Any]:
    """TrainingStream in this process; two scripted workers SIGKILLed after ``steps`` acked steps."""
    q = RolloutQueue.from_url(url, name, QueueConfig(worker_timeout_s=timeout_s))
    q.submit([SourceGroup(f"s{i}", f"prompt {i}", 2) for i in range(GROUPS)])
    workers = [spawn_worker(url, name, f"w{i}", logs / f"{name}-w{i}.log") for i in (1, 2)]
    try:
        stream = TrainingStream(q, groups_per_step=2, wait_s=600, fleet_grace_s=grace_s)
        for step in range(1, steps + 1):
            stream.next()
            stream.ack(step)
        killed = kill_all(workers)
        try:
            for step in range(steps + 1, 10_000):  # what was buffered is still trained, then the wait
                stream.next()
                stream.ack(step)
            raise AssertionError("the stream never raised")
        except WorkersGone as exc:
            return result("stream", timeout_s, stream.fleet.grace(timeout_s), time.time() - killed, str(exc))
    finally:
        kill_all(workers)
        q.close()


def measure_ranks(url: str, name: str, logs: Path, timeout_s: float = 2.0, grace_s: float | None = None,
                  steps: int = 2) -> dict[str, Any]:
    """Two gloo ranks (RankedStream); two scripted workers SIGKILLed once ``steps`` steps committed."""
    q = RolloutQueue.from_url(url, name, QueueConfig(worker_timeout_s=timeout_s))
    q.submit([SourceGroup(f"s{i}", f"prompt {i}", 2) for i in range(GROUPS)])
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    out = logs / f"{name}-trained.jsonl"
    ranks = [subprocess.Popen(
        [sys.executable, "tests/integrations/rank_trainer.py", "--url", url, "--queue", name, "--out", str(out),
         "--rank", str(r), "--world", "2", "--port", str(port), "--steps", "100000", "--groups", "4",
         "--wait-s", "600", *(("--fleet-grace", str(grace_s)) if grace_s is not None else ())],
        cwd=REPO, env=env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for r in (0, 1)]
    workers = [spawn_worker(url, name, f"w{i}", logs / f"{name}-w{i}.log") for i in (1, 2)]
    try:
        wait_for(lambda: q.stats().committed >= 4 * steps, 300, f"{steps} committed steps")
        killed = kill_all(workers)
        errs = [p.communicate(timeout=300)[1] for p in ranks]
        codes = [p.returncode for p in ranks]
        if codes != [4, 3]:
            raise AssertionError(f"ranks exited {codes}: {errs[0][-2000:]}\n{errs[1][-2000:]}")
        at = [float(line.split()[2]) for e in errs for line in e.splitlines() if line.startswith("ERROR-AT ")]
        grace = timeout_s if grace_s is None else grace_s
        return result("ranks", timeout_s, grace, max(at) - killed, "rank 0: " + _last(errs[0]) + " | rank 1: "
                      + _last(errs[1]))
    finally:
        kill_all(workers + ranks)  # type: ignore[operator]
        q.close()


def _last(text: str) -> str:
    lines = [line for line in text.splitlines() if line.strip() and not line.startswith("ERROR-AT ")]
    return lines[-1] if lines else ""


def measure_trl(url: str, name: str, logs: Path, timeout_s: float = 2.0, steps: int = 2) -> dict[str, Any]:
    """examples/trl_grpo.py (TRL's GRPOTrainer, CPU, tiny model) and two torch-engine workers; the
    queue's worker_timeout_s set with `rollout-queue config set` before the workers start (the
    example creates the queue with the default 60 s)."""
    from rollout_queue.workers.tiny_model import build_tiny_model

    model = build_tiny_model(logs / "tiny")
    log = logs / f"{name}-trainer.log"
    trainer = subprocess.Popen(
        [sys.executable, "examples/trl_grpo.py", "--url", url, "--queue", name, "--model", str(model), "--output",
         str(logs / f"{name}-run"), "--max-steps", "1000", "--save-steps", "1000", "--groups", "2"],
        cwd=REPO, env=env(), stdout=log.open("wb"), stderr=subprocess.STDOUT)
    workers: list[subprocess.Popen[bytes]] = []
    try:
        wait_for(lambda: _exists(url, name) or trainer.poll() is not None, 300, "the queue")
        subprocess.run([sys.executable, "-m", "rollout_queue", "--url", url, "--queue", name, "config", "set",
                        f"worker_timeout_s={timeout_s}", "--yes"], cwd=REPO, env=env(), check=True,
                       capture_output=True)
        workers = [spawn_worker(url, name, f"w{i}", logs / f"{name}-w{i}.log", "--engine", "torch", "--model",
                                str(model), "--max-tokens", "16", "--temperature", "1.0", "--engine-arg",
                                "max_batch_size=64") for i in (1, 2)]
        q = RolloutQueue.from_url(url, name, create=False)
        wait_for(lambda: q.stats().committed >= 2 * steps or trainer.poll() is not None, 600, f"{steps} TRL steps")
        if trainer.poll() is not None:
            raise AssertionError(f"the TRL trainer exited early: {log.read_text()[-3000:]}")
        killed = kill_all(workers)
        # the traceback reaches the log when the error leaves trainer.train(); the exit comes after teardown
        wait_for(lambda: "WorkersGone" in log.read_text(errors="replace") or trainer.poll() is not None, 600,
                 "the trainer's error")
        printed = time.time()
        trainer.wait(600)
        text = log.read_text(errors="replace")
        gone = [line for line in text.splitlines() if "WorkersGone" in line]
        if trainer.returncode == 0 or not gone:
            raise AssertionError(f"TRL exited {trainer.returncode} without WorkersGone: {text[-3000:]}")
        return {**result("trl", timeout_s, timeout_s, printed - killed, gone[-1]),
                "kill_to_exit_s": round(time.time() - killed, 2)}
    finally:
        kill_all([*workers, trainer])


def measure_nemo_rl(url: str, name: str, logs: Path, timeout_s: float = 2.0, grace_s: float | None = None,
                    steps: int = 3) -> dict[str, Any]:
    """NeMo-RL's train pump over the queue sampler (integrations/nemo_rl), built by NeMo-RL's own
    ``create_sampler`` over its ``TQReplayBuffer`` and in-process data plane (needs ``$NEMO_RL_SRC``
    and Python 3.13: scripts/test_frameworks.sh nemo-rl); two scripted workers SIGKILLed after
    ``steps`` selected steps; timed to the error select raises."""
    import asyncio

    from nemo_rl.algorithms.async_utils.replay_buffer import TQReplayBuffer
    from nemo_rl.algorithms.async_utils.staleness_sampler import CustomSamplerConfig, create_sampler
    from nemo_rl.data_plane.adapters.noop import NoOpDataPlaneClient

    q = RolloutQueue.from_url(url, name, QueueConfig(worker_timeout_s=timeout_s, max_staleness=1000))
    q.submit([SourceGroup(f"s{i}", f"prompt {i}", 2, {}, (1, 2, 3)) for i in range(GROUPS)])
    workers = [spawn_worker(url, name, f"w{i}", logs / f"{name}-w{i}.log", "--reward", "length_reward")
               for i in (1, 2)]
    dp = NoOpDataPlaneClient()
    dp.register_partition(partition_id="train", fields=["input_ids"], num_samples=4096, consumer_tasks=["train"])
    sampler = create_sampler(TQReplayBuffer(dp, "train", pad_value_dict={"token_ids": 0}), CustomSamplerConfig(
        target="rollout_queue.integrations.nemo_rl.sampler:QueueSampler", url=url, queue=name, wait_s=600,
        fleet_grace_s=grace_s))

    async def train(weight: int) -> None:
        meta, _ = await sampler.select(current_train_weight=weight, min_prompt_groups=2, max_prompt_groups=2)
        dp.clear_samples(sample_ids=list(meta.sample_ids), partition_id="train")

    try:
        sampler.set_dispatch_index(0)
        for weight in range(steps):
            asyncio.run(train(weight))
        killed = kill_all(workers)
        try:
            for weight in range(steps, 10_000):
                asyncio.run(train(weight))
            raise AssertionError("the sampler never raised")
        except WorkersGone as exc:
            return result("nemo-rl", timeout_s, sampler.stream.fleet.grace(timeout_s), time.time() - killed, str(exc))
    finally:
        kill_all(workers)
        sampler.close()
        q.close()


def measure_slime(url: str, name: str, logs: Path, timeout_s: float = 2.0, steps: int = 3) -> dict[str, Any]:
    """slime's rollout function over the queue (``generate_rollout`` with ``QueueDataSource``,
    convert/slime.py) in this process, as slime's rollout manager calls it; two scripted workers
    SIGKILLed after ``steps`` rollouts. slime's ``Sample`` where slime imports, its fields otherwise."""
    from types import SimpleNamespace

    from rollout_queue.integrations.convert.slime import THIS_ROLLOUT_FUNCTION, QueueDataSource, generate_rollout

    q = RolloutQueue.from_url(url, name, QueueConfig(worker_timeout_s=timeout_s, max_staleness=1000))
    q.submit([SourceGroup(f"s{i}", f"prompt {i}", 2, {}, (1, 2, 3)) for i in range(GROUPS)])
    workers = [spawn_worker(url, name, f"w{i}", logs / f"{name}-w{i}.log") for i in (1, 2)]
    args = SimpleNamespace(rollout_batch_size=2, rollout_function_path=THIS_ROLLOUT_FUNCTION, eval_interval=None,
                           eval_function_path=None)
    source = QueueDataSource(args, queue=q)
    try:
        source.load(None)
        for rollout_id in range(steps):
            generate_rollout(args, rollout_id, source)
        killed = kill_all(workers)
        try:
            for rollout_id in range(steps, 10_000):
                generate_rollout(args, rollout_id, source)
            raise AssertionError("the rollout function never raised")
        except WorkersGone as exc:
            grace = source.rollout.stream.fleet.grace(timeout_s)
            return result("slime", timeout_s, grace, time.time() - killed, str(exc))
    finally:
        kill_all(workers)
        q.close()


def measure_miles(url: str, name: str, logs: Path, timeout_s: float = 2.0, steps: int = 3,
                  give_up_s: float = 120.0) -> dict[str, Any]:
    """miles' fully-async buffer over the queue (``QueueDataBuffer.get``, integrations/miles) in this
    process, fed by two scripted rollout-queue workers (the "workers on other hosts" of
    docs/integrations/miles.md), SIGKILLed after ``steps`` gets. Needs miles (``$MILES_SRC``:
    scripts/test_frameworks.sh miles). A get still waiting ``give_up_s`` after the kill is reported
    as a hang (``kill_to_error_s`` None)."""
    import asyncio
    from argparse import Namespace

    sys.path.insert(0, str(REPO))
    from tests.integrations.framework_src import add_source, stub_sglang

    add_source("MILES_SRC")
    stub_sglang()
    from miles.rollout.fully_async_data_buffer import DataBufferConstructorInput

    from rollout_queue.integrations.miles import QueueDataBuffer
    from rollout_queue.integrations.miles.ledger import forget_ledgers

    q = RolloutQueue.from_url(url, name, QueueConfig(worker_timeout_s=timeout_s, max_staleness=1000))
    q.submit([SourceGroup(f"s{i}", f"prompt {i}", 2, {}, (1, 2, 3)) for i in range(GROUPS)])
    workers = [spawn_worker(url, name, f"w{i}", logs / f"{name}-w{i}.log") for i in (1, 2)]
    saved = {k: os.environ.get(k) for k in ("REDIS_URL", "ROLLOUT_QUEUE")}
    os.environ.update(REDIS_URL=url, ROLLOUT_QUEUE=name)
    args = Namespace(rollout_batch_size=2, n_samples_per_prompt=2, max_weight_staleness=None,
                     async_data_buffer_capacity_factor=100.0, async_unused_samples_handler="drop",
                     dynamic_sampling_filter_path=None, start_rollout_id=0)
    try:
        buffer = QueueDataBuffer(DataBufferConstructorInput(args=args, unused_handler_fn=lambda _: None))

        async def drain(limit: float) -> None:
            while True:
                await asyncio.wait_for(buffer.get(), limit)

        async def run() -> dict[str, Any]:
            for _ in range(steps):
                await buffer.get()
            killed = kill_all(workers)
            try:
                await drain(give_up_s)
            except WorkersGone as exc:
                return result("miles", timeout_s, timeout_s, time.time() - killed, str(exc))
            except asyncio.TimeoutError:
                return {**result("miles", timeout_s, timeout_s, 0.0, f"no error {give_up_s:g} s after the kill"),
                        "kill_to_error_s": None}
            raise AssertionError("unreachable")

        return asyncio.run(run())
    finally:
        kill_all(workers)
        forget_ledgers()
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        q.close()


def measure_verl(url: str, name: str, logs: Path, timeout_s: float = 2.0, steps: int = 3) -> dict[str, Any]:
    """verl 0.9.1's V1 sampler over the queue (``QueueReplayBuffer``, integrations/verl) in this
    process: built by verl's own ``PPOTrainer._build_replay_buffer`` from the config block of
    docs/integrations/verl.md, writing each batch into real TransferQueue on a local Ray, and driven as
    ``fit`` drives it (``sample(global_steps=g, "train", 2)``, the batch read back and cleared); two
    scripted workers SIGKILLed after ``steps`` steps; timed to the error ``sample`` raises. The lease
    goes through TrainingStream, so the grace is its default (``worker_timeout_s``): the sampler's
    ``sampler_kwargs`` has no key for it. Needs verl (scripts/test_frameworks.sh verl)."""
    import re

    import ray
    import transfer_queue as tq
    from omegaconf import OmegaConf
    from verl.trainer.ppo.v1.trainer_separate_async import PPOTrainerSeparateAsync

    text = (REPO / "docs" / "integrations" / "verl.md").read_text()
    block = re.search(r"^<!-- verl-config:.*?-->\n```yaml\n(.*?)^```$", text, re.S | re.M)
    if block is None:
        raise AssertionError("docs/integrations/verl.md lost its verl-config block")
    cfg = OmegaConf.create(block.group(1))
    cfg.trainer.v1.trainer_mode = "separate_async"
    cfg.trainer.v1.separate_async = {"parameter_sync_step": 1}
    cfg.trainer.v1.sampler.sampler_kwargs.update(url=url, queue=name, wait_s=600)  # the documented wait
    # the documented pairing: max_off_policy_threshold 2 is the queue's max_staleness 1
    q = RolloutQueue.from_url(url, name, QueueConfig(worker_timeout_s=timeout_s, max_staleness=1))
    q.submit([SourceGroup(f"s{i}", f"prompt {i}", 2, {"data_source": "toy"}, (1, 2, 3)) for i in range(GROUPS)])
    own_ray = not ray.is_initialized()
    if own_ray:
        ray.init(num_cpus=4, include_dashboard=False, log_to_driver=False)
        tq.init()
    workers = [spawn_worker(url, name, f"w{i}", logs / f"{name}-w{i}.log", "--reward", "length_reward")
               for i in (1, 2)]
    try:
        trainer = object.__new__(PPOTrainerSeparateAsync)
        trainer.config, trainer.trainer_mode = cfg, cfg.trainer.v1.trainer_mode
        buffer = trainer._build_replay_buffer()

        def step(g: int) -> None:
            meta, _ = buffer.sample(global_steps=g, partition_id="train", batch_size=2)
            tq.kv_batch_get(keys=meta.keys, partition_id="train")
            tq.kv_clear(keys=meta.keys, partition_id="train")

        for g in range(1, steps + 1):
            step(g)
        killed = kill_all(workers)
        try:
            for g in range(steps + 1, 10_000):
                step(g)
            raise AssertionError("the sampler never raised")
        except WorkersGone as exc:
            return result("verl", timeout_s, buffer.stream.fleet.grace(timeout_s), time.time() - killed, str(exc))
    finally:
        kill_all(workers)
        if own_ray:
            tq.close()
            ray.shutdown()
        q.close()


def _exists(url: str, name: str) -> bool:
    from rollout_queue.core.errors import QueueNotFound

    try:
        RolloutQueue.from_url(url, name, create=False).close()
        return True
    except QueueNotFound:
        return False


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--scenarios", default="stream,ranks,trl")
    p.add_argument("--worker-timeout", type=float, default=2.0, help="the queue's worker_timeout_s")
    p.add_argument("--grace", type=float, default=None, help="fleet_grace_s (default: worker_timeout_s)")
    p.add_argument("--json", type=Path, default=None)
    a = p.parse_args()
    from rollout_queue.devtools.local_server import LocalServer

    server = LocalServer("redis")
    url = server.start().url
    rows = []
    try:
        with tempfile.TemporaryDirectory() as tmp:
            logs = Path(tmp)
            for i, scenario in enumerate(a.scenarios.split(",")):
                name = f"hang-{scenario}-{i}"
                if scenario == "stream":
                    rows.append(measure_stream(url, name, logs, a.worker_timeout, a.grace))
                elif scenario == "ranks":
                    rows.append(measure_ranks(url, name, logs, a.worker_timeout, a.grace))
                elif scenario == "slime":
                    rows.append(measure_slime(url, name, logs, a.worker_timeout))
                elif scenario == "miles":
                    rows.append(measure_miles(url, name, logs, a.worker_timeout))
                elif scenario == "verl":
                    rows.append(measure_verl(url, name, logs, a.worker_timeout))
                elif scenario == "nemo-rl":
                    rows.append(measure_nemo_rl(url, name, logs, a.worker_timeout, a.grace))
                elif scenario == "trl":
                    rows.append(measure_trl(url, name, logs, a.worker_timeout))
                else:
                    raise SystemExit(f"unknown scenario {scenario!r}")
                row = rows[-1]
                took = "never" if row["kill_to_error_s"] is None else f"{row['kill_to_error_s']:6.2f} s"
                print(f"{row['scenario']:>6}: kill -> error {took}  (bound "
                      f"{row['bound_s']:.1f} s: worker_timeout_s {row['worker_timeout_s']:g} + grace "
                      f"{row['grace_s']:g} + two waits of {BLOCK_S:g})  {row['error'][:160]}", flush=True)
    finally:
        server.cleanup(graceful=False)
    if a.json:
        a.json.write_text(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
