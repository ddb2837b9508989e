"""Engine throughput kept (issue 17 item 1, P6): bare engine against the same engine behind the queue.

Same model (a local tiny Llama), same prompts, same sampling (temperature 1, ``max_tokens``, a
seed per sample), same engine settings, in one run:

- ``bare``: the engine alone in one process, every request submitted at once. For vLLM that is
  ``AsyncLLM`` itself (the ``AsyncEngineArgs`` the worker's ``VLLMEngine`` builds); for torch,
  ``TorchEngine`` with every sample's ``generate`` awaited together.
- ``queue``: the shipped processes: a private Redis, ``rollout-queue worker`` (one process, its
  default sample policy), every group submitted up front (``submit``, what ``rollout-queue
  produce`` calls), a trainer leasing and committing as groups arrive, and a reaper.
- ``queue+weights``: the same, while the trainer publishes a new weights version (folder
  transport, the same tensors) every ``--publish-every`` seconds, each reloaded by the worker
  between engine steps (``--weights-mode continue``). vLLM recomputes the KV of every request in
  flight on the new weights (``kv_on_update="recompute"``, the default: rule 3).
- ``queue+weights+keep`` (vLLM): the same with ``kv_on_update="keep"`` (PipelineRL's choice: in-flight
  requests go on over their old KV), which separates the reload's cost from the recompute's.

Throughput is generated tokens per second at steady state: the tokens done after the moment 10% of
all generated tokens were, over the time from that moment to the last one done (bare: a request's
end; queue: its group's lease by the trainer, which can only be later), so engine start-up and the
first wave are outside it. Many more samples than engine slots, so the window holds many waves.
``x bare`` is the arm's rate over the bare one's in the same repeat; the target is >= 0.97. One run
of an arm swings by +-10% on a shared 2-core machine (the bare vLLM arm measured 4,463 and 6,877
tokens/s on two days), so every arm runs ``--repeats`` times, interleaved (bare, queue, ... then
again), and a row gives the medians and the spread of ``x bare`` over the repeats.

    python scripts/bench_engine.py                          # torch and vllm, 3 repeats, ~18 min on 2 cores
    python scripts/bench_engine.py --engines torch --groups 64
    python scripts/bench_engine.py --json out.json

Where the CPU goes: every arm samples the CPU time of each of its processes twice a second, by
role (``engine``: vLLM's engine-core processes, or the torch engine's worker process; ``frontend``:
vLLM's ``AsyncLLM`` process in the bare arm, the worker process in the queue arms; ``trainer``: the
arm's own process, which leases, commits, reaps and publishes; ``redis``), and a row gives each
role's cores over the same steady window. On a machine with fewer cores than the arms want, the
gap between the arms is CPU the queue's processes took from the engine, and these columns say how
much.

What the engine did each step (vLLM): both arms start vLLM with ``enable_logging_iteration_details``,
so its stat logger reports every step's requests, tokens and time (the bare arm's lines are taken
in-process, the worker's from its log). A row gives, over the middle 80% of the steps, the requests
per step, the share of steps with every slot busy, the ms per step and the decode tokens per second
of step time: fewer requests per step behind the queue is work the worker did not offer the engine;
as many at longer steps is CPU the engine lost.

Each arm runs in its own process (``--arm``), so no engine shares an interpreter with another.
A benchmark, not a test.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Iterable

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("VLLM_NO_USAGE_STATS", "1")
os.environ.setdefault("DO_NOT_TRACK", "1")

ARMS = ("bare", "queue", "queue+weights", "queue+weights+keep")
#: vLLM alone can keep in-flight KV across an update (VLLMEngine kv_on_update="keep"); the torch engine
#: recomputes nothing to begin with (its rows keep their cache), so the arm would repeat queue+weights.
ENGINE_ARMS = {"torch": ARMS[:3], "vllm": ARMS}
TARGET = 0.97


def prompts(groups: int) -> list[str]:
    return [f"Question {i}: what comes after {i * 7 % 97}? Answer:" for i in range(groups)]


def steady_window(events: list[tuple[float, int]]) -> tuple[float, float] | None:
    """(start, end) of the steady window: from the moment 10% of all tokens were done to the last
    event (the first 10% hold engine start-up and the first wave); None when it is empty."""
    events = sorted(events)
    total = sum(n for _, n in events)
    done = 0
    for t, n in events:
        done += n
        if done >= 0.1 * total:
            return (t, events[-1][0]) if events[-1][0] > t else None
    return None


def steady_rate(events: list[tuple[float, int]]) -> tuple[float, float, int]:
    """(tokens/s over the steady window, that window in s, tokens in all) from (time done, tokens)
    events: the tokens done after the window's start, over its length."""
    total = sum(n for _, n in events)
    window = steady_window(events)
    if window is None:
        return float("nan"), 0.0, total
    t0, t1 = window
    after = sum(n for t, n in events if t > t0)
    return after / (t1 - t0), t1 - t0, total


