"""ops/logs.configure: with JSON logs, every line a process writes to stderr is one JSON object,
library warnings included (a redis-py UserWarning once broke a worker's --json-logs output)."""

from __future__ import annotations

import json
import logging
import warnings
from collections.abc import Iterator

import pytest

from rollout_queue.ops import logs


@pytest.fixture
def restore_logging() -> Iterator[None]:
    # An earlier in-process CLI test may have configured logging already; pytest's per-test
    # warnings capture then undid the showwarning hook that captureWarnings(True) believes it holds.
    logging.captureWarnings(False)
    root = logging.getLogger()
    level = root.level
    yield
    for handler in list(root.handlers):
        if getattr(handler, "_rollout_queue", False):
            root.removeHandler(handler)
    root.setLevel(level)
    logging.captureWarnings(False)


def test_json_logs_carry_warnings_as_json_lines(restore_logging: None, capsys: pytest.CaptureFixture[str]) -> None:
    logs.configure(json_logs=True)  # on the test's sys.stderr, which capsys reads
    logging.getLogger("rollout_queue.test").info("worker started", extra=logs.fields(worker="w-1"))
    with warnings.catch_warnings():
        warnings.simplefilter("always")
        warnings.warn("a library complains\non two lines", UserWarning, stacklevel=1)
    lines = [json.loads(line) for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert [line["logger"] for line in lines] == ["rollout_queue.test", "py.warnings"]
    assert lines[0]["worker"] == "w-1" and "a library complains" in lines[1]["msg"]
    assert lines[1]["level"] == "warning"


def test_configure_twice_keeps_one_handler(restore_logging: None, capsys: pytest.CaptureFixture[str]) -> None:
    logs.configure(json_logs=True)
    logs.configure(json_logs=False)
    ours = [h for h in logging.getLogger().handlers if getattr(h, "_rollout_queue", False)]
    assert len(ours) == 1
    logging.getLogger("rollout_queue.test").warning("once")
    assert capsys.readouterr().err.count("once") == 1
