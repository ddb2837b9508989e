"""The crash tests' shared loop (issue 31: loss accounting across a crash, counted the way NeMo-RL #3599
counted it): run a framework-shaped trainer until it finishes, SIGKILLing it at random points, then
count what the surviving lineage trained. Each trainer (slime_trainer.py, miles_trainer.py,
nemo_rl_trainer.py) appends one JSON line per step it trained (``{step_key: k, items_key: [...]}``)
and one ``{"resume": k}`` line when it resumes from checkpoint k (``trained_log``), and resumes from
the newest checkpoint folder it finalised (``newest_checkpoint``).
"""

from __future__ import annotations

import json
import os
import random
import re
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Sequence

from rollout_queue import SourceGroup
from tests.helpers import wait_until

REPO = Path(__file__).resolve().parents[2]


def newest_checkpoint(ckpt: Path, prefix: str, default: int) -> int:
    """The highest ``k`` of the finalised ``{prefix}{k}`` folders in ``ckpt`` (created if missing), else
    ``default``: the checkpoint a trainer incarnation resumes from."""
    ckpt.mkdir(parents=True, exist_ok=True)
    pattern = re.compile(re.escape(prefix) + r"(\d+)")
    return max((int(m.group(1)) for p in ckpt.iterdir() if (m := pattern.fullmatch(p.name))), default=default)


@contextmanager
def trained_log(path: str | Path) -> Iterator[Callable[[dict[str, Any]], None]]:
    """A writer of the trainer's JSON lines: each is flushed and fsynced before it returns, so a
    SIGKILL right after loses none (a step is logged before the checkpoint that covers it)."""
    with open(path, "a") as out:
        def write(line: dict[str, Any]) -> None:
            out.write(json.dumps(line) + "\n")
            out.flush()
            os.fsync(out.fileno())

        yield write


def resumes(out: Path) -> int:
    """How many times a trainer resumed (its ``{"resume": k}`` lines)."""
    return out.read_text().count('"resume"') if out.exists() else 0


def kill_until_done(cmd: Sequence[str], out: Path, rng: random.Random, kills: int,
                    after_kill: Callable[[], None] = lambda: None,
                    before_start: Callable[[], None] = lambda: None) -> int:
    """Start ``cmd`` again and again: each of the first ``kills`` incarnations is SIGKILLed a random
    0-2 s after it resumed (or left alone if it ended first), ``after_kill`` runs after each kill
    (the reaper's part), and the last one must finish with exit 0. Returns the kills done."""
    done = 0
    while True:
        before_start()
        resumed = resumes(out)
        child = subprocess.Popen(list(cmd), cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        if done < kills:
            wait_until(lambda: resumes(out) > resumed or child.poll() is not None, timeout=120)
            time.sleep(rng.uniform(0.0, 2.0))
            if child.poll() is None:
                child.send_signal(signal.SIGKILL)
                done += 1
                child.wait(60)
                after_kill()
                continue
        output = child.communicate(timeout=300)[0].decode(errors="replace")
        assert child.returncode == 0, output[-3000:]
        return done


def rollout_crash_run(q: Any, url: str, tmp_path: Path, trainer: str, first_kill: Sequence[str],
                      extra: Sequence[str] = (), after_kill: Callable[[], None] = lambda: None,
                      before_start: Callable[[], None] = lambda: None,
                      prompts: int = 24, rollouts: int = 12, per_rollout: int = 2) -> tuple[int, Path]:
    """A rollout-shaped trainer (``tests/integrations/<trainer>``: slime_trainer.py, miles_trainer.py)
    over ``prompts`` groups while one real scripted worker regenerates what comes back: its first
    incarnation killed where ``first_kill`` says (it must die by SIGKILL), then 3 more SIGKILLed at
    random points, the last left to finish. Returns (kills, the trained log) for the caller's count."""
    from tests.integrations.test_hang_to_error import bench

    q.submit([SourceGroup(f"s{i}", f"prompt {i}", 2, {}, (1, 2, 3)) for i in range(prompts)])
    worker = bench.spawn_worker(url, q.name, "w1", tmp_path / "w1.log", "--reward", "length_reward",
                                "--engine", "scripted", "--engine-arg", "latency_s=0.02")
    out, ckpt = tmp_path / "trained.jsonl", tmp_path / "ckpt"
    cmd = [sys.executable, str(REPO / "tests/integrations" / trainer), "--out", str(out),
           "--checkpoints", str(ckpt), "--num-rollout", str(rollouts), "--groups", str(per_rollout),
           "--save-interval", "3", "--step-s", "0.2", *extra]
    try:
        first = subprocess.run([*cmd, *first_kill], cwd=REPO, capture_output=True, timeout=300)
        assert first.returncode == -signal.SIGKILL, first.stdout.decode(errors="replace")[-3000:]
        kills = kill_until_done(cmd, out, random.Random(31), 3, after_kill=after_kill, before_start=before_start)
    finally:
        bench.kill_all([worker])
    return kills, out


def trained_lineage(out: Path, step_key: str, items_key: str) -> tuple[dict[int, list[str]], Counter[str]]:
    """(step -> items trained at it, item -> times trained) over the surviving lineage: what an
    incarnation trained after the checkpoint the next one resumed from died with its weights."""
    kept: dict[int, list[str]] = {}
    for line in out.read_text().splitlines():
        rec = json.loads(line)
        if "resume" in rec:
            kept = {k: v for k, v in kept.items() if k <= rec["resume"]}
        elif step_key in rec:
            kept[rec[step_key]] = rec[items_key]
    return kept, Counter(item for items in kept.values() for item in items)