class CpuSampler:
    """CPU seconds of each role's processes, sampled every ``interval_s`` on a thread (psutil):
    ``roles()`` maps a role to the pids it holds now (children are found as they are spawned)."""

    def __init__(self, roles: Any, interval_s: float = 0.5) -> None:
        self._roles, self._interval = roles, interval_s
        self._stop = threading.Event()
        self._last: dict[int, float] = {}  # pid -> its last reading (a process that exits keeps its share)
        self._owner: dict[int, str] = {}
        self.samples: list[tuple[float, dict[str, float]]] = []
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> "CpuSampler":
        self._thread.start()
        return self

    def stop(self) -> None:
        """One last sample (the window's end), then the thread ends."""
        self.sample()
        self._stop.set()
        self._thread.join(5)

    def __enter__(self) -> "CpuSampler":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _run(self) -> None:
        while not self._stop.wait(self._interval):
            self.sample()

    def sample(self) -> None:
        import psutil

        for role, pids in self._roles().items():
            for pid in pids:
                try:
                    t = psutil.Process(pid).cpu_times()
                except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
                    continue
                self._last[pid], self._owner[pid] = t.user + t.system, role
        by_role: dict[str, float] = {}
        for pid, cpu in self._last.items():
            by_role[self._owner[pid]] = by_role.get(self._owner[pid], 0.0) + cpu
        self.samples.append((time.perf_counter(), by_role))


def children(pid: int) -> list[int]:
    import psutil

    try:
        return [c.pid for c in psutil.Process(pid).children(recursive=True)]
    except psutil.NoSuchProcess:
        return []


def cores_in(samples: list[tuple[float, dict[str, float]]], window: tuple[float, float] | None) -> dict[str, float]:
    """Each role's cores (CPU s per s) between the samples that bracket ``window``."""
    if window is None or len(samples) < 2:
        return {}
    t0, t1 = window
    before = [s for s in samples if s[0] <= t0] or samples[:1]
    after = [s for s in samples if s[0] >= t1] or samples[-1:]
    (ta, a), (tb, b) = before[-1], after[0]
    if tb <= ta:
        return {}
    return {role: (b.get(role, 0.0) - a.get(role, 0.0)) / (tb - ta) for role in b}


#: One engine step as vLLM's stat logger reports it (``enable_logging_iteration_details``).
STEP_LINE = re.compile(r"Iteration\((\d+)\): (\d+) context requests, (\d+) context tokens, (\d+) generation "
                       r"requests, (\d+) generation tokens, iteration elapsed time: ([\d.]+) ms(?! \(dummy\))")


def parse_steps(lines: Iterable[str]) -> list[tuple[int, int, float]]:
    """(requests in the step, decode tokens in it, its ms) of every real engine step in ``lines``."""
    out = []
    for line in lines:
        m = STEP_LINE.search(line)
        if m:
            _, ctx_req, _, gen_req, gen_tok, ms = m.groups()
            out.append((int(ctx_req) + int(gen_req), int(gen_tok), float(ms)))
    return out


