"""Running calls against Redis: EVALSHA with NOSCRIPT recovery, retries, refusals and durable WAITs.

Owns the one thing both clients must get right the same way: what to do when a call does not come
back cleanly. The policy is written once, as a sans-IO generator (``_policy``), and driven by the
two transports below, which only move bytes on one connection at a time:

- **Lost connection** (the reply never came): every transition is idempotent by design (replayed
  by receipt, lease id, request id or source_id), so a ``Call`` marked idempotent is sent again
  until ``retry_window_s`` runs out; then, or at once for a non-idempotent call, OutcomeUnknown is
  raised, never a guess. A Redis restart therefore shows up to users as a pause, not an error.
- **Refusal** (``refusal()``: BUSY, LOADING, READONLY, MASTERDOWN, NOREPLICAS, MISCONF, TRYAGAIN,
  CLUSTERDOWN, MOVED/ASK, UNBLOCKED): Redis said no before running anything (inside a script such a
  refusal comes at its first write, so nothing was written), so every call, idempotent or not, is
  sent again with backoff within the window; ServerUnavailable (the call did not run) after it.
- **Durable mode** (``Durability``): every state-changing op (``changes_state``) is sent with
  ``WAIT N T`` behind it on the same connection, in one round trip; if fewer than ``N`` replicas
  acknowledge, WAIT is repeated on that connection until the window runs out, then NotReplicated
  (the call ran on the primary and may be lost on failover; repeating it is safe).

It knows nothing about queue semantics. On a Redis Cluster client (redis-py ``RedisCluster``) the
same code runs: an op goes to the node that owns the hash tag of its first key (a script's first
KEY, a plain command's first ``rollout:{…}`` argument; every key of a queue shares one tag, so one
node holds them all), and a MOVED/ASK refusal refreshes the slot map before the retry.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import Any, Callable, Generator, Union

import redis
import redis.asyncio
import redis.asyncio.cluster
import redis.cluster
from redis.exceptions import (
    AskError,
    BusyLoadingError,
    ClusterDownError,
    MasterDownError,
    MovedError,
    NoScriptError,
    ReadOnlyError,
    ResponseError,
    SlotNotCoveredError,
    TryAgainError,
)
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from rollout_queue.core.errors import InvalidInput, NotReplicated, OutcomeUnknown, ScriptError, ServerUnavailable
from rollout_queue.core.policy import Durability, RetryPolicy
from rollout_queue.core.protocol import Call, Command, Op, Probe
from rollout_queue.core.scripts import READ_ONLY_SCRIPTS, SCRIPTS

#: Refusals of a Redis Cluster after which the command did not run (a node is down or restarting,
#: a slot is moving). AskError covers MovedError, its subclass. Kept for importers; refusal() decides.
CLUSTER_TRANSIENT = (ClusterDownError, TryAgainError, AskError, SlotNotCoveredError)
#: A lost connection: the call may or may not have run.
TRANSIENT = (RedisConnectionError, RedisTimeoutError, ConnectionError, OSError)

SyncClient = Union[redis.Redis, redis.cluster.RedisCluster]
AsyncClient = Union[redis.asyncio.Redis, redis.asyncio.cluster.RedisCluster]

# -- what changes state: the one list of what needs no WAIT in durable mode ------------------------

#: Plain commands that write nothing (the flows' and views' reads and blocking waits). Any other verb
#: (the partition count's ``SET NX``, say) is followed by WAIT in durable mode.
READ_COMMANDS = frozenset({
    "XREAD", "XRANGE", "XREVRANGE", "XPENDING", "XINFO", "XLEN",
    "HGET", "HMGET", "HGETALL", "HEXISTS", "HLEN", "HSTRLEN", "HKEYS",
    "GET", "MGET", "STRLEN", "EXISTS", "TYPE", "TTL", "PTTL", "SCAN",
    "ZCARD", "ZCOUNT", "ZRANGE", "ZRANGEBYSCORE", "ZREVRANGE", "ZSCORE", "ZMSCORE",
    "TIME", "PING", "MEMORY", "OBJECT",
})


def changes_state(op: Op) -> bool:
    """Whether ``op`` may write (and so, in durable mode, must be acknowledged by replicas)."""
    if isinstance(op, Call):
        return op.script.name not in READ_ONLY_SCRIPTS
    verb = op.args[0]
    return (verb.decode() if isinstance(verb, bytes) else str(verb)).upper() not in READ_COMMANDS


# -- refusals: Redis said no, and nothing ran ------------------------------------------------------

#: Refusal words redis-py leaves in a plain ResponseError's text (it has no class for them).
_REFUSAL_WORDS = frozenset({"BUSY", "NOREPLICAS", "MISCONF", "UNBLOCKED", "MASTERDOWN", "READONLY", "LOADING",
                            "TRYAGAIN", "CLUSTERDOWN", "MOVED", "ASK"})
#: Refusals a script meets at a write, which a script may catch and wrap in its own error.
_WRITE_REFUSALS = ("READONLY", "NOREPLICAS", "MISCONF")
#: redis-py's classes for the others (it strips their word from the text). Order: subclasses first.
_REFUSAL_TYPES: tuple[tuple[type[BaseException], str], ...] = (
    (BusyLoadingError, "LOADING"), (ReadOnlyError, "READONLY"), (MasterDownError, "MASTERDOWN"),
    (ClusterDownError, "CLUSTERDOWN"), (TryAgainError, "TRYAGAIN"), (MovedError, "MOVED"), (AskError, "ASK"),
    (SlotNotCoveredError, "CLUSTERDOWN"),
)


def refusal(exc: BaseException) -> str | None:
    """The code word of a refusal after which the command certainly did not run, else None.

    BUSY (a script is running), LOADING (the dataset is loading), READONLY (a replica: after a
    failover the old primary came back as one), MASTERDOWN (a replica without its primary),
    NOREPLICAS (min-replicas-to-write), MISCONF (writes stopped by a persistence error), UNBLOCKED
    (a blocking read cancelled by a role change) and the cluster's TRYAGAIN, CLUSTERDOWN, MOVED, ASK.
    Redis checks these before it runs a command; in a script the write-refusals come at the first
    write, which therefore did not happen; a script that catches one with pcall and raises its own
    error (open.lua's XGROUP CREATE) keeps its text after a colon, and a write refusal holds for the
    whole script, so no write of it ran either. A word must match exactly (BUSYGROUP is not BUSY).
    """
    for cls, code in _REFUSAL_TYPES:
        if isinstance(exc, cls):
            return code
    if isinstance(exc, ResponseError):
        text = str(exc)
        word = text.split(" ", 1)[0]
        if word in _REFUSAL_WORDS:
            return word
        for wrapped in _WRITE_REFUSALS:
            if f": {wrapped} " in text:
                return wrapped
        return None
    if isinstance(exc, RedisConnectionError) and isinstance(exc.__context__, ReadOnlyError):
        return "READONLY"  # redis-py's Sentinel pool: "the previous master is now a slave"
    return None


# -- the policy ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Send:
    """Send these commands in one round trip. ``fresh``: on a new connection (a new try); else on the
    connection of the previous _Send, which the driver still holds (WAIT counts that connection's writes)."""

    commands: tuple[tuple[Any, ...], ...]
    fresh: bool = True


@dataclass(frozen=True)
class _Sleep:
    seconds: float


@dataclass(frozen=True)
class _Outcome:
    """What came back from a _Send: the replies read, in order (a Redis error reply as its exception
    instance), and the exception that stopped reading (None when every reply was read)."""

    replies: list[Any]
    error: BaseException | None = None


Step = Union[_Send, _Sleep]
Policy = Generator[Step, Any, Any]


def _name(op: Op) -> str:
    return op.script.name if isinstance(op, Call) else str(op.args[0])


def _script_error(exc: ResponseError, op: Op) -> Exception:
    text = str(exc)
    if "ROLLOUTQ" in text:
        return ScriptError(f"{_name(op)}: {text[text.index('ROLLOUTQ'):]}")
    return ScriptError(f"{_name(op)}: Redis refused the call: {text}")


def _unknown(op: Op, exc: BaseException, elapsed: float) -> OutcomeUnknown:
    return OutcomeUnknown(
        f"{_name(op)}: connection to Redis failed ({exc!r}) and the call "
        + ("could not be retried within %.1fs" % elapsed if op.idempotent else "is not safe to retry")
        + "; it may or may not have run. Check the queue's state (rollout-queue stats) before acting again."
    )


def _companions(op: Call) -> tuple[str, ...]:
    """The read-only scripts loaded beside a script a restarted server forgot (see _policy)."""
    return tuple(SCRIPTS[name].source for name in sorted(READ_ONLY_SCRIPTS) if name != op.script.name)


def _request(op: Op) -> tuple[tuple[Any, ...], ...]:
    """The commands that carry ``op``: the command itself, or a script call; a Call with a ``stage``
    goes as MULTI, one SET NX per staged value, the EVALSHA, EXEC (one atomic step: _unwrap reads
    it). NX: a value already there is the one the script adopted before (this call resent after a
    lost reply), and it must not be replaced (lua/include/payloads.lua)."""
    if isinstance(op, Command):
        return (op.args,)
    # A read-only script goes as EVALSHA_RO: Redis then checks its declared keys as read-only, so the
    # operator role, which may only read (%R~, acl.py), can run it; a write in it would be refused.
    verb = "EVALSHA_RO" if op.script.name in READ_ONLY_SCRIPTS else "EVALSHA"
    call = (verb, op.script.sha, len(op.keys), *op.keys, *op.args)
    if not op.stage:
        return (call,)
    return (("MULTI",), *(("SET", key, value, "NX") for key, value in op.stage), call, ("EXEC",))


def _unwrap(op: Op, out: "_Outcome") -> "_Outcome":
    """The outcome of a staged Call as if it were a plain one: its first reply is the script's (or
    what stopped the transaction), the rest (a WAIT's) follow. EXEC's reply is the transaction's:
    a list whose last element is the script's reply; EXECABORT when Redis refused a queued command
    (nothing ran): then the refusal itself is the reply (NOPERM, OOM, READONLY...), so the policy
    judges it as it judges any reply. A reply that never came (the connection broke before EXEC was
    answered) leaves the outcome "maybe ran": EXEC may have run."""
    if not isinstance(op, Call) or not op.stage:
        return out
    n = len(op.stage) + 3  # MULTI, the SETs, the EVALSHA, EXEC
    if len(out.replies) < n:
        return _Outcome([], out.error if out.error is not None else ConnectionError("EXEC was not answered"))
    done = out.replies[n - 1]
    if isinstance(done, list) and done:
        staged_failed = [x for x in done[:-1] if isinstance(x, BaseException)]
        reply = staged_failed[0] if staged_failed and not isinstance(done[-1], BaseException) else done[-1]
    else:
        queued = [x for x in out.replies[:n - 1] if isinstance(x, BaseException)]
        reply = queued[0] if queued else (done if isinstance(done, BaseException) else
                                          ResponseError(f"EXEC answered {done!r}"))
    return _Outcome([reply, *out.replies[n:]], out.error)


def _policy(op: Op, retry: RetryPolicy, durability: Durability | None, clock: Callable[[], float]) -> Policy:
    """The whole life of one op, as steps for a driver: sends, sleeps, and the value or the error.

    A lost connection makes a try "maybe ran" (retried only when idempotent); a refusal means it did
    not run (retried always); ServerUnavailable is raised only when no try may have run.
    """
    wait = durability if durability is not None and changes_state(op) else None
    request = _request(op)
    tail: tuple[tuple[Any, ...], ...] = (("WAIT", wait.replicas, wait.timeout_ms),) if wait else ()
    start, tries, maybe_ran = clock(), 0, False
    while True:
        out: _Outcome = _unwrap(op, (yield _Send(request + tail)))
        if isinstance(op, Call) and out.replies and isinstance(out.replies[0], NoScriptError):
            # A restarted (or flushed) server forgot the script: load it on this connection (on a
            # cluster, the node that refused) and send again, once. The read-only scripts are loaded
            # with it: the read-only operator role may not load scripts (ACL), so the first other
            # client back after a restart loads them for it.
            # A staged call's SETs ran in the refused transaction: sent again, they write the same bytes.
            loads = tuple(("SCRIPT", "LOAD", source) for source in (op.script.source,) + _companions(op))
            out = yield _Send(loads + request + tail, fresh=False)
            if out.replies and isinstance(out.replies[0], ResponseError):
                raise ScriptError(
                    f"{_name(op)}: the server does not have this script loaded (it restarted or its script "
                    f"cache was flushed) and this client may not load it: {out.replies[0]}. Any other role "
                    "(worker, trainer, reaper) loads the read-only scripts when it next calls; retry then."
                ) from out.replies[0]
            out = _unwrap(op, _Outcome(out.replies[len(loads):], out.error) if out.replies else out)
        if out.replies:
            reply = out.replies[0]
            code = refusal(reply) if isinstance(reply, BaseException) else None
            if code is None:
                if isinstance(reply, ResponseError):
                    raise _script_error(reply, op) from reply  # also an error of the retried call
                if wait is not None:
                    yield from _confirm(op, wait, retry, clock, start, out)
                return reply
            problem: BaseException = reply
        else:
            assert out.error is not None, "a _Send came back with neither a reply nor an error"
            problem = out.error
            code = refusal(problem)
            if code is None and not isinstance(problem, TRANSIENT):
                raise problem  # not I/O trouble (a bad argument redis-py refused to encode, say)
        tries += 1
        elapsed = clock() - start
        if code is None:  # the connection failed: the op may have run
            maybe_ran = True
            if not op.idempotent or elapsed >= retry.window_s:
                raise _unknown(op, problem, elapsed) from problem
        elif elapsed >= retry.window_s:
            if maybe_ran:
                raise _unknown(op, problem, elapsed) from problem
            raise ServerUnavailable(_name(op), code, str(problem) or repr(problem), elapsed) from problem
        yield _Sleep(retry.backoff(tries))


def _confirm(op: Op, wait: Durability, retry: RetryPolicy, clock: Callable[[], float], start: float,
             out: _Outcome) -> Generator[Step, Any, None]:
    """Durable mode, after the op ran: repeat WAIT on the same connection until ``wait.replicas``
    acknowledged or the window ran out (NotReplicated). A WAIT on another connection would count
    that connection's writes, not this op's, so a broken connection ends the wait too."""
    acked: Any = out.replies[1] if len(out.replies) > 1 else out.error
    while True:
        elapsed = clock() - start
        if isinstance(acked, BaseException) or acked is None:
            detail = f"{type(acked).__name__}: {acked}" if acked is not None else "no reply"
            raise NotReplicated(_name(op), 0, wait.replicas, elapsed, detail) from acked
        if int(acked) >= wait.replicas:
            return
        if elapsed >= retry.window_s:
            raise NotReplicated(_name(op), int(acked), wait.replicas, elapsed)
        timeout_ms = max(1, min(wait.timeout_ms, int((retry.window_s - elapsed) * 1000)))
        again: _Outcome = yield _Send((("WAIT", wait.replicas, timeout_ms),), fresh=False)
        acked = again.replies[0] if again.replies else again.error


# -- the drivers -----------------------------------------------------------------------------------


def _check_socket_timeout(client: Any, durability: Durability | None) -> None:
    """A WAIT blocks up to timeout_ms on the server: past the socket timeout it would read as a lost
    connection. Checked where the client's pool tells (a plain client); documented for the rest."""
    if durability is None:
        return
    pool = getattr(client, "connection_pool", None)
    timeout = getattr(pool, "connection_kwargs", {}).get("socket_timeout") if pool is not None else None
    if timeout is not None and durability.timeout_ms / 1000 >= timeout:
        raise InvalidInput(f"Durability.timeout_ms={durability.timeout_ms} is not below the client's "
                           f"socket_timeout={timeout}s: lower it (or raise socket_timeout)")


def _routing(op: Op) -> str | bytes | None:
    if isinstance(op, Call):
        return op.keys[0]
    return op.route if op.route is not None else routing_key(op.args)


def routing_key(args: tuple[Any, ...]) -> str | bytes | None:
    """The argument whose hash tag decides a plain command's cluster node: the first one naming a
    queue key (``rollout:{q}:…``, also a SCAN pattern or a channel). None for keyless commands (TIME)."""
    for arg in args:
        if isinstance(arg, (str, bytes)) and arg[:9] in ("rollout:{", b"rollout:{"):
            return arg
    return None


def _moved(out: _Outcome) -> bool:
    return any(isinstance(x, AskError) for x in (*out.replies, out.error))


# -- one op, one flow: the I/O a driver must do, as steps ----------------------------------------


@dataclass(frozen=True)
class Acquire:
    """Take a connection to the node that owns ``key`` (None: any node); the driver answers (owner, conn)."""

    key: str | bytes | None


@dataclass(frozen=True)
class Exchange:
    """Send ``commands`` on ``held``'s connection in one write, reading their replies into ``out``
    (an error reply as its exception); any other failure is thrown back into the machine."""

    held: Any
    commands: tuple[tuple[Any, ...], ...]
    out: _Outcome


@dataclass(frozen=True)
class Release:
    """Give a connection back to its pool (``broken``: disconnect it first: a half-read reply must
    never be read again)."""

    held: Any
    broken: bool = False


@dataclass(frozen=True)
class Pause:
    seconds: float


@dataclass(frozen=True)
class RefreshSlots:
    """A cluster slot moved: learn where (a failure is met again, and retried, by the next try)."""


IOStep = Union[Acquire, Exchange, Release, Pause, RefreshSlots]
Machine = Generator[IOStep, Any, Any]


def execute(op: Op, retry: RetryPolicy, durability: Durability | None, clock: Callable[[], float],
            cluster: bool) -> Machine:
    """One op's whole life as I/O steps: the policy's sends and sleeps on one connection per try."""
    policy = _policy(op, retry, durability, clock)
    held: Any = None  # (owner, connection) of the current try
    try:
        step = next(policy)
        while True:
            if isinstance(step, _Sleep):
                if held is not None:  # nothing waits on it: a backoff never precedes a re-WAIT
                    yield Release(held)
                    held = None
                yield Pause(step.seconds)
                step = policy.send(None)
                continue
            if step.fresh and held is not None:
                yield Release(held)
                held = None
            out = _Outcome([])
            try:
                if held is None:
                    held = yield Acquire(_routing(op))
                yield Exchange(held, step.commands, out)
            except Exception as exc:  # noqa: BLE001 - the policy decides what an I/O failure means
                if held is not None:
                    yield Release(held, broken=True)
                    held = None
                out = _Outcome(out.replies, exc)
            if cluster and _moved(out):
                yield RefreshSlots()
            step = policy.send(out)
    except StopIteration as stop:
        if held is not None:
            yield Release(held)
        return stop.value
    except Exception:
        if held is not None:
            yield Release(held)
        raise


def drive(flow: Generator[Any, Any, Any], retry: RetryPolicy, probe_retry: RetryPolicy,
          durability: Durability | None, clock: Callable[[], float], cluster: bool) -> Machine:
    """A flow's whole life as I/O steps. A ``Probe``'s failure (OutcomeUnknown) is thrown back into
    the flow, which decides (a sweep over partitions skips a dead node); any other op's is raised."""
    reply: Any = None
    error: OutcomeUnknown | None = None
    while True:
        try:
            op = flow.send(reply) if error is None else flow.throw(error)
        except StopIteration as stop:
            return stop.value
        reply, error = None, None
        if not isinstance(op, Probe):
            reply = yield from execute(op, retry, durability, clock, cluster)
            continue
        try:
            reply = yield from execute(op.op, probe_retry if op.fast else retry, durability, clock, cluster)
        except OutcomeUnknown as exc:
            error = exc


def single(op: Op) -> Generator[Op, Any, Any]:
    """The flow of one op."""
    return (yield op)


# -- the drivers: the only code that does I/O, one loop each --------------------------------------

#: How long a probe (an op of a sweep over partitions) keeps trying before its partition is skipped.
PROBE_RETRY = RetryPolicy(window_s=0.2, first_backoff_s=0.02, max_backoff_s=0.1)


class Driver:
    """What both drivers hold: the client, the retry and durability policies and the clock."""

    is_async = False

    def __init__(self, client: Any, retry: RetryPolicy | None = None, *, clock: Callable[[], float] = time.monotonic,
                 durability: Durability | None = None, probe_retry: RetryPolicy = PROBE_RETRY,
                 sleep: Callable[[float], Any] | None = None) -> None:
        self.client, self.retry, self.clock = client, retry or RetryPolicy(), clock
        self.probe_retry, self.durability = probe_retry, durability
        self.sleep: Callable[[float], Any] = sleep or (asyncio.sleep if self.is_async else time.sleep)
        self.cluster = isinstance(client, (redis.cluster.RedisCluster, redis.asyncio.cluster.RedisCluster))
        _check_socket_timeout(client, durability)

    def machine(self, flow: Generator[Any, Any, Any]) -> Machine:
        return drive(flow, self.retry, self.probe_retry, self.durability, self.clock, self.cluster)

    def execute(self, op: Op) -> Any:
        """Run one op (a reply, or for the async driver an awaitable of it)."""
        return self.run(single(op))

    def run(self, flow: Generator[Any, Any, Any]) -> Any:
        raise NotImplementedError

    def close(self) -> Any:
        """Close the client's connections (an awaitable for the async driver)."""
        raise NotImplementedError


class SyncDriver(Driver):
    """Drives flows on a redis-py client (``redis.Redis`` or ``RedisCluster``)."""

    def run(self, flow: Generator[Any, Any, Any]) -> Any:
        machine, held = self.machine(flow), list[Any]()
        value: Any = None
        error: Exception | None = None
        while True:
            try:
                step = machine.send(value) if error is None else machine.throw(error)
            except StopIteration as stop:
                return stop.value
            value, error = None, None
            try:
                value = self._do(step, held)
            except Exception as exc:  # noqa: BLE001 - thrown back: the machine decides
                error = exc
            except BaseException:  # KeyboardInterrupt and the like: not the policy's business
                for h in held:
                    self._do(Release(h, broken=True), [])
                raise

    def close(self) -> None:
        self.client.close()

    def _do(self, step: IOStep, held: list[Any]) -> Any:
        match step:
            case Exchange(held=(_, conn), commands=commands, out=out):
                conn.send_packed_command(conn.pack_commands(commands))
                for _ in commands:
                    try:
                        out.replies.append(conn.read_response())
                    except ResponseError as exc:
                        out.replies.append(exc)
            case Acquire(key=key):
                if self.cluster:
                    node = self.client.get_node_from_key(key) if key is not None else self.client.get_default_node()
                    pool = self.client.get_redis_connection(node).connection_pool
                else:
                    pool = self.client.connection_pool
                got = (pool, pool.get_connection())
                held.append(got)
                return got
            case Release(held=(pool, conn) as h, broken=broken):
                if h in held:
                    held.remove(h)
                if broken:
                    conn.disconnect()
                pool.release(conn)
            case Pause(seconds=seconds):
                self.sleep(seconds)
            case RefreshSlots():
                try:
                    self.client.nodes_manager.initialize()
                except Exception:  # noqa: BLE001 - met again, and retried, by the next try
                    pass
        return None


class AsyncDriver(Driver):
    """Drives flows on a redis.asyncio client; the same machine as SyncDriver, with awaits."""

    is_async = True

    async def run(self, flow: Generator[Any, Any, Any]) -> Any:
        machine, held = self.machine(flow), list[Any]()
        value: Any = None
        error: Exception | None = None
        while True:
            try:
                step = machine.send(value) if error is None else machine.throw(error)
            except StopIteration as stop:
                return stop.value
            value, error = None, None
            try:
                value = await self._do(step, held)
            except Exception as exc:  # noqa: BLE001 - thrown back: the machine decides
                error = exc
            except BaseException:  # CancelledError and the like: drop what this run holds
                for h in held:
                    await self._do(Release(h, broken=True), [])
                raise

    async def close(self) -> None:
        await self.client.aclose()

    async def _do(self, step: IOStep, held: list[Any]) -> Any:
        match step:
            case Exchange(held=(_, conn), commands=commands, out=out):
                await conn.send_packed_command(conn.pack_commands(commands))
                for _ in commands:
                    try:
                        out.replies.append(await conn.read_response())
                    except ResponseError as exc:
                        out.replies.append(exc)
            case Acquire(key=key):
                if self.cluster:
                    await self.client.initialize()  # a no-op once the slot map is known
                    node = self.client.get_node_from_key(key) if key is not None else self.client.get_default_node()
                    got: tuple[Any, Any] = (node, node.acquire_connection())
                else:
                    pool = self.client.connection_pool
                    got = (pool, await pool.get_connection())
                held.append(got)
                return got
            case Release(held=(owner, conn) as h, broken=broken):
                if h in held:
                    held.remove(h)
                if broken:
                    await conn.disconnect()
                if self.cluster:
                    owner.release(conn)
                else:
                    await owner.release(conn)
            case Pause(seconds=seconds):
                await self.sleep(seconds)
            case RefreshSlots():
                try:
                    await self.client.nodes_manager.initialize()
                except Exception:  # noqa: BLE001 - met again, and retried, by the next try
                    pass
        return None


def driver_for(client: Any, retry: RetryPolicy | None = None, **options: Any) -> Driver:
    """The driver of ``client``'s kind: redis.asyncio clients get the async one."""
    is_async = isinstance(client, (redis.asyncio.Redis, redis.asyncio.cluster.RedisCluster))
    return (AsyncDriver if is_async else SyncDriver)(client, retry, **options)
