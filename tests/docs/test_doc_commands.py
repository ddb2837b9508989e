"""The command blocks of the user-facing pages run, as a new user would paste them (issue 32, item 2).

Every ```bash (or sh) block of README.md, docs/USAGE.md, OPERATIONS.md, DEMO.md, DEPLOYMENT.md,
TRAJECTORIES.md, WEIGHTS.md, SCALING.md and docs/integrations/*.md runs in bash (``set -e -o
pipefail``) against a private server, in a scratch folder that holds a tiny ``data/math.jsonl``:
every ``redis://`` URL a block writes is replaced by the private server's, ``redis-cli`` talks to it,
REDIS_URL and ROLLOUT_QUEUE name it and the queue ``demo`` (OPERATIONS.md's), which holds one entry
in every state (tests/ops/conftest.py's known state; OPERATIONS.md's example entry ID stands for
the one executing on a silent worker). A block that cannot run here says why on the line before it,
``<!-- not run: REASON -->`` (a GPU host, docker, a run of minutes another test makes), and is
reported as skipped with that reason. Developer pages (CHAOS, PERFORMANCE, DESIGN) are left out:
their blocks are long harness runs.

Also here: every ``docs/<page>.md`` path that code, docs or scripts name exists (the TRL page had moved
under docs/integrations/ while two files still named its old path).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from rollout_queue.devtools.local_server import LocalServer
from tests.ops.conftest import KnownState, build_known_state

REPO = Path(__file__).resolve().parents[2]
PAGES = [REPO / "README.md", *(REPO / "docs" / n for n in ("USAGE.md", "OPERATIONS.md", "DEMO.md", "DEPLOYMENT.md",
                                                          "TRAJECTORIES.md", "WEIGHTS.md", "SCALING.md")),
         *sorted((REPO / "docs" / "integrations").glob("*.md"))]
BLOCK = re.compile(r"(?:^<!-- not run: (?P<reason>[^\n]*?) -->\n)?^```(?:bash|sh|shell)(?:[ \t][^\n]*)?\n(?P<code>.*?)^```[ \t]*$",
                   re.S | re.M)
URL = re.compile(r"rediss?://[^\s'\"]+")
#: OPERATIONS.md's example entry ID, in its first block.
EXAMPLE_ENTRY = "1717171717171-0"
QUEUE = "demo"


def blocks() -> list[tuple[str, str, str | None]]:
    """(page:line, code, the reason it is not run or None) of every shell block of the pages."""
    out = []
    for page in PAGES:
        text = page.read_text()
        for m in BLOCK.finditer(text):
            line = text.count("\n", 0, m.start("code"))
            out.append((f"{page.relative_to(REPO).as_posix()}:{line}", m.group("code"), m.group("reason")))
    return out


BLOCKS = blocks()


@pytest.fixture(scope="module")
def demo_queue() -> Iterator[tuple[LocalServer, KnownState, Path]]:
    """A private server with the known state under the queue name ``demo``, and a scratch folder."""
    with LocalServer() as server, tempfile.TemporaryDirectory() as scratch:
        state = build_known_state(server.url, QUEUE)
        (Path(scratch) / "data").mkdir()
        (Path(scratch) / "data" / "math.jsonl").write_text(
            "".join(f'{{"question": "What is {i} + {i}?", "answer": "{2 * i}"}}\n' for i in range(3)))
        (Path(scratch) / ".venv").symlink_to(REPO / ".venv")
        yield server, state, Path(scratch)
        state.close()


def test_the_blocks_are_found() -> None:
    """Not vacuous: the pages' blocks are read, each skipped one with a reason."""
    where = {w.split(":")[0] for w, _, _ in BLOCKS}
    assert {"README.md", "docs/USAGE.md", "docs/OPERATIONS.md", "docs/integrations/trl.md"} <= where, where
    assert sum(1 for *_, reason in BLOCKS if reason is None) >= 20
    assert all(reason.strip() for *_, reason in BLOCKS if reason is not None)


@pytest.mark.parametrize("where,code,reason", BLOCKS, ids=[w for w, _, _ in BLOCKS])
def test_the_block_runs(where: str, code: str, reason: str | None,
                        demo_queue: tuple[LocalServer, KnownState, Path]) -> None:
    if reason is not None:
        pytest.skip(f"{where} is marked not run: {reason}")
    server, state, scratch = demo_queue
    state.refresh()
    entry = state.ids[6]  # executing on host-b, silent: the entry OPERATIONS.md's recipes ask about
    script = URL.sub(server.url, code).replace(EXAMPLE_ENTRY, entry)
    # OPERATIONS.md's first block sets Q and E for the recipes after it (each block runs alone here).
    prelude = ('redis-cli() { command redis-cli -u "$RQ_TEST_URL" "$@"; }\n'
               f"Q='rollout:{{{QUEUE}}}' E={entry}\nset -e -o pipefail\n")
    env = {**os.environ, "RQ_TEST_URL": server.url, "REDIS_URL": server.url, "ROLLOUT_QUEUE": QUEUE,
           "PYTHONPATH": str(REPO), "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    done = subprocess.run(["bash", "-c", prelude + script], cwd=scratch, env=env, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, f"{where} exited {done.returncode}:\n{script}\n-- stdout\n{done.stdout}\n" \
                                 f"-- stderr\n{done.stderr}"


def test_every_docs_path_named_anywhere_exists() -> None:
    """A ``docs/<page>.md`` named in the package, the examples, the scripts, the tests or the docs is a file."""
    named = re.compile(r"\bdocs/[\w./-]+?\.md\b")
    missing = []
    for path in [*REPO.glob("*.md"), REPO / "Makefile", *(REPO / p for p in ("docs", "rollout_queue", "examples",
                                                                               "scripts", "tests", "deploy"))]:
        files = [path] if path.is_file() else [p for p in path.rglob("*") if p.is_file()
                                               and p.suffix in (".py", ".md", ".sh", ".toml", ".yml", ".lua", "")]
        for f in files:
            for m in named.finditer(f.read_text(errors="replace")):
                if not (REPO / m.group(0)).exists():
                    missing.append(f"{f.relative_to(REPO)}: {m.group(0)}")
    assert not missing, "\n".join(missing)
