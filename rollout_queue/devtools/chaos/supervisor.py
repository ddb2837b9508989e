"""The processes of a run: spawn each role, notice deaths, restart after a random delay.

Owns the child processes only (their argv, log paths, exit codes, SIGSTOP state); it never talks to
Redis. Every spawn, exit and signal is written to the harness log, which the checker reads to know
which pid was paused when. A role that exits 0 on its own (the producer, done) is not restarted.
Children get PR_SET_PDEATHSIG, so a harness killed with SIGKILL leaves no orphan behind.
"""

from __future__ import annotations

import ctypes
import os
import random
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable

from rollout_queue.devtools.chaos.oplog import OpLog

_PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:
    ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)


@dataclass
class Slot:
    """One role instance (``worker`` 2, ``reaper`` 0 ...) and its current process."""

    role: str
    index: int
    argv: Callable[[Path], list[str]]  # log path -> command line
    log_suffix: str = ".jsonl"
    proc: subprocess.Popen[bytes] | None = None
    starts: int = 0
    restart_at: float | None = None
    done: bool = False
    paused: bool = False
    log_path: Path | None = None
    exits: list[int] = field(default_factory=list)

    @property
    def name(self) -> str:
        return f"{self.role}{self.index}"

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None and self.proc.poll() is None else None


class Supervisor:
    """Starts slots, restarts the dead ones after ``restart_delay_s`` (uniform range). Children run in
    ``root`` with it first on PYTHONPATH, so they import the packages found there."""

    def __init__(self, root: Path, log_dir: Path, log: OpLog, rng: random.Random,
                 restart_delay_s: tuple[float, float] = (0.2, 2.0)) -> None:
        self.root, self.log_dir, self.log, self.rng = root, log_dir, log, rng
        self.restart_delay_s = restart_delay_s
        self.slots: list[Slot] = []
        self.env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(root), os.environ.get("PYTHONPATH", "")])}

    def run_once(self, argv: list[str], timeout_s: float = 60.0) -> int:
        """Run one helper process to completion (output to <log_dir>/init.out); its exit code."""
        with open(self.log_dir / "init.out", "ab") as out:
            return subprocess.run([sys.executable, *argv], cwd=self.root, env=self.env, stdin=subprocess.DEVNULL,
                                  stdout=out, stderr=subprocess.STDOUT, timeout=timeout_s).returncode

    def add(self, slot: Slot) -> Slot:
        self.slots.append(slot)
        self.spawn(slot)
        return slot

    def spawn(self, slot: Slot) -> None:
        slot.starts += 1
        slot.log_path = self.log_dir / f"{slot.name}-{slot.starts:03d}{slot.log_suffix}"
        out = open(self.log_dir / f"{slot.name}-{slot.starts:03d}.out", "ab")
        slot.proc = subprocess.Popen([sys.executable, *slot.argv(slot.log_path)], cwd=self.root, env=self.env,
                                     stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                     preexec_fn=_die_with_parent)
        out.close()  # the child holds its own copy
        slot.restart_at, slot.paused = None, False
        self.log.write("spawn", slot=slot.name, child=slot.proc.pid, start=slot.starts, log=slot.log_path.name)

    def poll(self, now: float, restart: bool = True) -> None:
        """Record exits; schedule and perform restarts."""
        for slot in self.slots:
            if slot.proc is not None and slot.restart_at is None and not slot.done:
                code = slot.proc.poll()
                if code is not None:
                    slot.exits.append(code)
                    self.log.write("exit", slot=slot.name, child=slot.proc.pid, code=code)
                    if code == 0 and slot.role == "producer":
                        slot.done = True
                    else:
                        slot.restart_at = now + self.rng.uniform(*self.restart_delay_s)
            if restart and slot.restart_at is not None and now >= slot.restart_at:
                self.spawn(slot)

    def running(self, *roles: str) -> list[Slot]:
        return [s for s in self.slots if s.role in roles and s.pid is not None and not s.paused]

    def signal(self, slot: Slot, sig: signal.Signals, kind: str, **extra: object) -> bool:
        pid = slot.pid
        if pid is None:
            return False
        os.kill(pid, sig)
        if sig == signal.SIGSTOP:
            slot.paused = True
        elif sig == signal.SIGCONT:
            slot.paused = False
        self.log.write("signal", slot=slot.name, child=pid, sig=sig.name, kind=kind, **extra)
        return True

    def stop_all(self, roles: Iterable[str] | None = None, timeout_s: float = 15.0) -> None:
        """SIGCONT the paused, SIGTERM everyone (or the slots of ``roles``: workers close and
        requeue), SIGKILL stragglers; a stopped slot is never restarted."""
        slots = [s for s in self.slots if roles is None or s.role in roles]
        for slot in slots:
            slot.restart_at = None
            if slot.pid is not None:
                if slot.paused:
                    self.signal(slot, signal.SIGCONT, "shutdown")
                self.signal(slot, signal.SIGTERM, "shutdown")
        deadline = time.monotonic() + timeout_s
        for slot in slots:
            if slot.proc is None or slot.done:
                continue
            try:
                slot.proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                self.signal(slot, signal.SIGKILL, "shutdown_straggler")
                slot.proc.wait()
            self.log.write("exit", slot=slot.name, child=slot.proc.pid, code=slot.proc.returncode, final=True)
            slot.done = True
