"""Running calls against Redis: EVALSHA with NOSCRIPT recovery, retries across lost connections.

Owns the one thing both clients must get right the same way: what to do when the connection drops.
Every transition is idempotent by design (replayed by receipt, lease id, request id or source_id), so
a ``Call`` marked idempotent is sent again until ``retry_window_s`` runs out; then, or at once for a
non-idempotent call, OutcomeUnknown is raised, never a guess. A Redis restart therefore shows up to
users as a pause, not an error. It knows nothing about queue semantics.

On a Redis Cluster client (redis-py ``RedisCluster``) the same code runs: EVALSHA is routed by its
first key, and a plain command goes to the node that owns the hash tag of its first ``rollout:{…}``
argument (every key of a queue shares one tag, so one node holds them all). A cluster's transient
refusals (CLUSTERDOWN, TRYAGAIN, MOVED on a plain command) mean the command did not run; they are
retried like a lost connection. A plain client never sees them, so its behaviour is unchanged.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import Any, Awaitable, Callable, Union

import redis
import redis.asyncio
import redis.asyncio.cluster
import redis.cluster
from redis.exceptions import (
    AskError,
    ClusterDownError,
    NoScriptError,
    ResponseError,
    SlotNotCoveredError,
    TryAgainError,
)
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from .errors import OutcomeUnknown, ScriptError
from .protocol import Call, Command, Op

#: Refusals of a Redis Cluster after which the command did not run (a node is down or restarting,
#: a slot is moving): safe to send again. AskError covers MovedError, its subclass.
CLUSTER_TRANSIENT = (ClusterDownError, TryAgainError, AskError, SlotNotCoveredError)
TRANSIENT = (RedisConnectionError, RedisTimeoutError, ConnectionError, OSError, *CLUSTER_TRANSIENT)

SyncClient = Union[redis.Redis, redis.cluster.RedisCluster]
AsyncClient = Union[redis.asyncio.Redis, redis.asyncio.cluster.RedisCluster]


def routing_key(args: tuple[Any, ...]) -> str | bytes | None:
    """The argument whose hash tag decides a plain command's cluster node: the first one naming a
    queue key (``rollout:{q}:…``, also a SCAN pattern or a channel). None for keyless commands (TIME)."""
    for arg in args:
        if isinstance(arg, (str, bytes)) and arg[:9] in ("rollout:{", b"rollout:{"):
            return arg
    return None


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

    def __init__(self, client: SyncClient, retry: RetryPolicy | None = None,
                 sleep: Callable[[float], None] = time.sleep, clock: Callable[[], float] = time.monotonic) -> None:
        self.client, self.retry, self.sleep, self.clock = client, retry or RetryPolicy(), sleep, clock
        self.cluster = isinstance(client, redis.cluster.RedisCluster)

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
        try:
            if isinstance(op, Command):
                return self._raw(op)  # a plain read on a key of the wrong type is typed the same way
            try:
                return self.client.evalsha(op.script.sha, len(op.keys), *op.keys, *op.args)
            except NoScriptError:
                # A restarted (or flushed) server forgot the script: load it once and retry once.
                self._script_load(op)
                return self.client.evalsha(op.script.sha, len(op.keys), *op.keys, *op.args)
        except CLUSTER_TRANSIENT:
            raise  # not a script error: execute() retries it
        except ResponseError as exc:  # also an error of the retried call, which is typed the same way
            raise _script_error(exc, op) from exc

    def _script_load(self, op: Call) -> None:
        if not self.cluster:
            self.client.script_load(op.script.source)
            return
        # Only on the node that refused: loading on every primary would fail while any one is down.
        node = self.client.get_node_from_key(op.keys[0])  # type: ignore[union-attr]
        self.client.execute_command("SCRIPT", "LOAD", op.script.source, target_nodes=node)

    def _raw(self, op: Command) -> Any:
        """Send a plain command and return Redis's reply unparsed (redis-py's response callbacks
        would reshape XRANGE/XREAD replies into dicts; flows parse the RESP shape themselves)."""
        pool = self._pool(op)
        conn = pool.get_connection()
        try:
            conn.send_command(*op.args)
            return conn.read_response()
        except AskError:
            self.client.nodes_manager.initialize()  # type: ignore[union-attr]  # a slot moved: learn where
            raise
        except BaseException:
            conn.disconnect()  # a half-read reply must never be read by the next command
            raise
        finally:
            pool.release(conn)

    def _pool(self, op: Command) -> Any:
        if not self.cluster:
            return self.client.connection_pool  # type: ignore[union-attr]
        cluster: redis.cluster.RedisCluster = self.client  # type: ignore[assignment]
        key = routing_key(op.args)
        node = cluster.get_node_from_key(key) if key is not None else cluster.get_default_node()
        return cluster.get_redis_connection(node).connection_pool


class AsyncTransport:
    """Runs ops on a redis.asyncio client; the same policy as SyncTransport."""

    def __init__(self, client: AsyncClient, retry: RetryPolicy | None = None,
                 sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.client, self.retry, self.sleep, self.clock = client, retry or RetryPolicy(), sleep, clock
        self.cluster = isinstance(client, redis.asyncio.cluster.RedisCluster)

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
        try:
            if isinstance(op, Command):
                return await self._raw(op)
            try:
                return await self.client.evalsha(op.script.sha, len(op.keys), *op.keys, *op.args)
            except NoScriptError:
                await self._script_load(op)
                return await self.client.evalsha(op.script.sha, len(op.keys), *op.keys, *op.args)
        except CLUSTER_TRANSIENT:
            raise
        except ResponseError as exc:  # as SyncTransport._once
            raise _script_error(exc, op) from exc

    async def _script_load(self, op: Call) -> None:
        """As SyncTransport._script_load."""
        if not self.cluster:
            await self.client.script_load(op.script.source)
            return
        node = self.client.get_node_from_key(op.keys[0])  # type: ignore[union-attr]
        await self.client.execute_command("SCRIPT", "LOAD", op.script.source, target_nodes=node)

    async def _raw(self, op: Command) -> Any:
        """As SyncTransport._raw."""
        if self.cluster:
            return await self._raw_cluster(op)
        pool = self.client.connection_pool  # type: ignore[union-attr]
        conn = await pool.get_connection()
        try:
            await conn.send_command(*op.args)
            return await conn.read_response()
        except BaseException:
            await conn.disconnect()
            raise
        finally:
            await pool.release(conn)

    async def _raw_cluster(self, op: Command) -> Any:
        cluster: redis.asyncio.cluster.RedisCluster = self.client  # type: ignore[assignment]
        await cluster.initialize()  # a no-op once the slot map is known
        key = routing_key(op.args)
        node = cluster.get_node_from_key(key) if key is not None else cluster.get_default_node()
        conn = node.acquire_connection()
        try:
            await conn.send_command(*op.args)
            return await conn.read_response()
        except AskError:
            await cluster.nodes_manager.initialize()  # a slot moved: learn where
            raise
        except BaseException:
            await conn.disconnect()
            raise
        finally:
            node.release(conn)