def step_stats(steps: list[tuple[int, int, float]], slots: int) -> dict[str, float]:
    """Over the middle 80% of the steps (the first wave and the drain left out, as the throughput's
    steady window does): requests per step, the share of steps with every slot busy, ms per step and
    decode tokens per second of step time. Fewer requests per step behind the queue than bare is work
    the engine was not offered; as many at a longer step is CPU taken from the engine."""
    cut = len(steps) // 10
    mid = steps[cut:len(steps) - cut]
    if not mid:
        return {}
    ms = sum(st[2] for st in mid)
    return {"steps": len(steps), "requests_per_step": statistics.fmean(st[0] for st in mid),
            "full_steps": sum(st[0] >= slots for st in mid) / len(mid), "ms_per_step": ms / len(mid),
            "decode_tokens_per_step_s": sum(st[1] for st in mid) / (ms / 1000) if ms else 0.0}


class StepTap(logging.Filter):
    """Takes vLLM's per-step lines in this process (the bare arm's ``AsyncLLM``) off the console."""

    def __init__(self) -> None:
        super().__init__()
        self.lines: list[str] = []

    def filter(self, record: logging.LogRecord) -> bool:
        text = record.getMessage()
        if STEP_LINE.search(text):
            self.lines.append(text)
            return False
        return True


# -- the arms (each in its own process) ------------------------------------------------------------


def engine_settings(engine: str, slots: int, seed: int) -> dict[str, Any]:
    """The engine options both arms use; the queue arm passes them as --engine-arg."""
    if engine == "vllm":
        # A token budget in proportion to the slots. On vLLM's CPU build VLLMEngine never splits a
        # prefill (its module docstring, rule 5: a split seeded prefill kills vLLM 0.32's CPU
        # EngineCore), so the budget must be >= max_model_len there. Per-step details (requests and tokens in the step, its time) from vLLM's own stat logger,
        # in both arms alike: they say whether the engine ran as many sequences per step behind the
        # queue as bare (engine_steps).
        return {"max_num_seqs": slots, "seed": seed, "engine_args": {"max_num_batched_tokens": slots * 256,
                                                                     "enable_logging_iteration_details": True}}
    return {"max_batch_size": slots, "seed": seed}


def arm_bare(engine: str, model: str, groups: int, n: int, max_tokens: int, slots: int
             ) -> tuple[list[tuple[float, int]], dict[str, Any], list[tuple[float, dict[str, float]]]]:
    from rollout_queue.workers.engines.base import SamplingConfig

    me = os.getpid()
    # vLLM's engine core runs in a child process; the torch engine runs in this one.
    roles = ((lambda: {"frontend": [me], "engine": children(me)}) if engine == "vllm"
             else (lambda: {"engine": [me]}))

    settings = engine_settings(engine, slots, 0)
    tap = StepTap()

    async def main() -> list[tuple[float, int]]:
        if engine == "vllm":
            from vllm.sampling_params import RequestOutputKind, SamplingParams
            from vllm.v1.engine.async_llm import AsyncLLM

            from rollout_queue.workers.engines.vllm import VLLMEngine

            # The very AsyncEngineArgs the worker's engine would start vLLM with; vLLM itself runs them.
            args = VLLMEngine(model, **settings)._args
            logging.getLogger("vllm.v1.metrics.loggers").addFilter(tap)
            llm = AsyncLLM.from_engine_args(args)
            tok = llm.get_tokenizer()

            async def one(rid: str, ids: list[int], seed: int) -> tuple[float, int]:
                params = SamplingParams(n=1, max_tokens=max_tokens, temperature=1.0, top_p=1.0, seed=seed,
                                        logprobs=1, output_kind=RequestOutputKind.FINAL_ONLY)
                final = None
                async for out in llm.generate({"prompt_token_ids": ids}, params, rid):
                    final = out
                assert final is not None
                return time.perf_counter(), len(final.outputs[0].token_ids)

            encode = tok.encode
        else:
            from rollout_queue.workers.engines.torch import TorchEngine

            llm = TorchEngine(model, **settings)
            await llm.start()

            async def one(rid: str, ids: list[int], seed: int) -> tuple[float, int]:
                out = await llm.generate(rid, ids, SamplingConfig(max_tokens=max_tokens, seed=seed))
                return time.perf_counter(), len(out.token_ids)

            encode = llm.encode
        jobs = []
        for g, text in enumerate(prompts(groups)):
            ids = encode(text)
            for s in range(n):
                jobs.append(one(f"g{g}-s{s}", ids, g * n + s))
        events = await asyncio.gather(*jobs)
        if engine == "vllm":
            llm.shutdown()
        else:
            await llm.close()
        return list(events)

    with CpuSampler(roles) as cpu:
        events = asyncio.run(main())
    return events, {"steps": parse_steps(tap.lines)}, cpu.samples


