"""Logging set-up for the processes (reaper, workers, CLI, the examples): human-readable by default,
JSON lines with ``--json-logs``. Library code only calls ``logging.getLogger(...).info(msg,
extra={"fields": {...}})``; it never configures the application's handlers. Two exceptions, both for
a process whose user configured no logging at all: ``fallback`` (a trainer adapter built in a plain
script still says what it restored, on stderr, until the application installs a handler of its own),
and ``progress`` (a long start-up step, an import of torch/vLLM/TRL or a model load, shows that it
is under way: a spinner on a terminal, a log line otherwise).
"""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import orjson

from rollout_queue.ops.escape import clean, json_safe


class JsonFormatter(logging.Formatter):
    """One JSON object per line: ts, level, logger, msg and the record's structured ``fields``."""

    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, Any] = {
            "ts": round(record.created, 3),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
            **getattr(record, "fields", {}),
        }
        if record.exc_info:
            line["exc"] = self.formatException(record.exc_info)
        return json_safe(orjson.dumps(line, default=str).decode())


class HumanFormatter(logging.Formatter):
    """``HH:MM:SS level logger: msg key=value ...``, one line: the message and every value are
    escaped (escape.clean), since they may quote text from Redis (a corrupt field, a worker id)."""

    def format(self, record: logging.LogRecord) -> str:
        fields = " ".join(f"{clean(k)}={clean(v)}" for k, v in getattr(record, "fields", {}).items())
        stamp = time.strftime("%H:%M:%S", time.localtime(record.created))
        text = f"{stamp} {record.levelname.lower():5} {record.name}: {clean(record.getMessage())}" + (
            f" {fields}" if fields else "")
        if record.exc_info:
            text += "\n" + self.formatException(record.exc_info)
        return text


def configure(json_logs: bool = False, level: int | str = logging.INFO) -> None:
    """Install one stderr handler on the root logger (idempotent), and route Python warnings
    (a library's DeprecationWarning, UserWarning, ...) through it as records of ``py.warnings``, so
    that with ``json_logs`` every line a process writes to stderr is one JSON object."""
    root = logging.getLogger()
    for handler in list(root.handlers):
        if getattr(handler, "_rollout_queue", False):
            root.removeHandler(handler)
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if json_logs else HumanFormatter())
    handler._rollout_queue = True  # type: ignore[attr-defined]  # marks our handler for idempotence
    root.addHandler(handler)
    root.setLevel(level)
    logging.captureWarnings(True)


class _Fallback(logging.StreamHandler):
    """stderr for ``rollout_queue``'s records only while the root logger has no handler (the
    application configured no logging); once it has one, the records go there alone (no line twice).
    It writes to whatever ``sys.stderr`` is when a record comes (as logging's last-resort handler
    does), not the stream of the day it was added: a process that swaps stderr later still sees it."""

    def __init__(self) -> None:
        super().__init__()

    @property
    def stream(self) -> Any:
        return sys.stderr

    @stream.setter
    def stream(self, value: Any) -> None:  # StreamHandler.__init__ sets it; the live sys.stderr wins
        pass

    def emit(self, record: logging.LogRecord) -> None:
        if not logging.getLogger().handlers:
            super().emit(record)


def fallback(level: int = logging.INFO) -> None:
    """Make ``rollout_queue``'s INFO lines visible in a process that configured no logging (idempotent).
    Why: Python drops INFO records by default, and a trainer's "restored the queue to the checkpoint
    ... requeued=N" is what a resumed run must say."""
    lib = logging.getLogger("rollout_queue")
    if any(isinstance(h, _Fallback) for h in lib.handlers):
        return
    handler = _Fallback()
    handler.setFormatter(HumanFormatter())
    lib.addHandler(handler)
    if lib.getEffectiveLevel() > level:
        lib.setLevel(level)


@contextmanager
def progress(logger: logging.Logger, what: str, **values: Any) -> Iterator[None]:
    """A long start-up step: a rich spinner on stderr when it is a terminal (rich installed), a log
    line otherwise; then one line with how long it took (the step's cost is in every log)."""
    start = time.monotonic()
    status = _spinner(what)
    if status is None:
        logger.info(f"{what} ...", extra=fields(**values))
    try:
        yield
    finally:
        if status is not None:
            status.stop()
    logger.info(f"{what}: done", extra=fields(seconds=round(time.monotonic() - start, 1), **values))


def _spinner(what: str) -> Any:
    """A started rich status on stderr, or None (not a terminal, or no rich: the ``cli`` extra)."""
    if not sys.stderr.isatty():
        return None
    try:
        from rich.console import Console
    except ImportError:
        return None
    status = Console(stderr=True).status(clean(what) + " ...")
    status.start()
    return status


def fields(**values: Any) -> dict[str, Any]:
    """``extra=`` payload for a structured log call."""
    return {"fields": values}
