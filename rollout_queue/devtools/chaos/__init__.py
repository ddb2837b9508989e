"""A Jepsen-style chaos harness for rollout-queue: record every operation, inject faults, check the history.

This package owns the harness around the queue, never the queue itself: it starts a private Redis
(``LocalServer``), runs a producer, test-engine workers, a trainer and reapers as separate processes,
injects faults (SIGKILL, SIGSTOP/SIGCONT, Redis kill -9 and restart on the same AOF, CLIENT KILL),
and checks the operation logs against what Redis holds at the end. It only uses the public API of
``rollout_queue`` to drive the queue; the checker reads Redis raw and never changes a key.

Modules: ``oplog`` (one JSONL log per process), ``roles`` (producer, worker, trainer entry points),
``supervisor`` (processes and restarts), ``nemesis`` (faults), ``harness`` (one run), ``checker``
(the history check), ``truth`` (a raw read of the queue's keys).
"""