def arm_queue(engine: str, model: str, groups: int, n: int, max_tokens: int, slots: int,
              publish_every: float | None, keep_kv: bool = False, max_waiting: int | None = None
              ) -> tuple[list[tuple[float, int]], dict[str, Any], list[tuple[float, dict[str, float]]]]:
    import torch

    from rollout_queue import QueueConfig, RolloutQueue, SourceGroup
    from rollout_queue.devtools.local_server import LocalServer
    from rollout_queue.ops.reaper import run_reaper

    events: list[tuple[float, int]] = []
    info: dict[str, Any] = {"versions": 0}
    with LocalServer("redis") as server, tempfile.TemporaryDirectory(prefix="bench-engine-") as tmp:
        name = "bench-engine"
        cfg = QueueConfig(max_completed_groups=10 * groups, max_retained_groups=10 * groups)
        q = RolloutQueue.from_url(server.url, name, cfg)
        q.submit([SourceGroup(f"g{i}", text, n) for i, text in enumerate(prompts(groups))])
        cmd = [sys.executable, "-m", "rollout_queue.workers", "--url", server.url, "--queue", name,
               "--engine", engine, "--model", model, "--max-tokens", str(max_tokens), "--temperature", "1.0",
               "--seed", "0", "--weights-mode", "continue", "--worker-id", "bench-w0"]
        if max_waiting is not None:  # else the worker's default (2n - 1 on vLLM, 0 on torch)
            cmd += ["--max-waiting", str(max_waiting)]
        extra = {"kv_on_update": "keep"} if keep_kv else {}
        for key, value in {**engine_settings(engine, slots, 0), **extra}.items():
            cmd += ["--engine-arg", f"{key}={json.dumps(value)}"]
        # The worker's log goes to a file (a pipe nobody reads would fill and stall it), kept for a look.
        log_path = Path(tempfile.gettempdir()) / f"bench-engine-{engine}-{os.getpid()}-worker.log"
        log = log_path.open("w")
        worker = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, text=True)
        me = os.getpid()

        def roles() -> dict[str, list[int]]:
            # vLLM: the worker process is the front end, its engine core a child; torch: one process.
            if engine == "vllm":
                return {"trainer": [me], "redis": [server.pid or 0], "frontend": [worker.pid],
                        "engine": children(worker.pid)}
            return {"trainer": [me], "redis": [server.pid or 0], "engine": [worker.pid]}

        sampler = CpuSampler(roles).start()
        stop = threading.Event()
        reaper = threading.Thread(target=run_reaper, args=(RolloutQueue.from_url(server.url, name),),
                                  kwargs={"interval_s": 1.0, "stop": stop}, daemon=True)
        reaper.start()
        publisher = None
        if publish_every:
            from transformers import AutoModelForCausalLM

            from rollout_queue.weights.publisher import WeightPublisher

            policy = AutoModelForCausalLM.from_pretrained(model, torch_dtype=torch.float32)
            pub = WeightPublisher(RolloutQueue.from_url(server.url, name), Path(tmp) / "weights")

            def publishing() -> None:
                version = 0
                while not stop.wait(publish_every):
                    version += 1
                    pub.publish(policy, version)
                    info["versions"] = version

            publisher = threading.Thread(target=publishing, daemon=True)
        committed = 0
        try:
            while committed < groups:
                if worker.poll() is not None:
                    raise RuntimeError(f"the worker exited {worker.returncode} (its log: {log_path}): "
                                       f"{log_path.read_text()[-3000:]}")
                if publisher is not None and publisher.ident is None and events:
                    publisher.start()  # start publishing once generation runs (start-up excluded)
                lease = q.lease(min(8, groups - committed), block_ms=1000, partial=True)
                if lease is None:
                    continue
                now = time.perf_counter()
                for group in lease.groups:
                    events.append((now, sum(len(s.token_ids) for s in group.samples)))
                lease.commit()
                committed += len(lease.groups)
        finally:
            sampler.stop()
            stop.set()
            worker.terminate()
            try:
                worker.wait(60)
            except subprocess.TimeoutExpired:
                worker.kill()
            reaper.join(10)
            if publisher is not None and publisher.is_alive():
                publisher.join(60)
            log.close()
        info["committed"], info["worker_log"] = committed, str(log_path)
        with log_path.open(errors="replace") as lines:
            info["steps"] = parse_steps(lines)
        q.close()
    return events, info, sampler.samples


