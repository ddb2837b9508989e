"""What every command shares: connecting (URL, queue, TLS, ACL user), exit codes, confirmation,
JSON output and the one structured log line per state-changing action.

Read-only commands get a ``QueueView`` (never opens, so never creates a queue, and works under the
read-only operator role); commands that change state get a ``RolloutQueue`` opened on a queue that
must already exist (a mistyped --queue is "not found", never a new empty queue).
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import os
import sys
from typing import Any, Iterable, TypeVar, overload
from urllib.parse import urlsplit

import orjson
import redis

from rollout_queue.api.queue import RolloutQueue
from rollout_queue.drivers.cluster import redis_options
from rollout_queue.drivers.cluster import connect
from rollout_queue.ops.escape import clean, json_safe
from rollout_queue.core.keys import validate_queue_name
from rollout_queue.ops.logs import fields
from rollout_queue.core.policy import Durability, RetryPolicy
from rollout_queue.ops import views
from rollout_queue.ops.views import QueueView

#: the namespace a caller passes to parse_known_args (filled and returned as it is)
_N = TypeVar("_N")

EXIT_OK, EXIT_FAIL, EXIT_USAGE, EXIT_UNREACHABLE, EXIT_NOT_FOUND, EXIT_REFUSED, EXIT_DENIED = 0, 1, 2, 3, 4, 5, 6
#: A CLI should fail fast when Redis is down, not retry for the library default of 30 s.
CLI_RETRY = RetryPolicy(window_s=3.0)

log = logging.getLogger("rollout_queue.cli")


class UsageError(Exception):
    """Bad arguments or a missing --yes: exit 2 with the message, nothing was sent to Redis."""


class PermissionDenied(Exception):
    """Redis refused the credentials or the command (ACL): exit 6."""


class CommandParser(argparse.ArgumentParser):
    """The parser of one subcommand (and of ``python -m rollout_queue.workers``).

    Options may come anywhere, also between positionals (``config set --yes max_attempts=5``): plain
    argparse binds an empty list to a ``*`` positional that an option interrupts, then calls the words
    after the option unrecognized. This parser reads the options first, then the positionals
    (argparse's intermixed parsing, which a parser with subparsers cannot use: a subcommand has none).

    ``separator_optional``: the first ``--`` is dropped before parsing. ``rollout-queue worker --
    --engine torch`` is the documented form from when ``--`` ended the core CLI's options and began
    the worker's; one parser takes both now, and the worker has no positional a ``--`` could protect.
    """

    def __init__(self, *args: Any, separator_optional: bool = False, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.separator_optional = separator_optional
        self._intermixing = False

    # argparse's own overloads (typeshed's): a namespace passed in is the one filled and returned.
    @overload
    def parse_known_args(self, args: Iterable[str] | None = None,
                         namespace: None = None) -> tuple[argparse.Namespace, list[str]]: ...

    @overload
    def parse_known_args(self, args: Iterable[str] | None, namespace: _N) -> tuple[_N, list[str]]: ...

    @overload
    def parse_known_args(self, *, namespace: _N) -> tuple[_N, list[str]]: ...

    def parse_known_args(self, args: Iterable[str] | None = None, namespace: Any = None) -> tuple[Any, list[str]]:
        if self._intermixing:  # a pass of parse_known_intermixed_args (some Python versions call back here)
            return super().parse_known_args(args, namespace)
        words = list(sys.argv[1:] if args is None else args)
        if self.separator_optional and "--" in words:
            words.remove("--")
        self._intermixing = True
        try:
            return self.parse_known_intermixed_args(words, namespace)
        finally:
            self._intermixing = False


def add_connection_args(parser: argparse.ArgumentParser, suppress: bool = False) -> list[argparse.Action]:
    """The connection options (their actions). ``suppress``: on a subcommand, so they may also follow
    it without overriding the values given before it."""
    env = os.environ.get
    actions = []

    def default(name: str | None) -> Any:
        return argparse.SUPPRESS if suppress else (env(name) if name else False)

    def add(*names: str, **options: Any) -> None:
        actions.append(parser.add_argument(*names, **options))

    add("--url", default=default("REDIS_URL"),
        help="redis://[user:password@]host:port/db, rediss:// for TLS (env REDIS_URL)")
    add("--queue", default=default("ROLLOUT_QUEUE"), help="queue name (env ROLLOUT_QUEUE)")
    add("--partitions", type=int, default=default("ROLLOUT_PARTITIONS"), metavar="P",
        help="the queue's partition count, one per hash tag for a Redis Cluster "
             "(env ROLLOUT_PARTITIONS; default 1; fixed when the queue is created)")
    add("--tls-ca-cert", default=default("REDIS_TLS_CA_CERT"),
        help="CA that signed the server certificate, for rediss:// (env REDIS_TLS_CA_CERT)")
    add("--tls-cert", default=default("REDIS_TLS_CERT"), help="client certificate (env REDIS_TLS_CERT)")
    add("--tls-key", default=default("REDIS_TLS_KEY"), help="client private key (env REDIS_TLS_KEY)")
    add("--durable-replicas", type=int, default=default("ROLLOUT_DURABLE_REPLICAS"), metavar="N",
        help="durable mode: each state-changing call answers only once N replicas have it "
             "(WAIT), else exit 3 (env ROLLOUT_DURABLE_REPLICAS; default 0: off)")
    add("--durable-timeout-ms", type=int, default=default("ROLLOUT_DURABLE_TIMEOUT_MS"), metavar="MS",
        help="durable mode: ms of one WAIT, repeated within the retry window "
             "(env ROLLOUT_DURABLE_TIMEOUT_MS; default 1000)")
    add("--json-logs", action="store_true", default=default(None),
        help="log each state-changing action as one JSON line on stderr (default: human-readable)")
    return actions


def add_full(parser: argparse.ArgumentParser) -> None:
    """``--full``: a view's every row and column. By default a view printed on a terminal is laid out
    to fit it (an 80x24 pane during an incident: render.emit, fit.py); a pipe always gets everything."""
    parser.add_argument("--full", action="store_true",
                        help="on a terminal: every table whole (default: laid out to fit the terminal; "
                             "piped output is always whole)")


def connection_options() -> list[argparse.Action]:
    """The connection options' actions: ``dest``, ``option_strings`` and ``default`` (the env
    variable's value, unparsed)."""
    return add_connection_args(argparse.ArgumentParser(add_help=False))


def tls_options(args: argparse.Namespace) -> dict[str, Any]:
    if urlsplit(args.url).scheme != "rediss":
        return {}
    options = {"ssl_ca_certs": args.tls_ca_cert, "ssl_certfile": args.tls_cert, "ssl_keyfile": args.tls_key}
    return {k: v for k, v in options.items() if v}


def client(args: argparse.Namespace) -> redis.Redis | redis.cluster.RedisCluster:
    """A connected client: PING first, so a wrong password or an unreachable server fails in
    milliseconds with its own exit code instead of after the retry window."""
    if not args.url:
        raise UsageError("no Redis URL: pass --url or set REDIS_URL")
    if not args.queue:
        raise UsageError("no queue: pass --queue or set ROLLOUT_QUEUE")
    try:
        validate_queue_name(args.queue)
    except ValueError as exc:
        raise UsageError(str(exc)) from exc
    try:
        # redis+cluster:// (or rediss+cluster://) URLs get a RedisCluster client (cluster.py).
        c = connect(args.url, redis_options(tls_options(args)))
    except ValueError as exc:
        raise UsageError(f"bad --url {args.url!r}: {exc}") from exc
    try:
        c.ping()
    except redis.exceptions.AuthenticationError as exc:
        raise PermissionDenied(f"Redis refused the credentials in --url: {exc}") from exc
    except redis.exceptions.NoPermissionError:
        pass  # logged in, but this role may not PING: the command itself will tell
    return c


def durability(args: argparse.Namespace) -> Durability | None:
    """Durable mode from --durable-replicas / --durable-timeout-ms (or their env), None when off.
    Raises InvalidInput (exit 2) for a negative count or timeout."""
    replicas = getattr(args, "durable_replicas", None) or 0
    if replicas == 0:
        return None
    timeout = getattr(args, "durable_timeout_ms", None)
    return Durability(replicas, 1000 if timeout is None else timeout)


def open_view(args: argparse.Namespace) -> QueueView:
    """A read-only handle (no ``open``) on the logical queue, with its partition count: --partitions
    checked against the recorded count, or the recorded count itself when --partitions is not given
    (a plain queue has none: 1). Under --durable-replicas its state-changing calls (config set runs
    through it) wait for the replicas too."""
    c, durable = client(args), durability(args)
    probe = QueueView(c, args.queue, CLI_RETRY, durability=durable)
    count = probe.run(views.resolve_partitions(args.queue, given_partitions(args)))
    return probe if count == 1 else QueueView(c, args.queue, CLI_RETRY, durability=durable, partitions=count)


def given_partitions(args: argparse.Namespace) -> int | None:
    """--partitions (or ROLLOUT_PARTITIONS), None when not given."""
    value = getattr(args, "partitions", None)
    if value in (None, False, ""):
        return None
    try:
        count = int(value)
    except ValueError as exc:
        raise UsageError(f"--partitions must be an integer, not {value!r}") from exc
    if count < 1:
        raise UsageError(f"--partitions must be >= 1, not {count}")
    return count


def partitions(args: argparse.Namespace) -> int:
    """--partitions (or ROLLOUT_PARTITIONS), 1 when not given."""
    return given_partitions(args) or 1


def open_queue(args: argparse.Namespace, must_exist: bool = True) -> RolloutQueue:
    """The queue for a state-changing command, with --partitions. QueueNotFound (exit 4) if it does
    not exist, unless ``must_exist`` is False: then the command creates it."""
    return RolloutQueue(client(args), args.queue, partitions=partitions(args), retry=CLI_RETRY,
                        durability=durability(args), create=not must_exist)


def open_operated(args: argparse.Namespace) -> RolloutQueue:
    """The queue for an operator's state-changing command (requeue, dlq, drain): like open_queue
    (never creates: QueueNotFound, exit 4), with the partition count resolved as open_view does, so
    --partitions may be left out on a partitioned queue."""
    view = open_view(args)
    return RolloutQueue(view.client, args.queue, partitions=view.layout.count, retry=CLI_RETRY,
                        durability=durability(args), create=False)


def is_denied(exc: BaseException | None) -> bool:
    """An ACL refusal, possibly wrapped (the transport raises ScriptError from NoPermissionError; redis-py
    strips the NOPERM prefix, a script's own error keeps it)."""
    while exc is not None:
        if isinstance(exc, (redis.exceptions.NoPermissionError, PermissionDenied)) or "NOPERM" in str(exc):
            return True
        exc = exc.__cause__
    return False


def confirm(args: argparse.Namespace, what: str) -> None:
    """Destructive commands act only with --yes (no prompt: shell scripts must not hang)."""
    if not getattr(args, "yes", False):
        raise UsageError(f"{what}: confirm with --yes")


def to_json(value: Any) -> Any:
    """Dataclasses (views, stats, groups) as plain JSON values; bytes fields dropped."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: to_json(getattr(value, f.name)) for f in dataclasses.fields(value)
                if not isinstance(getattr(value, f.name), (bytes, bytearray)) and f.name != "fields"}
    if isinstance(value, dict):
        return {str(k): to_json(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [to_json(v) for v in value]
    return value


def print_json(value: Any) -> None:
    """Indented JSON on stdout; strings keep their text exactly, as JSON escapes (they can only occur
    inside strings, so escaping them keeps the document valid)."""
    sys.stdout.write(json_safe(orjson.dumps(to_json(value), option=orjson.OPT_INDENT_2, default=str).decode()) + "\n")


def print_line(*values: Any) -> None:
    """A tab-separated result line on stdout (for `cut -f`); each value is clean text (escape.clean),
    so a tab or newline inside a value can never forge a field or a line."""
    print("\t".join(clean(v) for v in values), flush=True)


def log_action(args: argparse.Namespace, message: str, action: str, **values: Any) -> None:
    """The one log line of a state-changing action: JSON with --json-logs, human-readable otherwise."""
    log.info(message, extra=fields(action=action, queue=args.queue, **values))
