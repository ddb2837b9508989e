"""Queue administration: ``dlq list|show|requeue|purge``, ``config show|set``, ``drain`` and ``acl``.

Every state change here asks for --yes, is one script per call (actions.py), and logs one line.
"""

from __future__ import annotations

import argparse
import shlex
import sys
import time
from typing import Any

from rollout_queue.ops import acl, actions, views
from rollout_queue.core.config import QueueConfig
from rollout_queue.core.errors import InvalidInput
from rollout_queue.core.models import DeadLetter
from rollout_queue.cli import render
from rollout_queue.cli.common import (
    EXIT_FAIL,
    EXIT_OK,
    UsageError,
    client,
    confirm,
    log_action,
    open_queue,
    open_view,
    print_json,
    print_line,
    to_json,
)

# -- dead letters --------------------------------------------------------------------------------


def cmd_dlq(args: argparse.Namespace) -> int:
    if args.action == "list":
        view = open_view(args)
        letters = view.run(views.dead_letters(view.keys, args.count))
        if args.json:
            print_json([render_letter(d) for d in letters])
        else:
            for d in letters:
                print_line(d.dlq_id, d.entry_id, d.source_id, f"attempt={d.attempt}", d.reason)
        return EXIT_OK
    if not args.ids and not (args.all and args.action in ("requeue", "purge")):
        raise UsageError(f"dlq {args.action} needs dead-letter IDs (see `rollout-queue dlq list`)"
                         + (" or --all" if args.action != "show" else ""))
    if args.action == "show":
        view = open_view(args)
        for dlq_id in args.ids:
            print_json(render_letter(view.run(views.dead_letter(view.keys, dlq_id))))
        return EXIT_OK
    return _dlq_change(args)


def render_letter(d: DeadLetter) -> dict[str, Any]:
    """A dead letter as JSON; ``fields`` (raw bytes) stays null, as it always was."""
    return {**to_json(d), "fields": None}


def _dlq_change(args: argparse.Namespace) -> int:
    if args.action == "requeue":
        confirm(args, "dlq requeue submits the groups again")
        q = open_queue(args)
        ids = args.ids or [d.dlq_id for d in q.dead_letters(100_000)]
        for dlq_id in ids:
            entry_id = q.requeue_dead_letter(dlq_id)
            log_action(args, "requeued dead letter", "dlq_requeue", dlq_id=dlq_id, entry_id=entry_id)
            print_line(dlq_id, entry_id)
        return EXIT_OK
    confirm(args, "dlq purge deletes dead letters and their pristine payload for good")
    q = open_queue(args)
    n = q.run(actions.purge_all_dead_letters(q.keys) if args.all else actions.purge_dead_letters(q.keys, args.ids))
    log_action(args, "purged dead letters", "dlq_purge", purged=n, ids=",".join(args.ids) or "all")
    print_line("purged", n)
    return EXIT_OK


# -- config --------------------------------------------------------------------------------------


#: The QueueConfig fields that may be None (`config set name=none`), and what None means.
OPTIONAL = {"max_staleness": "strictly on-policy", "batch_groups": "no admission control",
            "settled_retention_s": "keep settled lines forever"}


def parse_setting(text: str) -> tuple[str, Any]:
    """``name=value`` with the type of the QueueConfig field; 'none' for the optional bounds."""
    name, sep, raw = text.partition("=")
    if not sep:
        raise UsageError(f"config set takes name=value pairs, got {text!r}")
    if name not in QueueConfig.__dataclass_fields__:
        raise UsageError(f"unknown config field {name!r}; known: {', '.join(QueueConfig.__dataclass_fields__)}")
    if raw.strip().lower() in ("none", "null", ""):
        if name in OPTIONAL:
            return name, None
        raise UsageError(f"{name} cannot be none: it is not optional (only {', '.join(OPTIONAL)} are); "
                         f"give {'fifo or lifo' if name == 'buffer_order' else 'a number'}")
    if name == "buffer_order":
        return name, raw
    try:
        return name, float(raw) if name.endswith("_s") else int(raw)
    except ValueError as exc:
        kind = "seconds" if name.endswith("_s") else "an integer"
        raise UsageError(f"{name}: {raw!r} is not a number ({kind})") from exc


