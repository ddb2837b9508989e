"""TRL's GRPOTrainer with rollout-queue workers against TRL alone (its own generation), in one run.

Both arms run examples/trl_grpo.py (the code docs/integrations/trl.md shows) on the same machine,
tiny local model, the digit task, the same GRPOConfig and steps; the queue arm adds ``--workers``
``rollout-queue worker`` processes (torch engine) on a private Redis. Printed per arm: wall time of
the run (process start to exit, model loading included), the sum of TRL's step_time, the reward of the
first and last five steps, and the first step (and second) at which the 3-step mean reward reaches
``--target``; then the queue arm's ratios to TRL alone. Numbers depend on the machine; the ratios
are what to compare. On a 2-core box the trainer and the workers share the same cores, so the
queue arm measures overlap of generation and training on one machine, not a GPU fleet.

    python scripts/bench_trl.py                  # 40 steps, 2 workers (~3-4 minutes on 2 cores)
    python scripts/bench_trl.py --steps 80 --target 0.5 --json trl.json
    python scripts/bench_trl.py --results benchmarks/results.json   # the table of docs/PERFORMANCE.md
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]


def run_arm(name: str, argv: list[str], out: Path, workers: list[list[str]], env: dict[str, str],
            logs: Path) -> dict[str, Any]:
    started = time.monotonic()
    trainer = subprocess.Popen([sys.executable, "examples/trl_grpo.py", *argv, "--output", str(out)], cwd=REPO,
                               env=env, stdout=(logs / f"{name}-trainer.log").open("wb"), stderr=subprocess.STDOUT)
    fleet = []
    if workers:
        time.sleep(1.0)
        while not _queue_exists(env["BENCH_URL"], env["BENCH_QUEUE"]):
            if trainer.poll() is not None:
                raise SystemExit(f"{name}: the trainer exited early; see {logs}/{name}-trainer.log")
            time.sleep(0.2)
        fleet = [subprocess.Popen(w, cwd=REPO, env=env, stdout=(logs / f"{name}-worker-{i}.log").open("wb"),
                                  stderr=subprocess.STDOUT) for i, w in enumerate(workers)]
    try:
        code = trainer.wait(3600)
    finally:
        for w in fleet:
            w.terminate()
        for w in fleet:
            w.wait(60)
    wall = time.monotonic() - started
    if code:
        raise SystemExit(f"{name}: the trainer exited {code}; see {logs}/{name}-trainer.log")
    last = max(out.glob("checkpoint-*"), key=lambda p: int(p.name.split("-")[1]))
    history = json.loads((last / "trainer_state.json").read_text())["log_history"]
    rewards = [h["reward"] for h in history if "reward" in h]
    times = [float(h["step_time"]) for h in history if "step_time" in h]  # TRL's per-step time
    return {"wall_s": wall, "train_runtime_s": sum(times), "rewards": rewards, "step_times": times,
            "reward_first5": sum(rewards[:5]) / 5, "reward_last5": sum(rewards[-5:]) / 5}


def _queue_exists(url: str, name: str) -> bool:
    from rollout_queue import RolloutQueue
    from rollout_queue.core.errors import QueueNotFound

    try:
        RolloutQueue.from_url(url, name, create=False).close()
        return True
    except QueueNotFound:
        return False


def steps_to(rewards: list[float], target: float) -> int | None:
    """The first step whose mean over it and the two before reaches ``target`` (None: never)."""
    for i in range(2, len(rewards)):
        if sum(rewards[i - 2:i + 1]) / 3 >= target:
            return i + 1
    return None


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--groups", type=int, default=4)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--target", type=float, default=0.2)
    p.add_argument("--threads", type=int, default=1, help="torch threads per process (OMP_NUM_THREADS)")
    p.add_argument("--weights-mode", default="continue", choices=["abort", "continue"],
                   help="the workers' --weights-mode: finish or abort in-flight groups on a weight update")
    p.add_argument("--json", type=Path, default=None)
    p.add_argument("--results", type=Path, default=None,
                   help="replace the `trl` section of this results file (benchmarks/results.json: the "
                        "table of docs/PERFORMANCE.md is generated from it by scripts/bench_tables.py)")
    a = p.parse_args()
    load = os.getloadavg()[0]

    from rollout_queue.devtools.local_server import LocalServer
    from rollout_queue.workers.tiny_model import build_tiny_model

    tmp = Path(tempfile.mkdtemp(prefix="bench-trl-"))
    model = build_tiny_model(tmp / "tiny")
    server = LocalServer("redis").start()
    env = {**os.environ, "PYTHONPATH": str(REPO), "TRL_EXPERIMENTAL_SILENCE": "1", "HF_HUB_OFFLINE": "1",
           "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1", "BENCH_URL": server.url, "BENCH_QUEUE": "bench-trl",
           "OMP_NUM_THREADS": str(a.threads)}
    common = ["--model", str(model), "--max-steps", str(a.steps), "--save-steps", str(a.steps),
              "--groups", str(a.groups)]
    worker = [sys.executable, "-m", "rollout_queue", "--url", server.url, "--queue", "bench-trl", "worker", "--",
              "--engine", "torch", "--model", str(model), "--max-tokens", "16", "--temperature", "1.0",
              "--block-ms", "250", "--engine-arg", "max_batch_size=64", "--weights-mode", a.weights_mode]
    try:
        results = {
            "trl_alone": run_arm("trl_alone", [*common, "--local"], tmp / "alone", [], env, tmp),
            "trl_queue": run_arm("trl_queue", [*common, "--url", server.url, "--queue", "bench-trl"], tmp / "queue",
                                 [[*worker, "--worker-id", f"bench-w{i}"] for i in range(a.workers)], env, tmp),
        }
    finally:
        server.cleanup(graceful=False)
    print(f"TRL GRPOTrainer, tiny model, digit task, {a.steps} steps x {a.groups} groups x 8 samples, "
          f"{os.cpu_count()} CPUs, {a.threads} torch thread(s) per process; queue arm: {a.workers} torch workers, "
          f"--weights-mode {a.weights_mode}")
    print(f"{'arm':<10} {'wall s':>8} {'train s':>8} {'s/step':>7} {'reward 1-5':>10} {'last 5':>7} "
          f"{'steps to ' + str(a.target):>13} {'s to target':>11}")
    for name, r in results.items():
        hit = steps_to(r["rewards"], a.target)
        r["steps_to_target"] = hit
        r["s_to_target"] = sum(r["step_times"][:hit]) if hit else None
        to_target = f"{r['s_to_target']:.1f}" if hit else "-"
        print(f"{name:<10} {r['wall_s']:>8.1f} {r['train_runtime_s']:>8.1f} {r['train_runtime_s'] / a.steps:>7.2f} "
              f"{r['reward_first5']:>10.3f} {r['reward_last5']:>7.3f} {str(hit or '-'):>13} "
              f"{to_target:>11}")
    alone, queue = results["trl_alone"], results["trl_queue"]
    print(f"queue / alone: train time {queue['train_runtime_s'] / alone['train_runtime_s']:.2f}x, "
          f"wall {queue['wall_s'] / alone['wall_s']:.2f}x")
    if a.json:
        a.json.write_text(json.dumps({"steps": a.steps, "groups": a.groups, "workers": a.workers,
                                      "target": a.target, **results}, indent=1))
    if a.results:
        from bench_common import run_environment, store_run

        env = run_environment(load, steps=a.steps, groups=a.groups, workers=a.workers, target=a.target,
                              threads=a.threads, weights_mode=a.weights_mode)
        store_run(a.results, "trl", env, arms=results)


if __name__ == "__main__":
    main()