# -- the driver -------------------------------------------------------------------------------------


def run_arm(arm: str, engine: str, model: Path, a: argparse.Namespace) -> dict[str, Any]:
    with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as f:
        out = f.name
    cmd = [sys.executable, __file__, "--arm", arm, "--engines", engine, "--model", str(model), "--groups",
           str(a.groups), "--n", str(a.n), "--max-tokens", str(a.max_tokens), "--slots", str(a.slots),
           "--publish-every", str(a.publish_every), "--json", out]
    if a.max_waiting is not None:
        cmd += ["--max-waiting", str(a.max_waiting)]
    t = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=3600)
    if proc.returncode != 0:
        raise RuntimeError(f"arm {arm} ({engine}) failed: {proc.stderr[-4000:]}")
    got = json.loads(Path(out).read_text())
    os.unlink(out)
    events = [tuple(e) for e in got["events"]]
    rate, window, total = steady_rate(events)
    cores = cores_in([(ts, by) for ts, by in got.get("cpu", [])], steady_window(events))
    info = dict(got.get("info", {}))
    steps = step_stats([tuple(st) for st in info.pop("steps", [])], a.slots)
    return {"arm": arm, "engine": engine, "tokens_per_s": rate, "window_s": window, "tokens": total,
            "wall_s": time.perf_counter() - t, "cores": cores, "engine_steps": steps, **info}


def median_row(got: list[dict[str, Any]]) -> dict[str, Any]:
    """One arm's repeats as one row: the medians of its rate, window, versions and x bare, and the
    spread of x bare (the figure judged against the target)."""
    ratios = sorted(r["x_bare"] for r in got)
    row = dict(got[0])
    for key in ("tokens_per_s", "window_s", "x_bare"):
        row[key] = statistics.median(r[key] for r in got)
    row["versions"] = int(statistics.median(r.get("versions", 0) for r in got))
    roles = sorted({role for r in got for role in r.get("cores", {})})
    row["cores"] = {role: statistics.median(r.get("cores", {}).get(role, 0.0) for r in got) for role in roles}
    keys = sorted({k for r in got for k in r.get("engine_steps", {})})
    row["engine_steps"] = {k: statistics.median(r["engine_steps"][k] for r in got if k in r.get("engine_steps", {}))
                           for k in keys}
    row.update(x_bare_min=ratios[0], x_bare_max=ratios[-1], repeats=len(got))
    return row


def cores_text(cores: dict[str, float]) -> str:
    """'cores engine 1.62 frontend 0.21 ...' in a fixed role order."""
    order = ("engine", "frontend", "trainer", "redis")
    return "cores " + " ".join(f"{role} {cores[role]:.2f}" for role in order if role in cores)


