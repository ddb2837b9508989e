"""Running calls against Redis: EVALSHA with NOSCRIPT recovery, retries across lost connections.

Owns the one thing both clients must get right the same way: what to do when the connection drops.
Every transition is idempotent by design (replayed by receipt, lease id, request id or source_id), so
a ``Call`` marked idempotent is sent again until ``retry_window_s`` runs out; then, or at once for a
non-idempotent call, OutcomeUnknown is raised, never a guess. A Redis restart therefore shows up to
users as a pause, not an error. It knows nothing about queue semantics.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import Any, Awaitable, Callable

import redis
import redis.asyncio
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import NoScriptError, ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError

from .errors import OutcomeUnknown, ScriptError
from .protocol import Call, Command, Op

TRANSIENT = (RedisConnectionError, RedisTimeoutError, ConnectionError, OSError)


@dataclass(frozen=True)
class RetryPolicy:
    """How long to keep resending an idempotent call while Redis is unreachable."""

    window_s: float = 30.0
    first_backoff_s: float = 0.05
    max_backoff_s: float = 1.0

    def backoff(self, tries: int) -> float:
        return min(self.max_backoff_s, self.first_backoff_s * 2 ** max(0, tries - 1))


def _script_error(exc: ResponseError, op: Op) -> Exception:
    text = str(exc)
    if "ROLLOUTQ" in text:
        return ScriptError(f"{_name(op)}: {text[text.index('ROLLOUTQ'):]}")
    return ScriptError(f"{_name(op)}: Redis refused the call: {text}")


def _name(op: Op) -> str:
    return op.script.name if isinstance(op, Call) else str(op.args[0])


def _unknown(op: Op, exc: BaseException, elapsed: float) -> OutcomeUnknown:
    return OutcomeUnknown(
        f"{_name(op)}: connection to Redis failed ({exc!r}) and the call "
        + ("could not be retried within %.1fs" % elapsed if op.idempotent else "is not safe to retry")
        + "; it may or may not have run. Check the queue's state (rollout-queue stats) before acting again."
    )


class SyncTransport:
    """Runs ops on a redis-py client."""

    def __init__(self, client: redis.Redis, retry: RetryPolicy | None = None,
                 sleep: Callable[[float], None] = time.sleep, clock: Callable[[], float] = time.monotonic) -> None:
        self.client, self.retry, self.sleep, self.clock = client, retry or RetryPolicy(), sleep, clock

    def execute(self, op: Op) -> Any:
        start, tries = self.clock(), 0
        while True:
            try:
                return self._once(op)
            except TRANSIENT as exc:
                tries += 1
                if not op.idempotent or self.clock() - start >= self.retry.window_s:
                    raise _unknown(op, exc, self.clock() - start) from exc
                self.sleep(self.retry.backoff(tries))

    def _once(self, op: Op) -> Any:
        if isinstance(op, Command):
            return self._raw(op)
        try:
            return self.client.evalsha(op.script.sha, len(op.keys), *op.keys, *op.args)
        except NoScriptError:
            # A restarted (or flushed) server forgot the script: load it once and retry once.
            self.client.script_load(op.script.source)
            return self.client.evalsha(op.script.sha, len(op.keys), *op.keys, *op.args)
        except ResponseError as exc:
            raise _script_error(exc, op) from exc

    def _raw(self, op: Command) -> Any:
        """Send a plain command and return Redis's reply unparsed (redis-py's response callbacks
        would reshape XRANGE/XREAD replies into dicts; flows parse the RESP shape themselves)."""
        pool = self.client.connection_pool
        conn = pool.get_connection()
        try:
            conn.send_command(*op.args)
            return conn.read_response()
        except BaseException:
            conn.disconnect()  # a half-read reply must never be read by the next command
            raise
        finally:
            pool.release(conn)


class AsyncTransport:
    """Runs ops on a redis.asyncio client; the same policy as SyncTransport."""

    def __init__(self, client: redis.asyncio.Redis, retry: RetryPolicy | None = None,
                 sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.client, self.retry, self.sleep, self.clock = client, retry or RetryPolicy(), sleep, clock

    async def execute(self, op: Op) -> Any:
        start, tries = self.clock(), 0
        while True:
            try:
                return await self._once(op)
            except TRANSIENT as exc:
                tries += 1
                if not op.idempotent or self.clock() - start >= self.retry.window_s:
                    raise _unknown(op, exc, self.clock() - start) from exc
                await self.sleep(self.retry.backoff(tries))

    async def _once(self, op: Op) -> Any:
        if isinstance(op, Command):
            return await self._raw(op)
        try:
            return await self.client.evalsha(op.script.sha, len(op.keys), *op.keys, *op.args)
        except NoScriptError:
            await self.client.script_load(op.script.source)
            return await self.client.evalsha(op.script.sha, len(op.keys), *op.keys, *op.args)
        except ResponseError as exc:
            raise _script_error(exc, op) from exc

    async def _raw(self, op: Command) -> Any:
        """As SyncTransport._raw."""
        pool = self.client.connection_pool
        conn = await pool.get_connection()
        try:
            await conn.send_command(*op.args)
            return await conn.read_response()
        except BaseException:
            await conn.disconnect()
            raise
        finally:
            await pool.release(conn)
