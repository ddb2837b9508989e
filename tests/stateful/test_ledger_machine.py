"""Runs the ledger machine (ledger_machine.py) against each server kind, on a private server per
test function: kill -9 and restart are part of the steps. The long variant is the slow suite's.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from hypothesis import HealthCheck, settings
from hypothesis.stateful import run_state_machine_as_test

from rollout_queue.devtools.local_server import LocalServer
from tests.stateful.ledger_machine import LedgerMachine

# About 60-90 s per server kind on a 2-core machine (kill -9 restarts, outages past a lease's
# timeout and each example's final liveness drain included); the slow suite's run takes about 10
# minutes each.
# No example database: every run explores afresh, and a failure prints its shrunk program (with
# labelled draws) rather than relying on a replay file the next machine does not have.
FAST = settings(max_examples=80, stateful_step_count=50, deadline=None, database=None,
                suppress_health_check=list(HealthCheck))
LONG = settings(FAST, max_examples=500, stateful_step_count=60)


def bind(server: LocalServer, ranks: bool = False) -> type[LedgerMachine]:
    return type("LedgerMachineOnServer", (LedgerMachine,), {"server": server, "ranks": ranks})


@pytest.fixture(scope="module")
def world_of_one() -> Iterator[bool]:
    """torch.distributed in this process as a gloo world of one rank, so the machine drives
    RankedStream (the trainer contract across ranks) too; False where torch is not installed."""
    try:
        import torch.distributed  # noqa: F401
    except ImportError:
        yield False
        return
    from tests.integrations.helpers import world_of_one as gloo_world

    with gloo_world():
        yield True


@pytest.mark.timeout(900)  # a failure is shrunk for up to 300 s (hypothesis' cap) before it is shown
def test_ledger_machine(fresh_server: LocalServer, world_of_one: bool) -> None:
    run_state_machine_as_test(bind(fresh_server, world_of_one), settings=FAST)


@pytest.mark.slow
@pytest.mark.timeout(3600)
def test_ledger_machine_long(fresh_server: LocalServer, world_of_one: bool, request: pytest.FixtureRequest) -> None:
    if "slow" not in (request.config.getoption("-m") or ""):
        pytest.skip("the long machine run belongs to the slow suite: pytest -m slow")
    run_state_machine_as_test(bind(fresh_server, world_of_one), settings=LONG)
