"""What the PEL gives one worker: the read-only view a worker reconciles its own attempts against.

The flow ``owned_attempts`` reads ``OwnedAttempt`` records (models.py): the extended form of
``XPENDING`` filtered to one consumer name, in pages (its reply is parsed by protocol.parse_owned,
re-exported here). Why a worker needs it: the PEL is the truth of ownership (DESIGN: "the PEL owner is
the consumer name in XPENDING"). After a server restart that lost an acknowledged settlement
(AOF ``everysec``), or a reserve reply that was lost and never resent with its request id, the PEL
gives the worker an attempt the worker no longer knows about; it heartbeats on, so the reaper never
frees it. Comparing this view with what the worker holds finds those attempts (workers/reconcile.py).

Rules: it never changes a key (only plain XPENDING, safe to resend), so it needs nothing beyond what
the worker's scripts already read (XPENDING on the src stream, acl.py); it decides nothing: what to
do with an attempt the worker does not hold is the caller's choice, and the only safe one is a
receipt-checked script (``abort``), which refuses if the PEL moved in between.
"""

from __future__ import annotations

from rollout_queue.core import protocol as p
from rollout_queue.core.checks import check_int
from rollout_queue.core.flows.base import Flow
from rollout_queue.core.keys import QueueKeys
from rollout_queue.core.models import OwnedAttempt, check_worker_id
from rollout_queue.core.protocol import parse_owned

__all__ = ["OWNED_LIMIT", "PAGE", "OwnedAttempt", "owned_attempts", "owned_command", "parse_owned"]

#: PEL entries read per XPENDING call: one call is O(page) on the server.
PAGE = 1000
#: Most entries one view reads: a worker holds at most its engine's concurrency in groups, so a
#: longer list is already a sign of trouble and the rest can wait for the next reconciliation.
OWNED_LIMIT = 10_000


def owned_command(keys: QueueKeys, worker_id: str, start: str, count: int, min_idle_ms: int = 0) -> p.Command:
    """``XPENDING <src> rollout [IDLE <ms>] <start> + <count> <worker_id>``: one page of the entries
    the PEL gives ``worker_id``, oldest entry ID first (IDLE needs Redis >= 6.2 / any Valkey)."""
    idle: tuple[p.Arg, ...] = ("IDLE", min_idle_ms) if min_idle_ms > 0 else ()
    return p.Command(("XPENDING", keys["src"], "rollout", *idle, start, "+", count, worker_id))


def owned_attempts(keys: QueueKeys, worker_id: str, min_idle_ms: int = 0,
                   limit: int = OWNED_LIMIT) -> Flow[list[OwnedAttempt]]:
    """Every attempt the PEL gives ``worker_id`` now (at most ``limit``, oldest entry first), or only
    those delivered at least ``min_idle_ms`` ago. Pages are separate reads: a transition landing
    between two pages shows on one side of it; read again for a fresh view."""
    check_worker_id(worker_id)
    min_idle_ms, limit = check_int(min_idle_ms, "min_idle_ms"), check_int(limit, "limit", 1)
    out: list[OwnedAttempt] = []
    start = "-"
    while len(out) < limit:
        want = min(PAGE, limit - len(out))
        page = parse_owned((yield owned_command(keys, worker_id, start, want, min_idle_ms)), worker_id)
        out.extend(page)
        if len(page) < want:
            break
        start = "(" + page[-1].entry_id  # exclusive start (Redis >= 6.2): the next page
    return out
