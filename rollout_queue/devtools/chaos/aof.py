"""What ``appendfsync everysec`` may lose, made concrete: a host-crash simulation on the AOF.

A SIGKILL of Redis alone loses nothing that Redis has written: the bytes sit in the kernel's page
cache, which outlives the process. What ``everysec`` gives up is the data not yet fsynced when the
*host* dies: at most the last second of writes (Redis fsyncs once a second; when a slow fsync is
still running it may postpone the write itself by up to 2 s more, which Redis counts in
``aof_delayed_fsync``). To exercise that loss, this module samples the size of the live
incremental AOF file every ``period_s`` and, at a kill, truncates the file back to its size
``window_s`` before the kill: exactly the writes of the last second are gone. Redis then loads the
truncated file (``aof-load-truncated yes``, the default, drops a torn command or an unfinished
MULTI/EXEC, so every script stays atomic).

It owns only the AOF files of a server the harness started; it never connects to Redis.
"""

from __future__ import annotations

import os
import threading
import time
from collections import deque
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Crash:
    """One simulated host crash: writes after ``loss_from`` (wall clock) were dropped."""

    kill_t: float
    loss_from: float
    file: str
    size_before: int
    size_after: int

    @property
    def dropped_bytes(self) -> int:
        return self.size_before - self.size_after


def live_incr_file(directory: Path, dirname: str = "appendonlydir") -> Path | None:
    """The incremental AOF Redis appends to now (the last ``type i`` line of the manifest)."""
    aof_dir = directory / dirname
    manifests = sorted(aof_dir.glob("*.manifest"))
    if not manifests:
        return None
    name = None
    for line in manifests[-1].read_text().splitlines():
        parts = line.split()
        if "type" in parts and parts[parts.index("type") + 1] == "i":
            name = parts[parts.index("file") + 1]
    return aof_dir / name if name else None


class AofTail:
    """Samples (time, file, size) of the live incremental AOF on a thread."""

    def __init__(self, directory: Path, period_s: float = 0.05, keep_s: float = 10.0) -> None:
        self.directory, self.period_s, self.keep_s = directory, period_s, keep_s
        self.samples: deque[tuple[float, Path, int]] = deque()
        self.refusal = ""  # why the last crash() cut nothing
        self.lock = threading.Lock()
        self.halt = threading.Event()
        self.thread = threading.Thread(target=self._run, name="aof-tail", daemon=True)

    def start(self) -> "AofTail":
        self.thread.start()
        return self

    def stop(self) -> None:
        self.halt.set()
        self.thread.join(timeout=2)

    def _run(self) -> None:
        while not self.halt.wait(self.period_s):
            path = live_incr_file(self.directory)
            if path is None:
                continue
            try:
                size = path.stat().st_size
            except FileNotFoundError:
                continue  # a rewrite swapped the file between the manifest read and the stat
            now = time.time()
            with self.lock:
                self.samples.append((now, path, size))
                while self.samples and self.samples[0][0] < now - self.keep_s:
                    self.samples.popleft()

    def reset(self) -> None:
        """Forget the samples: after a restart, sizes of the previous incarnation mean nothing."""
        with self.lock:
            self.samples.clear()

    def crash(self, kill_t: float, window_s: float) -> Crash | None:
        """Call after the server is dead: drop every byte written after ``kill_t - window_s``.
        None when no sample is old enough (the server started less than a window ago)."""
        with self.lock:
            older = [s for s in self.samples if s[0] <= kill_t - window_s]
            self.refusal = f"no sample older than {window_s}s (of {len(self.samples)})"
        if not older:
            return None
        t, path, size = older[-1]
        live = live_incr_file(self.directory)
        if live != path:
            self.refusal = f"the live AOF is {live}, the sample was of {path}"
            return None  # an AOF rewrite happened inside the window: nothing safe to cut
        before = path.stat().st_size
        if size < before:
            with open(path, "r+b") as fh:
                fh.truncate(size)
                os.fsync(fh.fileno())
        self.reset()
        return Crash(kill_t, t, path.name, before, min(size, before))
