"""Static types: what a type checker says a sync and an asyncio caller get, and that it stays so.

The facade is written once (api/); its annotations are the sync surface and api/aio.pyi, generated
from them, the asyncio one (api/results.py says how). The ``_sync_caller`` / ``_async_caller``
functions below are never run: mypy reads them (``assert_type`` fails the check on any other type,
``reveal_type`` is read back), as a user's IDE would read their code.

CI runs only ``make test``, so the type check lives here: one mypy run (pyproject's [tool.mypy],
the version ``make setup`` pins) over the package, examples/ and this file. Errors older than the
check are counted per file in tests/unit/mypy_baseline.txt, which may only shrink: a file with more
errors than its line fails, and so does one with fewer, until its line is lowered (or removed).
"""

from __future__ import annotations

import ast
import importlib.util
import os
import re
import subprocess
import sys
from collections.abc import Awaitable
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, assert_type, reveal_type

import pytest

from rollout_queue import (AsyncFleetReserver, AsyncLease, AsyncRolloutQueue, AsyncWorker, FleetReserver, Lease,
                           Reservation, RolloutQueue, Worker)
from rollout_queue.core.errors import InvalidInput
from rollout_queue.devtools import async_stub

ROOT = Path(__file__).resolve().parents[2]
HERE = str(Path(__file__).relative_to(ROOT))
BASELINE = Path(__file__).with_name("mypy_baseline.txt")
#: what mypy checks: the package (api/aio.pyi standing for api/aio.py), the examples, this file
TARGETS = ("rollout_queue", "examples", HERE)


def _sync_caller(q: RolloutQueue, fleet: FleetReserver) -> None:
    w = q.worker("w")
    assert_type(w, Worker)
    assert_type(w.reserve(4), list[Reservation])
    assert_type(q.lease(2), Lease | None)
    assert_type(q.version, int)
    assert_type(fleet.reserve(1), list[tuple[str, Reservation]])
    assert_type(RolloutQueue.from_url("redis://h", "q"), RolloutQueue)
    if TYPE_CHECKING:
        reveal_type(w.reserve(4))  # read back by test_sync_and_async_callers_get_exact_types


async def _async_caller(url: str) -> None:
    q = await AsyncRolloutQueue.from_url(url, "q")
    assert_type(q, AsyncRolloutQueue)
    w = q.worker("w")
    assert_type(w, AsyncWorker)
    assert_type(w.reserve(4), Awaitable[list[Reservation]])
    assert_type(await w.reserve(4), list[Reservation])
    lease = await q.lease(2)
    assert_type(lease, AsyncLease | None)
    if lease is not None:
        async with lease:
            assert_type(await lease.commit(), str)
    assert_type(await q.version, int)
    fleet = AsyncFleetReserver({"q": w}, {"q": 1.0})
    assert_type(await fleet.reserve(1), list[tuple[str, Reservation]])
    if TYPE_CHECKING:
        reveal_type(w.reserve(4))  # read back by test_sync_and_async_callers_get_exact_types


@lru_cache(maxsize=1)
def mypy_output() -> str:
    """One mypy run over TARGETS (about a minute cold on two cores; seconds from .mypy_cache)."""
    if importlib.util.find_spec("mypy") is None:
        pytest.fail("mypy is not installed: run `make setup` (pyproject's dev extra pins it)")
    cmd = [sys.executable, "-m", "mypy", "--cache-dir", str(ROOT / ".mypy_cache"), "--no-color-output",
           "--no-error-summary", *TARGETS]
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=280,
                          env={**os.environ, "MYPY_FORCE_COLOR": "0"})
    # 0: clean, 1: errors (counted below); anything else is mypy itself failing.
    assert done.returncode in (0, 1), f"mypy failed to run ({done.returncode}):\n{done.stdout}{done.stderr}"
    return done.stdout


def errors_by_file(output: str) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for line in output.splitlines():
        match = re.match(r"([^:]+):\d+: error: ", line)
        if match:
            out.setdefault(match.group(1), []).append(line)
    return out


def read_baseline() -> dict[str, int]:
    """``path count`` lines (``#`` comments allowed): the errors each file had when the check began."""
    lines = [line.split("#")[0].split() for line in BASELINE.read_text().splitlines()]
    return {parts[0]: int(parts[1]) for parts in lines if parts}


def test_async_stub_is_generated_from_the_facade() -> None:
    """api/aio.pyi is what devtools/async_stub.py derives from api/*.py now (never hand-edited)."""
    assert async_stub.STUB.read_text() == async_stub.render(), (
        "api/aio.pyi is stale: run `python -m rollout_queue.devtools.async_stub` and commit the result")


def test_each_async_name_is_the_sync_class_at_run_time() -> None:
    """The stub types names that are the one implementation at run time (nothing written twice)."""
    assert (AsyncWorker, AsyncLease, AsyncFleetReserver) == (Worker, Lease, FleetReserver)
    assert issubclass(AsyncRolloutQueue, RolloutQueue) and AsyncRolloutQueue.asyncio
    assert not [n for n, v in vars(AsyncRolloutQueue).items() if callable(v)]


def test_sync_and_async_callers_get_exact_types() -> None:
    """assert_type holds for every call above, and reveal_type shows the value vs its awaitable."""
    mine = [line for line in mypy_output().splitlines() if line.startswith(HERE)]
    assert not [line for line in mine if ": error:" in line], "\n".join(mine)
    revealed = [m.group(1) for m in re.finditer(r'Revealed type is "(.*)"', "\n".join(mine))]
    assert revealed == ["list[rollout_queue.core.models.Reservation]",
                        "typing.Awaitable[list[rollout_queue.core.models.Reservation]]"], mine


def test_no_type_error_beyond_the_baseline() -> None:
    """mypy finds no error in a file beyond its baseline count, and the baseline is not stale."""
    found, baseline = errors_by_file(mypy_output()), read_baseline()
    more = {path: lines for path, lines in found.items() if len(lines) > baseline.get(path, 0)}
    assert not more, ("new type errors (fix them; tests/unit/mypy_baseline.txt may only shrink):\n"
                      + "\n".join(line for lines in more.values() for line in lines))
    fewer = {path: len(found.get(path, [])) for path, n in baseline.items() if len(found.get(path, [])) < n}
    assert not fewer, ("fewer type errors than tests/unit/mypy_baseline.txt allows, well done: lower these "
                       f"lines to (0: delete the line) {fewer}")


def test_the_stub_refuses_an_attribute_the_facade_does_not_declare() -> None:
    """A public ``self.x = ...`` with no class-level ``x: type`` would be missing from the stub."""
    src = "class Worker:\n    queue: int\n    def __init__(self) -> None:\n        self.queue, self.extra = 1, 2\n"
    node = ast.parse(src).body[0]
    assert isinstance(node, ast.ClassDef)
    with pytest.raises(InvalidInput, match="extra"):
        async_stub._class(src, node, {})
