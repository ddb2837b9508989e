"""Runs the push-round machine (push_machine.py) against each server kind, on the session's server
(the machine kills nothing; each example has a queue of its own). About 10 s per server kind on a
2-core machine; the slow suite's long run explores ten times as many programs.
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, settings
from hypothesis.stateful import run_state_machine_as_test

from rollout_queue.devtools.local_server import LocalServer
from tests.stateful.push_machine import PushMachine

# No example database: every run explores afresh, and a failure prints its shrunk program.
FAST = settings(max_examples=60, stateful_step_count=40, deadline=None, database=None,
                suppress_health_check=list(HealthCheck))
LONG = settings(FAST, max_examples=600)


@pytest.mark.timeout(3600)  # a failure is shrunk for up to 300 s (hypothesis' cap) before it is shown
@pytest.mark.parametrize("long", [False, pytest.param(True, marks=pytest.mark.slow)], ids=["fast", "long"])
def test_push_machine(server: LocalServer, long: bool, request: pytest.FixtureRequest) -> None:
    if long and "slow" not in (request.config.getoption("-m") or ""):
        pytest.skip("the long machine run belongs to the slow suite: pytest -m slow")
    machine = type("PushMachineOnServer", (PushMachine,), {"server": server})
    run_state_machine_as_test(machine, settings=LONG if long else FAST)
