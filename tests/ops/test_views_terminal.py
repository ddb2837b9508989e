"""`verify`, `dlq list` and `dlq show` read well in a real 80-column terminal (tmux, its screen read
back with capture-pane, as test_top_terminal.py does for `top`): a header, human-readable times,
the last attempt's reason, nothing wider than the terminal; and an empty DLQ says so."""

from __future__ import annotations

import shutil

import pytest

from tests.ops import terminal
from tests.ops.conftest import KnownState
from tests.ops.terminal import DONE

pytestmark = pytest.mark.skipif(shutil.which("tmux") is None, reason="no tmux here")


def screen_of(st: KnownState, *args: str, width: int = 80, height: int = 60) -> list[str]:
    return terminal.screen_of(st.url, st.queue, *args, width=width, height=height)


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
