"""What the push-round contract tests share: a live worker, a silent one, a round opened by hand,
and a transport that loses the first reply of one script (the script ran; the client never heard).

Owns these helpers only; each script's tests are in its own file (test_push_open.py, ...).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import redis

from rollout_queue.core import protocol as p
from rollout_queue.core.scripts import SCRIPTS
from rollout_queue.drivers.transport import Exchange
from tests.contract.worker_support import keys

ADDR = "127.0.0.1:29500"


def live(q: Any, *worker_ids: str) -> None:
    """Register each worker as live (a heartbeat now)."""
    for w in worker_ids:
        q.worker(w).heartbeat()


def silent(raw: redis.Redis, queue_name: str, worker_id: str) -> None:
    """Move the worker's last heartbeat far into the past: registered, but not live."""
    raw.zadd(keys(queue_name)["workers"], {worker_id: 1})


def open_round(q: Any, version: int = 1, join_s: float = 30.0, deadline_s: float = 60.0, **kw: Any) -> int:
    return q.open_push(version, f"/weights/v{version}", ADDR, "gloo", join_s, deadline_s, **kw)


def members(raw: redis.Redis, queue_name: str) -> dict[str, int]:
    return {k.decode(): int(v) for k, v in raw.hgetall(keys(queue_name)["push_members"]).items()}


def round_field(raw: redis.Redis, queue_name: str, field: str) -> str | None:
    value = raw.hget(keys(queue_name)["push"], field)
    return None if value is None else value.decode()


def lose_first_reply(q: Any, script: str, meanwhile: Callable[[], None] = lambda: None) -> list[Any]:
    """Make the next call of ``script`` through ``q`` run on the server, then lose its reply (a
    connection error in its place), as a connection cut after the server answered; ``meanwhile``
    runs in that gap (another client's calls), before the transport resends. Returns a list that
    holds the lost reply once it happened."""
    driver, sha, lost = q.driver, SCRIPTS[script].sha, []
    real = driver._do

    def ours(step: Any) -> bool:
        """The script's first exchange that ran it (not one refused NOSCRIPT before it was loaded)."""
        return isinstance(step, Exchange) and not lost and any(
            sha in (p.s(a) for a in command) for command in step.commands) and not any(
            isinstance(reply, Exception) for reply in step.out.replies)

    def lose(step: Any) -> None:
        lost.append(list(step.out.replies))
        step.out.replies.clear()  # what the client read is gone with the connection
        meanwhile()
        raise ConnectionError("the reply was lost")

    if driver.is_async:
        async def do_async(step: Any, held: list[Any]) -> Any:
            out = await real(step, held)
            if ours(step):
                lose(step)
            return out
        driver._do = do_async
    else:
        def do(step: Any, held: list[Any]) -> Any:
            out = real(step, held)
            if ours(step):
                lose(step)
            return out
        driver._do = do
    return lost
