"""ops/logs.configure: with JSON logs, every line a process writes to stderr is one JSON object,
library warnings included (a redis-py UserWarning once broke a worker's --json-logs output)."""

from __future__ import annotations

import io
import json
import logging
import sys
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


def test_fallback_shows_the_library_lines_only_while_the_application_configured_none(
        capsys: pytest.CaptureFixture[str]) -> None:
    """A trainer adapter in a script with no logging set-up still says what it restored (issue 32,
    item 4); once the script configures its own logging, the line goes there alone (not twice)."""
    lib = logging.getLogger("rollout_queue")
    root = logging.getLogger()
    saved_root, saved_level, saved_lib = list(root.handlers), lib.level, list(lib.handlers)
    for h in saved_root:
        root.removeHandler(h)
    try:
        logs.fallback()
        logs.fallback()  # idempotent: one handler
        assert sum(isinstance(h, logs._Fallback) for h in lib.handlers) == 1
        logging.getLogger("rollout_queue.integrations.trl").info("restored the queue to the checkpoint",
                                                                 extra=logs.fields(step=10, requeued=8))
        err = capsys.readouterr().err
        assert "restored the queue to the checkpoint step=10 requeued=8" in err and err.count("\n") == 1
        mine = logging.StreamHandler(open("/dev/null", "w"))  # the application's own handler
        root.addHandler(mine)
        logging.getLogger("rollout_queue.x").info("only through the application's handler")
        assert capsys.readouterr().err == ""
        root.removeHandler(mine)
        mine.stream.close()
    finally:
        for h in list(lib.handlers):
            if h not in saved_lib:
                lib.removeHandler(h)
        lib.setLevel(saved_level)
        for h in saved_root:
            root.addHandler(h)


def test_progress_logs_a_long_step_and_its_duration_off_a_terminal(caplog: pytest.LogCaptureFixture) -> None:
    log = logging.getLogger("rollout_queue.test_progress")
    with caplog.at_level(logging.INFO, logger="rollout_queue.test_progress"):
        with logs.progress(log, "loading the model", model="./tiny"):
            pass
    messages = [(r.getMessage(), getattr(r, "fields", {})) for r in caplog.records]
    assert messages[0] == ("loading the model ...", {"model": "./tiny"})
    assert messages[1][0] == "loading the model: done" and set(messages[1][1]) == {"seconds", "model"}


def test_the_fallback_writes_to_the_stderr_of_the_moment(capsys: pytest.CaptureFixture[str]) -> None:
    """Added while stderr was another stream (an earlier test's capture, a notebook's redirect), the
    fallback still writes where stderr is when the record comes: it failed in the full suite, where an
    adapter imported by an earlier test had added it."""
    lib = logging.getLogger("rollout_queue")
    root = logging.getLogger()
    saved_root, saved_level, saved_lib = list(root.handlers), lib.level, list(lib.handlers)
    for h in saved_root:
        root.removeHandler(h)
    for h in saved_lib:
        lib.removeHandler(h)
    then = sys.stderr
    try:
        sys.stderr = io.StringIO()
        logs.fallback()
        sys.stderr = then
        logging.getLogger("rollout_queue.x").info("seen now")
        assert "seen now" in capsys.readouterr().err
    finally:
        sys.stderr = then
        for h in list(lib.handlers):
            lib.removeHandler(h)
        for h in saved_lib:
            lib.addHandler(h)
        lib.setLevel(saved_level)
        for h in saved_root:
            root.addHandler(h)
