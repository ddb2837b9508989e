"""Weight updates: time from publish to every worker generating on the new version, per transport.

For each model size (a random-init Llama built locally, fp32), a trainer-side ``WeightPublisher``
publishes versions into a private Redis and 1 or 2 torch-engine workers load each one
(concurrently, as separate workers would) and generate a token on it. Per transport it prints:

- ``publish s``: writing the version folder(s) and recording the version through a hold (for
  ``dist``: the push round, the record, then the fallback delta, which no worker waits for);
- ``pause s``: the longest time a worker's engine could not step (its ``load_weights``);
- ``to new s``: publish + the slowest worker's load + its first token on the new version;
- ``x folder``: ``to new s`` over the folder transport's in the same run (lower is better).

Each step changes a fraction of the tensors (``--changed``, default 0.25 and 1.0: a run that
freezes most of the model, such as embeddings and early layers, and a full fine-tune). With
every tensor changed, the delta transport writes a full version (its rule), so its ratio is ~1.
``dist`` broadcasts over gloo (``WeightPush``, the queue as the rendezvous) to engines that join each
round, as the worker's PushFollower does, and they apply the staged tensors once it is recorded.

    python scripts/bench_weights.py                  # tiny, 25M and 200M parameters (~3 min)
    python scripts/bench_weights.py --sizes tiny --workers 1

Measured in one process (the engines' own compute threads), so the figures exclude the pub/sub
notice a worker process gets (milliseconds) and include nothing else. Dirty pages are flushed
(``os.sync``) before each timed publish, outside the timing, so one write's writeback does not
land on the next; workers read from the page cache, as a worker on the trainer's host would.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import tempfile
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

SIZES: dict[str, dict[str, int]] = {
    "tiny": {"hidden_size": 128, "intermediate_size": 256, "num_layers": 2, "num_heads": 4},
    "25M": {"hidden_size": 512, "intermediate_size": 1408, "num_layers": 8, "num_heads": 8},
    "200M": {"hidden_size": 1024, "intermediate_size": 2816, "num_layers": 16, "num_heads": 16},
}


def perturb(model: Any, fraction: float, step: int) -> None:
    """Change ``fraction`` of the parameter tensors (the first ones by name: a frozen tail)."""
    import torch

    params = sorted(model.named_parameters())
    with torch.no_grad():
        for _, param in params[:max(1, round(fraction * len(params)))]:
            param.add_(1e-3 * (step + 1))


async def measure(model_dir: Path, transport: str, workers: int, fraction: float, versions: int,
                  url: str) -> dict[str, float]:
    import torch
    from transformers import AutoModelForCausalLM

    from rollout_queue import RolloutQueue
    from rollout_queue.weights import WeightPublisher
    from rollout_queue.workers.engines.base import SamplingConfig
    from rollout_queue.workers.engines.torch import TorchEngine

    queue = RolloutQueue.from_url(url, f"bench-weights-{os.getpid()}-{time.monotonic_ns()}")
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    engines = [TorchEngine(str(model_dir)) for _ in range(workers)]
    for engine in engines:
        await engine.start()
    one = SamplingConfig(max_tokens=1, temperature=0)
    rows: list[dict[str, float]] = []
    with tempfile.TemporaryDirectory(prefix="bench-weights-") as root:
        push = None
        if transport == "dist":
            from rollout_queue.weights.push import WeightPush

            for i in range(workers):
                queue.worker(f"bench-{i}").heartbeat()  # live: the round seals once all joined
            push = WeightPush(queue, join_s=10, deadline_s=120, host="127.0.0.1")
        publisher = WeightPublisher(queue, root, transport=transport, push=push)  # type: ignore[arg-type]
        try:
            for version in range(1, versions + 2):  # version 1 is full for every transport: not counted
                perturb(model, fraction, version)
                os.sync()  # outside the timing: every write starts with no dirty pages left by the last
                began = time.perf_counter()
                if transport == "dist":
                    publishing = asyncio.create_task(asyncio.to_thread(publisher.publish, model, version))
                    pauses = await asyncio.gather(*(
                        pushed(queue, engine, f"bench-{i}", version, f"v{version}-{i}")
                        for i, engine in enumerate(engines)))
                    done = time.perf_counter()
                    await publishing
                    published = time.perf_counter()
                else:
                    uri = publisher.publish(model, version)
                    published = time.perf_counter()

                    async def follow(engine: TorchEngine, tag: str) -> float:
                        start = time.perf_counter()
                        await engine.load_weights(uri)
                        pause = time.perf_counter() - start
                        await engine.generate(tag, [1, 2, 3], one)
                        return pause

                    pauses = await asyncio.gather(*(follow(e, f"v{version}-{i}") for i, e in enumerate(engines)))
                    done = time.perf_counter()
                assert publisher.last is not None
                if version > 1:
                    rows.append({"publish_s": published - began, "pause_s": max(pauses), "to_new_s": done - began,
                                 "bytes": publisher.last.bytes, "delta": float(publisher.last.kind == "delta")})
        finally:
            for engine in engines:
                await engine.close()
    return {key: sorted(r[key] for r in rows)[len(rows) // 2] for key in rows[0]}


async def pushed(queue: Any, engine: Any, worker_id: str, version: int, tag: str) -> float:
    """One worker of the dist transport, as its PushFollower and PolicyVersions do it: join the
    round, receive, wait for the version's record, apply the staged tensors, generate. Returns the
    pause (the apply)."""
    from rollout_queue.workers.engines.base import SamplingConfig

    worker = queue.worker(worker_id)
    await asyncio.to_thread(worker.heartbeat)  # only a live worker takes a rank (its heartbeat thread, in a worker)
    while (ticket := await asyncio.to_thread(worker.join_push, 0, version - 1)) is None:
        await asyncio.sleep(0.002)
    await engine.receive_push(ticket)
    while await asyncio.to_thread(lambda: queue.version) < version:  # the record's notice, in a worker
        await asyncio.sleep(0.002)
    start = time.perf_counter()
    await engine.load_weights(ticket.uri)
    pause = time.perf_counter() - start
    await engine.generate(tag, [1, 2, 3], SamplingConfig(max_tokens=1, temperature=0))
    return pause


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sizes", default="tiny,25M,200M", help=f"comma-separated, of {sorted(SIZES)}")
    p.add_argument("--workers", default="1,2")
    p.add_argument("--changed", default="0.25,1.0", help="fractions of tensors changed per step")
    p.add_argument("--versions", type=int, default=5, help="versions timed per cell (the median is shown)")
    p.add_argument("--threads", type=int, default=max(1, (os.cpu_count() or 2) // 2))
    p.add_argument("--results", type=Path, default=None,
                   help="replace the `weights` section of this results file (benchmarks/results.json: the "
                        "table of docs/PERFORMANCE.md is generated from it by scripts/bench_tables.py)")
    a = p.parse_args()
    import torch

    from rollout_queue.devtools.local_server import LocalServer
    from rollout_queue.weights import TRANSPORTS
    from rollout_queue.workers.tiny_model import build_tiny_model

    torch.set_num_threads(a.threads)
    rows: list[dict[str, Any]] = []
    load = os.getloadavg()[0]
    server = LocalServer("redis").start()
    try:
        with tempfile.TemporaryDirectory(prefix="bench-weights-models-") as models:
            print(f"{'size':<6} {'params':>7} {'workers':>7} {'changed':>7} {'transport':<9} {'MB written':>10} "
                  f"{'publish s':>9} {'pause s':>8} {'to new s':>8} {'x folder':>8}")
            for size in a.sizes.split(","):
                folder = build_tiny_model(Path(models) / size, **SIZES[size])
                params = sum(f.stat().st_size for f in folder.glob("*.safetensors")) / 4 / 1e6
                for workers in (int(w) for w in a.workers.split(",")):
                    for fraction in (float(c) for c in a.changed.split(",")):
                        base = None
                        for transport in TRANSPORTS:
                            r = asyncio.run(measure(folder, transport, workers, fraction, a.versions, server.url))
                            base = base or r["to_new_s"]
                            print(f"{size:<6} {params:>6.1f}M {workers:>7} {fraction:>7.2f} {transport:<9} "
                                  f"{r['bytes'] / 1e6:>10.1f} {r['publish_s']:>9.3f} {r['pause_s']:>8.3f} "
                                  f"{r['to_new_s']:>8.3f} {r['to_new_s'] / base:>8.2f}", flush=True)
                            rows.append({"size": size, "params_m": params, "workers": workers, "changed": fraction,
                                         "transport": transport, "mb_written": r["bytes"] / 1e6,
                                         "publish_s": r["publish_s"], "pause_s": r["pause_s"],
                                         "to_new_s": r["to_new_s"], "x_folder": r["to_new_s"] / base})
    finally:
        server.stop()
    from bench_common import run_environment, store_run

    env = run_environment(load, torch=torch.__version__, versions=a.versions, threads=a.threads)
    print(f"load average {env['loadavg_end']:.2f}, {env['cpus']} CPUs, torch {env['torch']}, python {env['python']}")
    if a.results:
        store_run(a.results, "weights", env, rows=rows)


if __name__ == "__main__":
    main()