def cmd_config(args: argparse.Namespace) -> int:
    if args.action == "show":
        view = open_view(args)
        values, corrupt = view.run(views.stored_config(view.keys))
        if args.json:
            print_json({**values, "corrupt": corrupt} if corrupt else QueueConfig(**values))  # type: ignore[arg-type]
        else:
            render.emit([render.section(f"config of queue {args.queue}", ("field", "value"),
                                        [(k, v) for k, v in render_config(values, corrupt).items()])])
        return EXIT_OK
    if not args.settings:
        raise UsageError("config set needs name=value pairs, e.g. max_attempts=5")
    changes = dict(parse_setting(s) for s in args.settings)
    confirm(args, "config set changes the bounds every client enforces")
    # Not open_queue: a client's open refuses a queue whose stored config is corrupt, and repairing
    # it is this command's job. config_set.lua checks the library version and every field itself.
    q = open_view(args)
    try:
        old, new, n = q.run(actions.set_config(q.keys, changes))
    except ValueError as exc:
        raise InvalidInput(f"config set refused: {exc}") from exc
    log_action(args, "config changed", "config_set", fields_changed=n,
               changes={name: [old[name], getattr(new, name)] for name in changes})
    for name in changes:
        print_line(name, _shown(old[name]), _shown(getattr(new, name)))
    return EXIT_OK


def _shown(value: Any) -> Any:
    return "none" if value is None else value


def render_config(values: dict[str, Any], corrupt: dict[str, str]) -> dict[str, Any]:
    """Each field as `config show` prints it (QueueConfig.stored_fields): a stored field that does not
    decode is marked CORRUPT with its raw value (``config set`` repairs it)."""
    return {k: f"CORRUPT ({corrupt[k]}): repair with config set" if k in corrupt else _shown(values[k])
            for k in QueueConfig.__dataclass_fields__}


# -- drain ---------------------------------------------------------------------------------------


def cmd_drain(args: argparse.Namespace) -> int:
    if args.action == "status":
        view = open_view(args)
        status = view.run(views.drain_status(view.keys))
        if args.json:
            print_json(status)
        else:
            left = None if status.deadline_ms is None else status.deadline_ms - status.server_ms
            print_line("draining" if status.active else "not_draining", status.executing_groups,
                       render.duration(left) if status.active else "-", status.reason)
        return EXIT_OK
    confirm(args, f"drain {args.action} {'closes' if args.action == 'start' else 'reopens'} admission")
    q = open_queue(args)
    if args.action == "stop":
        left = q.run(actions.drain_stop(q.keys))
        log_action(args, "drain stopped", "drain_stop", holds_left=left)
        print_line("stopped", f"holds_left={left}")
        return EXIT_OK
    deadline, executing = q.run(actions.drain_start(q.keys, args.timeout_s, args.reason))
    log_action(args, "drain started", "drain_start", deadline_ms=deadline, executing_groups=executing,
               reason=args.reason)
    print_line("draining", f"executing={executing}", f"deadline_ms={deadline}")
    if args.wait is not None and not q.run(actions.wait_drained(q.keys, args.wait, time.monotonic)):
        print(f"rollout-queue: still executing after {args.wait}s; the drain stands", file=sys.stderr)
        return EXIT_FAIL
    return EXIT_OK


# -- acl -----------------------------------------------------------------------------------------


