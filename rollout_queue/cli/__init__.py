"""The ``rollout-queue`` command line: a thin shell over the public API and the operator views.

Owns argument parsing, output (rich tables on a terminal, plain text in pipes, ``--json`` for
scripts), exit codes and the log line of each state-changing action. It calls RolloutQueue, the
read-only views (views.py) and the operator actions (actions.py); never a key or a script directly.
One module per command group: status (stats, top, metrics), entries (inspect, workers, leases,
requeue), admin (dlq, config, drain, acl), verify (the promise checked), processes (reaper, worker,
walkthrough), rl (produce, train, demo).

Exit codes (stable; shell scripts may rely on them, the message is on stderr):
  0  ok
  1  runtime failure (a failed ledger check or `verify`, a drain --wait that timed out, a library mismatch)
  2  usage: bad arguments, or a destructive command without --yes (nothing was sent)
  3  cannot reach Redis (or the outcome of a call is unknown: check with `stats` before retrying)
  4  not found: no such queue, entry or dead letter
  5  refused: the queue's state forbids the action, nothing changed (worker alive, attempt moved,
     config changed meanwhile, entry not executing)
  6  permission denied: Redis refused the credentials or the command (ACL role)
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Sequence

import redis

from rollout_queue.ops import logs
from rollout_queue.core.errors import (
    ConfigMismatch,
    InvalidInput,
    NotFound,
    OutcomeUnknown,
    OwnershipLost,
    RolloutQueueError,
    StateConflict,
)
from rollout_queue.ops.escape import clean
from rollout_queue.cli import admin, entries, processes, rl, status, verify
from rollout_queue.cli.common import (
    EXIT_DENIED,
    EXIT_FAIL,
    EXIT_NOT_FOUND,
    EXIT_REFUSED,
    EXIT_UNREACHABLE,
    EXIT_USAGE,
    CommandParser,
    PermissionDenied,
    UsageError,
    add_connection_args,
    is_denied,
)

__all__ = ["build_parser", "main"]


def build_parser() -> argparse.ArgumentParser:
    """One argparse tree: the connection options, then a subcommand with its own options (the
    connection options again, so they may follow it too; the worker's are its own, workers/cli.py)."""
    parser = argparse.ArgumentParser(prog="rollout-queue", description=__doc__.split("\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    add_connection_args(parser)
    sub = parser.add_subparsers(dest="command", required=True, parser_class=CommandParser)
    for group in (status, entries, admin, verify, processes, rl):
        group.register(sub)
    for name, p in sub.choices.items():
        if name != "worker":  # the worker declares the connection options it takes itself
            add_connection_args(p, suppress=True)
    worker_usage = sub.choices["worker"].format_usage().removeprefix("usage: ")
    parser.epilog = (__doc__[__doc__.index("Exit codes"):] + "\nThe worker's options (`rollout-queue worker --help` "
                     "says what each does; a `--` before them is optional):\n  " + worker_usage)
    return parser


def _exit(code: int, message: str) -> int:
    # Messages quote values from Redis (a corrupt field, a worker id): escaped like every other output.
    print(f"rollout-queue: {clean(message)}", file=sys.stderr)
    return code


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logs.configure(args.json_logs)
    try:
        return int(args.func(args))
    except UsageError as exc:
        return _exit(EXIT_USAGE, str(exc))
    except PermissionDenied as exc:
        return _exit(EXIT_DENIED, str(exc))
    except OutcomeUnknown as exc:
        cause = exc.__cause__
        if cause is not None and isinstance(cause, redis.exceptions.AuthenticationError):
            return _exit(EXIT_DENIED, f"Redis refused the credentials: {cause}")
        return _exit(EXIT_UNREACHABLE, f"cannot reach Redis: {exc}")
    except NotFound as exc:
        return _exit(EXIT_NOT_FOUND, str(exc))
    except ConfigMismatch as exc:
        return _exit(EXIT_FAIL, str(exc))
    except (StateConflict, OwnershipLost) as exc:
        return _exit(EXIT_REFUSED, f"refused, nothing changed: {exc}")
    except (InvalidInput, ValueError) as exc:  # bad input: an entry id, a queue name, a config value
        return _exit(EXIT_USAGE, str(exc))
    except (RolloutQueueError, redis.exceptions.ResponseError) as exc:
        if is_denied(exc):
            return _exit(EXIT_DENIED, f"permission denied (check this user's ACL role): {exc}")
        return _exit(EXIT_FAIL, str(exc))
    except (ConnectionError, redis.exceptions.ConnectionError, OSError) as exc:
        return _exit(EXIT_UNREACHABLE, f"cannot reach Redis at {args.url}: {exc}")
    except redis.exceptions.RedisClusterException as exc:  # no startup node of the cluster answered
        return _exit(EXIT_UNREACHABLE, f"cannot reach the Redis Cluster at {args.url}: {exc} "
                                       "(the URL's node must be up when a process starts)")
    except Exception as exc:
        # A bug (the views read garbage leniently, so this is not bad data): one clear line instead of a
        # traceback on an operator's terminal; ROLLOUT_QUEUE_DEBUG=1 re-raises it for a bug report.
        if os.environ.get("ROLLOUT_QUEUE_DEBUG"):
            raise
        return _exit(EXIT_FAIL, f"internal error ({type(exc).__name__}: {exc}); please report it with the "
                                "command line (ROLLOUT_QUEUE_DEBUG=1 shows the traceback)")


if __name__ == "__main__":
    sys.exit(main())