def steps_text(steps: dict[str, float]) -> str:
    """'steps 4096: 31.6 requests, 97% full, 12.3 ms, 2,610 decode tokens/step-s' (vLLM's per-step report)."""
    if not steps:
        return ""
    return (f"steps {steps['steps']:.0f}: {steps['requests_per_step']:.1f} requests, {steps['full_steps']:.0%} full, "
            f"{steps['ms_per_step']:.1f} ms, {steps['decode_tokens_per_step_s']:,.0f} decode tokens/step-s")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    ap.add_argument("--engines", default="torch,vllm")
    ap.add_argument("--groups", type=int, default=256)
    ap.add_argument("--n", type=int, default=8, help="samples per group")
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--slots", type=int, default=32, help="max_num_seqs (vLLM) / max_batch_size (torch)")
    ap.add_argument("--publish-every", type=float, default=2.0, help="seconds between versions, queue+weights")
    ap.add_argument("--repeats", type=int, default=3, help="runs of every arm, interleaved; rows give medians")
    ap.add_argument("--arms", default=None, help="only these arms (bare is always run: the ratios need it)")
    ap.add_argument("--max-waiting", type=int, default=None,
                    help="the queue arms' worker --max-waiting (default: the worker's own default)")
    ap.add_argument("--model", default=None, help="a model folder (default: a tiny Llama built here)")
    ap.add_argument("--arm", choices=ARMS, default=None, help=argparse.SUPPRESS)
    ap.add_argument("--json", default=None, help="write the rows to this file")
    ap.add_argument("--results", default=None,
                    help="replace the `engine` section of this results file (benchmarks/results.json: "
                         "the tables of docs/PERFORMANCE.md are generated from it)")
    a = ap.parse_args(argv)
    unknown = set(a.arms.split(",")) - set(ARMS) if a.arms else set()
    if unknown:
        ap.error(f"--arms: no arm {', '.join(sorted(unknown))} (arms: {', '.join(ARMS)})")
    if a.arm:  # one arm, in this process
        engine = a.engines
        if a.arm == "bare":
            events, info, cpu = arm_bare(engine, a.model, a.groups, a.n, a.max_tokens, a.slots)
        else:
            events, info, cpu = arm_queue(engine, a.model, a.groups, a.n, a.max_tokens, a.slots,
                                          a.publish_every if a.arm.startswith("queue+weights") else None,
                                          keep_kv=a.arm == "queue+weights+keep", max_waiting=a.max_waiting)
        Path(a.json).write_text(json.dumps({"events": events, "info": info, "cpu": cpu}))
        return 0

    from rollout_queue.workers.tiny_model import build_tiny_model

    with tempfile.TemporaryDirectory(prefix="bench-engine-model-") as tmp:
        model = Path(a.model) if a.model else build_tiny_model(Path(tmp) / "tiny", max_position_embeddings=512)
        runs: dict[tuple[str, str], list[dict[str, Any]]] = {}
        load = os.getloadavg()[0]
        print(f"{'engine':7} {'arm':19} {'tokens':>7} {'window s':>8} {'tokens/s':>9} {'x bare':>7} {'versions':>8}",
              flush=True)
        for rep in range(a.repeats):
            for engine in a.engines.split(","):
                bare = None
                for arm in [x for x in ENGINE_ARMS[engine] if x == "bare" or not a.arms or x in a.arms.split(",")]:
                    row = run_arm(arm, engine, model, a)
                    bare = bare or row["tokens_per_s"]
                    row["x_bare"] = row["tokens_per_s"] / bare
                    runs.setdefault((engine, arm), []).append(row)
                    print(f"{engine:7} {arm:19} {row['tokens']:>7} {row['window_s']:>8.2f} {row['tokens_per_s']:>9.0f} "
                          f"{row['x_bare']:>7.3f} {row.get('versions', 0):>8}   {cores_text(row['cores'])}   "
                          f"{steps_text(row['engine_steps'])}   (repeat {rep + 1}/{a.repeats})", flush=True)
        rows = [median_row(got) for got in runs.values()]
        print("\nmedians over the repeats:")
        for row in rows:
            print(f"{row['engine']:7} {row['arm']:19} {row['tokens']:>7} {row['window_s']:>8.2f} "
                  f"{row['tokens_per_s']:>9.0f} {row['x_bare']:>7.3f} {row.get('versions', 0):>8}   "
                  f"x bare {row['x_bare_min']:.3f} - {row['x_bare_max']:.3f}   {cores_text(row['cores'])}   "
                  f"{steps_text(row['engine_steps'])}", flush=True)
    from bench_common import run_environment, write_rows

    env = run_environment(load, groups=a.groups, n=a.n, max_tokens=a.max_tokens, slots=a.slots,
                          publish_every_s=a.publish_every, target=TARGET, repeats=a.repeats,
                          **({"max_waiting": a.max_waiting} if a.max_waiting is not None else {}))
    print(f"target: queue >= {TARGET:.2f} x bare; load average {env['loadavg_start']:.2f} -> {env['loadavg_end']:.2f}, "
          f"{env['cpus']} CPUs")
    write_rows("engine", env, rows, a.json, a.results)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
