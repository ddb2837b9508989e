"""`rollout-queue top` fits the terminal it runs in, urgent rows first: checked in a real 80x24
terminal (tmux, its screen read back with capture-pane) against a queue with more workers than rows."""

from __future__ import annotations

import shlex
import shutil
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from rollout_queue.cli import status, top
from rollout_queue.ops import views
from tests.helpers import wait_until
from tests.ops.conftest import SILENT, TRAINER, KnownState

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def crowded(known_state: KnownState) -> Iterator[KnownState]:
    """The known state, plus 40 live workers (more rows than 24 lines hold) and a trainer's hold."""
    for i in range(40):
        known_state.q.worker(f"host-{i:02d}:gpu0").heartbeat()
    known_state.q.hold(timeout_s=120, holder=TRAINER, reason="weight update v4")
    yield known_state


def test_the_frame_fits_any_terminal_with_the_urgent_rows_in_it(crowded: KnownState) -> None:
    snap = crowded.q.run(views.snapshot(crowded.q.layout.keys[0]))
    rates = status.rates(None, (0.0, {}))
    for width, height in ((80, 24), (120, 60), (40, 12), (200, 15)):
        lines = top.top_lines(snap, rates, [], crowded.queue, width, height)
        assert len(lines) <= height and all(len(line) <= width for line in lines), (width, height)
        text = "\n".join(lines)
        assert f"worker {SILENT}"[:width] in text and "admission HELD by" in text, (width, height)
        if height >= 24:  # CONFIG leaves batch_groups unset; a small frame keeps its rows for workers
            assert "no admission control" in text, (width, height)
    lines = top.top_lines(snap, rates, [], crowded.queue, 80, 24)
    assert any(line.startswith(f"  {SILENT}") for line in lines)  # silent first among the workers
    assert any(crowded.lease_id in line for line in lines) and any("more" in line for line in lines)


@pytest.mark.skipif(shutil.which("tmux") is None, reason="no tmux here")
def test_top_in_an_80x24_terminal_shows_what_is_urgent(crowded: KnownState) -> None:
    session = f"rq-top-{uuid.uuid4().hex[:8]}"
    command = " ".join(shlex.quote(a) for a in (
        "env", f"PYTHONPATH={ROOT}", sys.executable, "-m", "rollout_queue", "--url", crowded.url,
        "--queue", crowded.queue, "top", "--interval", "0.3"))
    subprocess.run(["tmux", "new-session", "-d", "-s", session, "-x", "80", "-y", "24", command], check=True)
    try:
        def screen() -> str | None:
            crowded.refresh()
            shown = subprocess.run(["tmux", "capture-pane", "-p", "-t", session], capture_output=True,
                                   text=True).stdout
            return shown if "Ctrl-C quits" in shown and "leases:" in shown else None

        shown = wait_until(screen, timeout=30, interval=0.2, message="top's frame on the tmux screen")
        lines = shown.rstrip("\n").split("\n")
        assert len(lines) <= 24 and all(len(line) <= 80 for line in lines)
        assert f"! worker {SILENT} SILENT" in shown and f"! admission HELD by {TRAINER}" in shown
        assert crowded.lease_id in shown and "dead letter" in shown and "more" in shown
        assert "no admission control: generation may run ahead of training" in shown
    finally:
        subprocess.run(["tmux", "kill-session", "-t", session], capture_output=True)
