"""Logging set-up for the processes (reaper, workers, CLI): human-readable by default, JSON lines with
``--json-logs``. Library code only calls ``logging.getLogger(...).info(msg, extra={"fields": {...}})``;
it never configures handlers itself.
"""

from __future__ import annotations

import logging
import sys
import time
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


def fields(**values: Any) -> dict[str, Any]:
    """``extra=`` payload for a structured log call."""
    return {"fields": values}
