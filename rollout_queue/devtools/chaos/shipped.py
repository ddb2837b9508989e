"""The shipped worker in a chaos run: ``rollout_queue.workers.cli.main`` with its events in the op log.

The process runs the shipped worker's own entry point (what ``python -m rollout_queue.workers`` and
``rollout-queue worker`` run: its parser, signal handling, drain, exit deadline and exit codes), with
the scripted engine and the chaos environment and reward (envs.py). The one addition is a logging
handler on the runtime's logger: the worker reports every fact as a typed event (workers/events.py)
and logs it once, with the event's type and fields in the record, so this handler turns each into
an op-log line the checker and the progress watchdog read (``reserve_ok``, ``complete_ok``,
``fail_ok``, ``weights_applied``, ...), as the reaper role copies the reaper loop's records. Nothing
else is hooked: the worker cannot tell it runs under chaos.

Records carry ``shipped: True``. Their times are when the worker learned the outcome, never when it
sent the call (the runtime emits no event before a settlement), so the checker does not hold them to
the "sent before a later attempt was reserved" rule it holds the test-engine workers' invokes to.
"""

from __future__ import annotations

import argparse
import logging
import os
import secrets
from typing import Any, Callable, Sequence

from rollout_queue.devtools.chaos.oplog import OpLog

#: The runtime's logger: every event goes through it (workers/events.py, log_event).
EVENTS_LOGGER = "rollout_queue.workers.runtime"
#: The scripted engine's words for a settlement verdict (Settled's message) -> op of the record.
_SETTLED = {"completed": "complete_ok", "failed": "fail_ok", "aborted": "abort_ok", "filtered": "filter_ok"}


def _grant(f: dict[str, Any]) -> dict[str, Any]:
    # [entry, attempt, source id (unknown to the event: the checker maps it), n], like the test-engine workers'.
    return {"grants": [[f.get("entry"), f.get("attempt"), None, f.get("n")]], "version": f.get("version")}


def _receipt(f: dict[str, Any]) -> dict[str, Any]:
    return {"eid": f.get("entry"), "attempt": f.get("attempt"), "reason": f.get("reason"),
            "outcome": f.get("outcome")}


#: event type -> (op, the record's fields from the event's log fields).
EVENT_OPS: dict[str, tuple[str, Callable[[dict[str, Any]], dict[str, Any]]]] = {
    "WorkerStarted": ("start", lambda f: {"version": f.get("version")}),
    "Reserved": ("reserve_ok", _grant),
    "StaleSettlement": ("complete_refused", lambda f: {"eid": f.get("entry"), "attempt": f.get("attempt"),
                                                       "error": "StaleReceipt", "detail": f.get("detail")}),
    "CompletionRefused": ("malformed", lambda f: {"eid": f.get("entry"), "attempt": f.get("attempt"),
                                                  "detail": f.get("detail")}),
    "WeightsUpdated": ("weights_applied", lambda f: {"version": f.get("version"), "uri": f.get("weights_uri"),
                                                     "mode": f.get("mode")}),
    "AdoptedWithoutWeights": ("weights_applied", lambda f: {"version": f.get("version"), "uri": None}),
    "WeightsRefused": ("weights_refused", lambda f: {"version": f.get("version"), "uri": f.get("weights_uri"),
                                                     "loaded": f.get("loaded"), "reason": f.get("reason")}),
    "WeightsPushed": ("push_received", lambda f: {"version": f.get("version"), "epoch": f.get("epoch"),
                                                  "rank": f.get("rank"), "seconds": f.get("seconds")}),
    "PushMissed": ("push_missed", lambda f: {"version": f.get("version"), "epoch": f.get("epoch"),
                                             "reason": f.get("reason")}),
    "FatalError": ("fatal", lambda f: {}),
    "CloseFailed": ("close_failed", lambda f: {}),
    "WorkerClosed": ("close_ok", lambda f: {"requeued": f.get("requeued"), "dead": f.get("dead")}),
    "DrainRequested": ("drain", lambda f: {}),
}


class EventsToOpLog(logging.Handler):
    """Writes each worker event the runtime logs as one op-log record (EVENT_OPS; others are skipped)."""

    def __init__(self, log: OpLog) -> None:
        super().__init__(logging.DEBUG)
        self.oplog = log

    def emit(self, record: logging.LogRecord) -> None:
        f = getattr(record, "fields", {})
        event = f.get("event")
        if event == "Settled":
            op = _SETTLED.get(record.getMessage())
            if op is not None:
                self.oplog.write(op, **_receipt(f))
            return
        mapped = EVENT_OPS.get(str(event))
        if mapped is None:
            return
        op, build = mapped
        extra = build(f)
        if record.exc_info and record.exc_info[1] is not None:
            extra["error"] = repr(record.exc_info[1])[:500]
        self.oplog.write(op, **extra)


def worker_id(index: int) -> str:
    """``chaos-t<index>:<pid>:<nonce>``: one id per process, so a worker id names one process's life."""
    return f"chaos-t{index}:{os.getpid()}:{secrets.token_hex(2)}"


def run_shipped(args: argparse.Namespace, worker_argv: Sequence[str]) -> int:
    """Run the shipped worker with ``worker_argv`` (its own options) under this process's op log."""
    from rollout_queue.workers.cli import main

    wid = worker_id(args.index)
    log = OpLog(args.log, "traj", worker=wid, shipped=True)
    logger = logging.getLogger(EVENTS_LOGGER)
    logger.addHandler(EventsToOpLog(log))
    logger.setLevel(logging.DEBUG)  # Reserved and Settled(completed) are debug events
    log.write("spawned", argv=list(worker_argv))
    code = main(["--url", args.url, "--queue", args.queue, "--worker-id", wid, *worker_argv])
    log.write("exit", code=code)
    return code
