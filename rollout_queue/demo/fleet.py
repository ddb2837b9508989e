"""The demo's worker processes: ``python -m rollout_queue.workers`` started, killed (SIGKILL: a host crash) and
stopped (SIGTERM: a drain), each in its own process group so vLLM's EngineCore goes with it.

It owns only process lifetimes and their log files; the workers themselves are ``workers.cli``.
"""

from __future__ import annotations

import importlib.util
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Sequence


def vllm_available() -> bool:
    """True when vLLM is installed here (found, not imported: importing it costs seconds; a broken
    install shows in the worker's start-up error, with the hint to pass --engine torch)."""
    return importlib.util.find_spec("vllm") is not None


def engine_args(engine: str) -> list[str]:
    """Per-engine options sized for the tiny model on a small CPU box."""
    if engine == "vllm":
        return ["--engine-arg", "multiprocessing=false", "--engine-arg", "max_model_len=256",
                "--engine-arg", f"kv_cache_memory_bytes={64 * 2**20}", "--engine-arg", "max_num_seqs=128"]
    if engine == "torch":
        return ["--engine-arg", "max_batch_size=64"]
    return []


def split_cpus() -> tuple[frozenset[int], frozenset[int]] | None:
    """(trainer CPUs, worker CPUs): disjoint halves of this process's CPUs, the CPU stand-in for a
    trainer GPU pool and a generation GPU pool. None with fewer than 2 CPUs (or no affinity API)."""
    if not hasattr(os, "sched_getaffinity"):
        return None
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        return None
    half = len(cpus) // 2
    return frozenset(cpus[:half]), frozenset(cpus[half:])


def worker_env() -> dict[str, str]:
    """Offline, quiet, one compute thread per worker (the box is shared with the trainer)."""
    env = dict(os.environ)
    env.update({"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1",
                "TOKENIZERS_PARALLELISM": "false", "VLLM_LOGGING_LEVEL": "WARNING", "OMP_NUM_THREADS": "1",
                "VLLM_CPU_OMP_THREADS_BIND": "nobind", "PYTHONUNBUFFERED": "1"})
    return env


@dataclass
class WorkerProcess:
    """One ``python -m rollout_queue.workers`` process and its log file."""

    worker_id: str
    argv: list[str]
    log_path: Path
    cpus: frozenset[int] | None = None
    proc: subprocess.Popen[bytes] | None = None
    killed_at: float | None = None
    _log: IO[bytes] | None = field(default=None, repr=False)

    def start(self) -> "WorkerProcess":
        self._log = self.log_path.open("ab")
        cpus = self.cpus

        def pin() -> None:  # in the child, before exec: vLLM's EngineCore inherits the affinity
            if cpus:
                os.sched_setaffinity(0, cpus)

        self.proc = subprocess.Popen(self.argv, stdout=self._log, stderr=subprocess.STDOUT, env=worker_env(),
                                     start_new_session=True,  # its own group: vLLM's children die with it
                                     preexec_fn=pin if cpus else None)
        return self

    @property
    def pid(self) -> int | None:
        return None if self.proc is None else self.proc.pid

    def status(self) -> str:
        if self.proc is None:
            return "not started"
        code = self.proc.poll()
        if code is None:
            return "running"
        return "killed (SIGKILL)" if self.killed_at is not None else f"exited {code}"

    def kill(self) -> None:
        """SIGKILL the whole process group: no drain, no close, the heartbeat stops (a crash)."""
        if self.proc is not None and self.proc.poll() is None:
            self.killed_at = time.monotonic()
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()

    def stop(self, timeout_s: float = 30.0) -> int | None:
        """SIGTERM (drain: finish or requeue owned work, deregister), then SIGKILL after the timeout."""
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        self._reap_group()
        if self._log is not None:
            self._log.close()
        return self.proc.returncode

    def _reap_group(self) -> None:
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)  # type: ignore[union-attr]  # stragglers (EngineCore)
        except ProcessLookupError:
            return  # the whole group is gone already: nothing to reap

    def log_tail(self, lines: int = 20) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except FileNotFoundError:
            return ""


def start_workers(count: int, *, url: str, queue: str, engine: str, model_dir: Path, log_dir: Path,
                  reward: str | None, max_tokens: int, weights_mode: str, cpus: frozenset[int] | None = None,
                  extra: Sequence[str] = ()) -> list[WorkerProcess]:
    """``count`` worker processes on ``queue``, each generating with ``engine`` from ``model_dir``
    (on the CPUs ``cpus`` when given)."""
    log_dir.mkdir(parents=True, exist_ok=True)
    fleet = []
    for i in range(count):
        worker_id = f"demo-worker-{i + 1}"
        argv = [sys.executable, "-m", "rollout_queue.workers", "--url", url, "--queue", queue, "--engine", engine,
                "--model", os.fspath(model_dir), "--worker-id", worker_id, "--max-tokens", str(max_tokens),
                "--temperature", "1.0", *(["--reward", reward] if reward else []), "--weights-mode", weights_mode,
                "--block-ms", "250",
                "--drain-timeout", "5", *engine_args(engine), *extra]
        fleet.append(WorkerProcess(worker_id, argv, log_dir / f"{worker_id}.log", cpus).start())
    return fleet
