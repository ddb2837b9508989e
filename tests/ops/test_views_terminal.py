"""`verify`, `dlq list` and `dlq show` read well in a real 80-column terminal (tmux, its screen read
back with capture-pane, as test_top_terminal.py does for `top`): a header, human-readable times,
the last attempt's reason, nothing wider than the terminal; and an empty DLQ says so."""

from __future__ import annotations

import shlex
import shutil
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from tests.helpers import wait_until
from tests.ops.conftest import KnownState

ROOT = Path(__file__).resolve().parents[2]
DONE = "__rq_done__"

pytestmark = pytest.mark.skipif(shutil.which("tmux") is None, reason="no tmux here")


def screen_of(st: KnownState, *args: str, width: int = 80, height: int = 60) -> list[str]:
    """What ``rollout-queue ARGS`` leaves on a ``width`` x ``height`` terminal, with its exit code
    on the last line (``__rq_done__ <code>``)."""
    session = f"rq-view-{uuid.uuid4().hex[:8]}"
    command = " ".join(shlex.quote(a) for a in (
        "env", f"PYTHONPATH={ROOT}", sys.executable, "-m", "rollout_queue", "--url", st.url, "--queue", st.queue,
        *args))
    shell = f"{command}; echo {DONE} $?; sleep 120"
    tmux = ["tmux", "-L", session]  # a tmux server of its own: no race with another session's ending
    subprocess.run([*tmux, "new-session", "-d", "-s", session, "-x", str(width), "-y", str(height), shell], check=True)
    try:
        def shown() -> str | None:
            text = subprocess.run([*tmux, "capture-pane", "-p", "-t", session], capture_output=True, text=True).stdout
            return text if DONE in text else None

        text = wait_until(shown, timeout=60, interval=0.2, message=f"`{' '.join(args)}` on the tmux screen")
    finally:
        subprocess.run([*tmux, "kill-server"], capture_output=True)
    lines = text.rstrip("\n").split("\n")
    assert all(len(line) <= width for line in lines), lines
    return lines


def test_verify_at_80_columns(known_state: KnownState) -> None:
    lines = screen_of(known_state, "verify")
    text = "\n".join(lines)
    assert lines[-1] == f"{DONE} 0", text
    assert "the 9 groups of queue" in text and "where" in text and "none lost" in text and "ok" in text
    assert "PASS: the 9 submitted groups" in text
    lines = screen_of(known_state, "verify", "--final")
    assert lines[-1] == f"{DONE} 1" and "FAIL: 1 problem(s)" in "\n".join(lines)


def test_dead_letters_at_80_columns(known_state: KnownState) -> None:
    st = known_state
    lines = screen_of(st, "dlq", "list")
    text = "\n".join(lines)
    assert lines[-1] == f"{DONE} 0", text
    assert "dead letter" in text and "source_id" in text and "died" in text  # a header
    assert st.dlq_id in text and "ago" in text and "max_attempts" in text
    assert "last" in text and "too long for the engine" in text  # the last attempt's reason, not only max_attempts
    lines = screen_of(st, "dlq", "show", st.dlq_id)
    text = "\n".join(lines)
    assert lines[-1] == f"{DONE} 0" and not text.lstrip().startswith("{"), text  # a table, not raw JSON
    assert "Z (" in text and "ago)" in text  # the time of death as a UTC date, and how long ago
    assert text.count("prompt too long for the engine") >= 2 and "dlq requeue" in text
    st.q.run(_purge(st))
    lines = screen_of(st, "dlq", "list")
    assert "no dead letters in queue" in "\n".join(lines) and lines[-1] == f"{DONE} 0"


def _purge(st: KnownState):  # type: ignore[no-untyped-def]
    from rollout_queue.ops import actions

    return actions.purge_all_dead_letters(st.q.keys)
