"""A lifecycle walk-through on one machine: producer, two workers, a reaper and a trainer as threads
on a private Redis, with one worker "crashing" mid-run, then a ledger check against Redis.

The workers use a deterministic stand-in for generation (the *test engine*: token ids derived from
the prompt, reward from a hash), because this walk-through shows the queue, not a model. It exits
non-zero if any group was lost or trained twice. The full RL demo (real generation, GRPO) builds on
the worker runtime in ``workers/``.
"""

from __future__ import annotations

import hashlib
import threading
import time
from collections import Counter
from dataclasses import dataclass, field

from rollout_queue.api.queue import RolloutQueue
from rollout_queue.api.worker import Worker
from rollout_queue.core.config import QueueConfig
from rollout_queue.core.errors import StaleReceipt
from rollout_queue.devtools.local_server import LocalServer
from rollout_queue.core.models import Reservation, Sample, SourceGroup
from rollout_queue.ops.reaper import run_reaper


def test_engine_generate(r: Reservation, slot: int) -> Sample:
    """Deterministic 'generation': 8 token ids and a reward from a hash of (prompt, slot)."""
    digest = hashlib.sha256(f"{r.group.prompt}|{slot}|{r.receipt.attempt}".encode()).digest()
    tokens = tuple(b % 200 for b in digest[:8])
    return Sample(slot, tokens, tuple(-0.5 for _ in tokens), reward=digest[8] / 255, version=r.version)


@dataclass
class Tally:
    generated: int = 0
    trained: list[str] = field(default_factory=list)
    max_staleness: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)


def _work(worker: Worker, stop: threading.Event, tally: Tally, crash_after: int | None) -> None:
    done = 0
    while not stop.is_set():
        for r in worker.reserve(max_groups=2, block_ms=200):
            if crash_after is not None and done >= crash_after:
                return  # simulated crash: stop heartbeating and drop the reservations we hold
            try:
                worker.complete(r.receipt, [test_engine_generate(r, i) for i in range(r.group.n)])
            except StaleReceipt:
                continue  # the reaper gave this attempt away while we were slow: drop it
            done += 1
            with tally.lock:
                tally.generated += 1


def _train(q: RolloutQueue, total: int, batch: int, stop: threading.Event, tally: Tally) -> None:
    step = 0
    while len(tally.trained) < total and not stop.is_set():
        lease = q.lease(batch, block_ms=500, partial=total - len(tally.trained) < batch)
        if lease is None:
            continue
        with lease:  # commit on normal exit, rollback on an exception
            step += 1
            tally.max_staleness = max(tally.max_staleness, lease.staleness[0])
            tally.trained.extend(g.group.source_id for g in lease.groups)
        with q.hold(timeout_s=30) as hold:  # the weight-update boundary
            hold.wait_terminal(timeout_s=5)
            hold.record_weight_update(step, f"file:///tmp/weights/step-{step}")


def run_walkthrough(url: str | None = None, groups: int = 24, kill_worker: bool = True) -> bool:
    """Run the walk-through; True when the ledger check passes."""
    from rich.console import Console
    from rich.table import Table

    console = Console()
    server = None if url else LocalServer().start()
    try:
        cfg = QueueConfig(max_staleness=2, worker_timeout_s=1.0, lease_timeout_s=30, max_completed_groups=16)
        name = f"walkthrough-{int(time.time())}"
        q = RolloutQueue.from_url(url or server.url, name, cfg)  # type: ignore[union-attr]
        console.print(f"[bold]queue[/] {name} on {url or server.url}")  # type: ignore[union-attr]
        q.submit([SourceGroup(f"prompt-{i}", f"what is {i} + {i}?", n=4) for i in range(groups)])
        stop, tally = threading.Event(), Tally()
        threads = [
            threading.Thread(target=_work, args=(q.worker("host-a:gpu0"), stop, tally, 3 if kill_worker else None)),
            threading.Thread(target=_work, args=(q.worker("host-b:gpu0"), stop, tally, None)),
            threading.Thread(target=run_reaper, args=(q, 0.25, stop)),
        ]
        for t in threads:
            t.start()
        _train(q, groups, 4, threading.Event(), tally)
        stop.set()
        for t in threads:
            t.join()
        st = q.stats()
        counts = Counter(tally.trained)
        twice = [s for s, c in counts.items() if c > 1]
        lost = groups - len(counts) - st.dead
        ok = not twice and lost == 0 and st.retained == 0 and st.committed == groups
        table = Table(title="walk-through summary")
        table.add_column("figure")
        table.add_column("value", justify="right")
        for label, value in [("groups submitted", groups), ("completions generated", tally.generated),
                             ("groups trained (committed)", st.committed), ("trained twice", len(twice)),
                             ("lost", lost), ("dead-lettered", st.dead), ("attempts lost (crash)", st.terminals["lost"]),
                             ("max staleness in a lease (bound 2)", tally.max_staleness),
                             ("policy version", st.version), ("ledger check", "PASS" if ok else "FAIL")]:
            table.add_row(label, str(value))
        console.print(table)
        return ok
    finally:
        if server is not None:
            server.cleanup()
