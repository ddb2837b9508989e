"""The worker runtime's life-cycle states and the only transitions between them (sans-IO).

Why a module of its own: the runtime has several loops (reserve, weight updates, reconciliation,
one task per attempt) that can each decide the worker must stop. Whether that decision is still
allowed, and what it means, is written once here as a table, as h11's ``_state.py`` does, so a
reader finds every path from start to exit in one place and a wrong path raises instead of
quietly doing something half-way.

Rules:
1. No I/O, no asyncio, no clock. The runtime asks ``Lifecycle.advance(state)``; what a state
   means for its loops (stop reserving, interrupt a drain) is the runtime's business.
2. Every change of state goes through ``advance``, which raises ``IllegalTransition`` for a pair
   that is not in ``TRANSITIONS``. There are no other setters.
3. ``STOPPED`` and ``FAILED`` are terminal: ``run()`` has returned or raised.

An admission hold and a weight update are not states of the worker: a hold only makes ``reserve``
grant nothing (the queue's scripts decide it), and weights may load while the worker runs or
drains, so they are tracked beside the life cycle (``versions.py``), never in it.
"""

from __future__ import annotations

import enum
from rollout_queue.core.errors import IllegalTransition


class RuntimeState(enum.Enum):
    STARTING = "starting"  # engine starting, queue opening, initial weights: nothing reserved yet
    RUNNING = "running"  # reserving and executing
    DRAINING = "draining"  # drain requested: nothing more is reserved, attempts finish until the deadline
    FAILING = "failing"  # fatal error: nothing more is reserved, attempts that need the engine are cancelled
    CLOSING = "closing"  # loops cancelled, heartbeat stopped, close() returns whatever is still owned
    STOPPED = "stopped"  # run() returned: drained and closed
    FAILED = "failed"  # run() raised: WorkerFailed, or the error that kept the engine or queue from opening

    @property
    def is_stopping(self) -> bool:
        """True once the worker must reserve nothing more (every state after RUNNING)."""
        return self not in (RuntimeState.STARTING, RuntimeState.RUNNING)

    @property
    def is_terminal(self) -> bool:
        return not TRANSITIONS[self]


S = RuntimeState
#: state -> the states it may go to. CLOSING is reachable from every live state because the
#: runtime always closes, however it leaves (drain, fatal error, or its run() task cancelled).
#: STARTING -> FAILED and DRAINING -> FAILED are the exits with nothing to close: the engine or
#: the queue never opened (a drain may be requested before run() has opened them).
TRANSITIONS: dict[RuntimeState, frozenset[RuntimeState]] = {
    S.STARTING: frozenset({S.RUNNING, S.DRAINING, S.FAILING, S.CLOSING, S.FAILED}),
    S.RUNNING: frozenset({S.DRAINING, S.FAILING, S.CLOSING}),
    S.DRAINING: frozenset({S.FAILING, S.CLOSING, S.FAILED}),
    S.FAILING: frozenset({S.CLOSING}),
    S.CLOSING: frozenset({S.STOPPED, S.FAILED}),
    S.STOPPED: frozenset(),
    S.FAILED: frozenset(),
}


class Lifecycle:
    """The current state, changed only by ``advance``."""

    def __init__(self) -> None:
        self._state = RuntimeState.STARTING

    @property
    def state(self) -> RuntimeState:
        return self._state

    def advance(self, to: RuntimeState) -> RuntimeState:
        """Move to ``to`` and return the state left. Raises IllegalTransition (nothing changes)."""
        if to not in TRANSITIONS[self._state]:
            allowed = ", ".join(sorted(s.value for s in TRANSITIONS[self._state])) or "none: it is terminal"
            raise IllegalTransition(self._state, to, allowed)
        previous, self._state = self._state, to
        return previous
