"""Running a ``rollout-queue`` command in a real terminal of a given size (tmux, its screen and
scrollback read back with capture-pane): what an operator sees, not what a fake console width says."""

from __future__ import annotations

import shlex
import subprocess
import sys
import uuid
from pathlib import Path

from tests.helpers import wait_until

ROOT = Path(__file__).resolve().parents[2]
DONE = "__rq_done__"


def screen_of(url: str, queue: str, *args: str, width: int = 80, height: int = 60) -> list[str]:
    """Every line ``rollout-queue ARGS`` printed on a ``width`` x ``height`` terminal, the lines that
    scrolled off the top included, with its exit code on the last line (``__rq_done__ <code>``).
    Asserts that no line is wider than the terminal."""
    session = f"rq-view-{uuid.uuid4().hex[:8]}"
    command = " ".join(shlex.quote(a) for a in (
        "env", f"PYTHONPATH={ROOT}", sys.executable, "-m", "rollout_queue", "--url", url, "--queue", queue, *args))
    shell = f"{command}; echo {DONE} $?; sleep 120"
    tmux = ["tmux", "-L", session]  # a tmux server of its own: no race with another session's ending
    subprocess.run([*tmux, "new-session", "-d", "-s", session, "-x", str(width), "-y", str(height), shell], check=True)
    try:
        def shown() -> str | None:
            text = subprocess.run([*tmux, "capture-pane", "-p", "-S", "-", "-t", session], capture_output=True,
                                  text=True).stdout
            return text if DONE in text else None

        text = wait_until(shown, timeout=60, interval=0.2, message=f"`{' '.join(args)}` on the tmux screen")
    finally:
        subprocess.run([*tmux, "kill-server"], capture_output=True)
    lines = text.rstrip("\n").split("\n")
    assert all(len(line) <= width for line in lines), lines
    return lines