def cmd_acl(args: argparse.Namespace) -> int:
    if not args.queue:
        raise UsageError("no queue: pass --queue or set ROLLOUT_QUEUE")
    passwords = dict(parse_password(p) for p in args.password)
    rules = acl.all_rules(args.queue, args.role or acl.ROLE_NAMES, passwords)
    if args.apply:
        confirm(args, "acl --apply creates or overwrites these ACL users on the server")
        c = client(args)
        for r in rules:
            c.execute_command("ACL", "SETUSER", r.user, *r.rules)
            log_action(args, "ACL user set", "acl_apply", user=r.user, role=r.role)
            print_line("applied", r.user)
        return EXIT_OK
    for line in acl.banner(args.queue):
        print(line)
    for r in rules:
        if args.format == "aclfile":
            print(r.aclfile())
        elif args.format == "shell":
            print(" ".join(["redis-cli", "ACL", "SETUSER", shlex.quote(r.user)] + [shlex.quote(x) for x in r.rules]))
        else:
            print(r.setuser())
    return EXIT_OK


def parse_password(text: str) -> tuple[str, str]:
    role, sep, secret = text.partition("=")
    if not sep or role not in acl.ROLE_NAMES or not secret:
        raise UsageError(f"--password takes ROLE=SECRET with ROLE one of {', '.join(acl.ROLE_NAMES)}")
    return role, secret


def register(sub: Any) -> None:
    p = sub.add_parser("dlq", help="dead letters: list, show, requeue, purge")
    p.add_argument("action", choices=["list", "show", "requeue", "purge"])
    p.add_argument("ids", nargs="*", help="dead-letter IDs (show, requeue, purge)")
    p.add_argument("--all", action="store_true", help="requeue/purge every dead letter")
    p.add_argument("--count", type=int, default=100, help="list: at most this many (oldest first)")
    p.add_argument("--json", action="store_true")
    p.add_argument("--yes", action="store_true", help="confirm a state change")
    p.set_defaults(func=cmd_dlq)

    p = sub.add_parser("config", help="show or set the queue's stored config (validated, atomic)")
    p.add_argument("action", choices=["show", "set"])
    p.add_argument("settings", nargs="*", metavar="name=value", help="set: fields of QueueConfig ('none' clears "
                   "max_staleness, batch_groups or settled_retention_s); also repairs a corrupt stored field")
    p.add_argument("--json", action="store_true")
    p.add_argument("--yes", action="store_true", help="confirm a state change")
    p.set_defaults(func=cmd_config)

    p = sub.add_parser("drain", help="stop admission for maintenance (a long admission hold)")
    p.add_argument("action", nargs="?", choices=["start", "stop", "status"], default="start")
    p.add_argument("--timeout-s", type=float, default=3600.0,
                   help="the drain ends by itself after this long (default 3600; start again to extend)")
    p.add_argument("--reason", default="", help="shown by `drain status` (starting again keeps the last one)")
    p.add_argument("--wait", type=float, default=None, metavar="SECONDS",
                   help="start: wait until nothing executes (exit 1 if still executing after SECONDS)")
    p.add_argument("--json", action="store_true")
    p.add_argument("--yes", action="store_true", help="confirm a state change")
    p.set_defaults(func=cmd_drain)

    p = sub.add_parser("acl", help="print (or --apply) Redis ACL users for the queue's roles")
    p.add_argument("--role", action="append", choices=acl.ROLE_NAMES, help="only these roles (repeatable)")
    p.add_argument("--format", choices=["setuser", "aclfile", "shell"], default="setuser",
                   help="setuser: for the redis-cli prompt; aclfile: lines for an aclfile; shell: quoted redis-cli")
    p.add_argument("--password", action="append", default=[], metavar="ROLE=SECRET",
                   help="set this role's password (only its SHA-256 is printed or sent)")
    p.add_argument("--apply", action="store_true",
                   help="run the ACL SETUSER commands on --url (needs a user allowed to run ACL; with --yes)")
    p.add_argument("--yes", action="store_true", help="confirm --apply")
    p.set_defaults(func=cmd_acl)
