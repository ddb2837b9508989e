"""One append-only JSONL operation log per process.

Owns the line format the checker reads: every line is one JSON object with ``t`` (wall clock,
seconds: one clock for every process of this machine), ``role``, ``pid``, ``op`` and the operation's
fields. Each line is written with one ``os.write`` on an ``O_APPEND`` descriptor, so a SIGKILL can
cut a process between two operations but never leaves half a line that a later line continues.
It must not buffer: a line that was written is in the file even if the process dies next.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any, Iterator

import orjson


class OpLog:
    """Append operations of one process to ``path``."""

    def __init__(self, path: str | os.PathLike[str], role: str, **context: Any) -> None:
        self.path = Path(path)
        self.role = role
        self.context = {"role": role, "pid": os.getpid(), **context}
        self.fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)

    def write(self, op: str, **fields: Any) -> float:
        """Record one operation; returns the timestamp written."""
        t = time.time()
        line = orjson.dumps({"t": t, "op": op, **self.context, **fields}, default=str) + b"\n"
        os.write(self.fd, line)
        return t

    def close(self) -> None:
        os.close(self.fd)


def read_log(path: str | os.PathLike[str]) -> Iterator[dict[str, Any]]:
    """The records of one log; a torn last line (the process died mid-write) is skipped."""
    with open(path, "rb") as fh:
        for raw in fh:
            if not raw.endswith(b"\n"):
                return  # the only line a SIGKILL can tear is the last one
            yield orjson.loads(raw)


def read_logs(directory: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """Every record of every ``*.jsonl`` log in ``directory``, each tagged with its file name."""
    out = []
    for path in sorted(Path(directory).glob("*.jsonl")):
        for rec in read_log(path):
            rec["file"] = path.name
            out.append(rec)
    return out


class LogTail:
    """The records appended to a directory's ``*.jsonl`` logs since the last ``read()``: each file
    is read from where the previous call stopped, and a line not yet ended by its newline (a writer
    in mid-write) waits for the next call. For watching a run while it goes (progress.py)."""

    def __init__(self, directory: str | os.PathLike[str]) -> None:
        self.directory = Path(directory)
        self.offsets: dict[Path, int] = {}

    def read(self) -> list[dict[str, Any]]:
        out = []
        for path in sorted(self.directory.glob("*.jsonl")):
            start = self.offsets.get(path, 0)
            try:
                with open(path, "rb") as fh:
                    fh.seek(start)
                    data = fh.read()
            except FileNotFoundError:
                continue
            end = data.rfind(b"\n") + 1
            if not end:
                continue
            self.offsets[path] = start + end
            for raw in data[:end].splitlines():
                rec = orjson.loads(raw)
                rec["file"] = path.name
                out.append(rec)
        return out
