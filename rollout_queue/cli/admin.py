"""Queue administration: ``dlq list|show|requeue|purge``, ``config show|set``, ``drain`` and ``acl``.

Every state change here asks for --yes, is one script per call (actions.py), and logs one line.
"""

from __future__ import annotations

import argparse
import shlex
import sys
import time
from typing import Any, Sequence

import redis.cluster

from rollout_queue.ops import acl, actions, partition_views, views
from rollout_queue.scale.layout import SPLIT_BOUNDS, logical_config, share
from rollout_queue.core.config import DERIVED, TEXT_FIELDS, QueueConfig
from rollout_queue.core.errors import InvalidInput
from rollout_queue.core.models import DeadLetter
from rollout_queue.ops.escape import clean
from rollout_queue.ops.view_models import stream_id
from rollout_queue.cli import render
from rollout_queue.cli.common import (
    EXIT_FAIL,
    EXIT_NOT_FOUND,
    EXIT_OK,
    UsageError,
    add_full,
    client,
    confirm,
    log_action,
    open_operated,
    given_partitions,
    open_view,
    partitions,
    print_json,
    print_line,
    to_json,
)

# -- dead letters --------------------------------------------------------------------------------


def cmd_dlq(args: argparse.Namespace) -> int:
    """On a partitioned queue every dead-letter and entry ID is shown as ``partition/id`` (IDs repeat
    across partitions), and taken so or bare (looked up in every partition)."""
    if args.action == "list":
        return _dlq_list(args)
    if not args.ids and not (args.all and args.action in ("requeue", "purge")):
        raise UsageError(f"dlq {args.action} needs dead-letter IDs (see `rollout-queue dlq list`)"
                         + (" or --all" if args.action != "show" else ""))
    if args.action == "show":
        view = open_view(args)
        for dlq_id in args.ids:
            letter = view.run(partition_views.dead_letter(view.layout, dlq_id))
            if args.json:
                print_json(render_letter(letter))
            else:
                render.emit(render.letter_sections(view.run(partition_views.letter_views(view.layout, [letter]))[0]),
                            full=args.full)
        return EXIT_OK
    return _dlq_change(args)


def _dlq_list(args: argparse.Namespace) -> int:
    """A table on a terminal; piped, one tab-separated line per dead letter and no header (for
    `cut -f1`); ``--json`` for scripts. An empty DLQ says so (on stderr when piped: stdout stays empty)."""
    view = open_view(args)
    letters = view.run(partition_views.dead_letters(view.layout, args.count))
    if args.json:
        print_json([render_letter(d) for d in letters])
        return EXIT_OK
    if not letters:
        print(clean(f"no dead letters in queue {args.queue} (the DLQ is empty)"),
              file=sys.stdout if sys.stdout.isatty() else sys.stderr)
        return EXIT_OK
    shown = view.run(partition_views.letter_views(view.layout, letters))
    if sys.stdout.isatty():
        render.emit([render.dead_letters_section(shown, args.queue)], full=args.full)
    else:
        for d in shown:
            print_line(*render.letter_fields(d))
    return EXIT_OK


def render_letter(d: DeadLetter) -> dict[str, Any]:
    """A dead letter as JSON; ``fields`` (raw bytes) stays null, as it always was; ``died_ms`` is the
    server's time of death (its dlq stream ID)."""
    return {**to_json(d), "fields": None, "died_ms": stream_id(d.dlq_id)[0]}


def _letters(q: Any, refs: Sequence[str]) -> list[tuple[int, str]]:
    """(partition index, dlq id) of each ``[partition/]dlq_id`` (a bare one looked up in every partition)."""
    layout = q.layout
    out = []
    for ref in refs:
        index, ident = partition_views.split_ref(layout, ref)
        if index is None:
            found = q.run(partition_views.dead_letter(layout, ref))
            index = layout.names.index(found.queue)
        out.append((index, ident))
    return out


def _dlq_change(args: argparse.Namespace) -> int:
    if args.action == "requeue":
        confirm(args, "dlq requeue submits the groups again")
        q = open_operated(args)
        layout = q.layout
        if args.ids:
            targets = _letters(q, args.ids)
        else:
            targets = [(layout.names.index(d.queue) if d.queue else 0, d.dlq_id)
                       for d in q.run(partition_views.dead_letters(layout, 100_000))]
        for index, dlq_id in targets:
            entry_id = q.requeue_dead_letter(dlq_id, layout.names[index])
            shown = partition_views.qualified(layout, layout.names[index], dlq_id)
            log_action(args, "requeued dead letter", "dlq_requeue", dlq_id=shown,
                       entry_id=partition_views.qualified(layout, layout.names[index], entry_id))
            print_line(shown, partition_views.qualified(layout, layout.names[index], entry_id))
        return EXIT_OK
    confirm(args, "dlq purge deletes dead letters and their pristine payload for good")
    q = open_operated(args)
    layout = q.layout
    if args.all:
        n = sum(q.run(actions.purge_all_dead_letters(keys)) for keys in layout.keys)
    else:
        by_partition: dict[int, list[str]] = {}
        for index, dlq_id in _letters(q, args.ids):
            by_partition.setdefault(index, []).append(dlq_id)
        n = sum(q.run(actions.purge_dead_letters(layout.keys[i], ids)) for i, ids in sorted(by_partition.items()))
    log_action(args, "purged dead letters", "dlq_purge", purged=n, ids=",".join(args.ids) or "all")
    print_line("purged", n)
    if not args.all and n < len(set(args.ids)):
        # The ones that existed are gone; say that the others never did (a typo, or purged before).
        print(f"rollout-queue: {len(set(args.ids)) - n} of {len(set(args.ids))} dead letters named do not exist",
              file=sys.stderr)
        return EXIT_NOT_FOUND
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
                         f"give {' or '.join(TEXT_FIELDS[name]) if name in TEXT_FIELDS else 'a number'}")
    if name in TEXT_FIELDS:
        return name, raw
    try:
        return name, float(raw) if name.endswith("_s") else int(raw)
    except ValueError as exc:
        kind = "seconds" if name.endswith("_s") else "an integer"
        raise UsageError(f"{name}: {raw!r} is not a number ({kind})") from exc


def cmd_config(args: argparse.Namespace) -> int:
    if args.action == "show":
        view = open_view(args)
        if view.layout.count > 1:
            return _config_show_partitioned(args, view)
        values, corrupt = view.run(views.stored_config(view.keys))
        if args.json:
            print_json({**values, "corrupt": corrupt} if corrupt else QueueConfig(**values))
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
    layout = q.layout
    if layout.count > 1:
        return _config_set_partitioned(args, q, changes)
    try:
        old, new, n = q.run(actions.set_config(q.keys, changes))
    except ValueError as exc:
        raise InvalidInput(f"config set refused: {exc}") from exc
    log_action(args, "config changed", "config_set", fields_changed=n,
               changes={name: [old[name], getattr(new, name)] for name in changes})
    for name in changes:
        print_line(name, _shown(old[name]), _shown(getattr(new, name)))
    return EXIT_OK


def _config_set_partitioned(args: argparse.Namespace, view: Any, changes: dict[str, Any]) -> int:
    """config set on every partition: a split bound (SPLIT_BOUNDS) as each partition's share of the
    logical value given, any other field as given. Each partition's change is atomic on its own; a
    failure part-way leaves the earlier partitions changed (the lines printed say which): run the
    command again. Clients read the shares at open: reopen them."""
    layout = view.layout
    small = [k for k in changes if k in SPLIT_BOUNDS and changes[k] is not None and changes[k] < layout.count]
    if small:
        raise UsageError(f"{', '.join(f'{k}={changes[k]}' for k in small)} is below partitions={layout.count}: "
                         "a partition's share would be 0 (nothing was written)")
    for i, (name, keys) in enumerate(zip(layout.names, layout.keys)):
        mine = {k: share(v, layout.count, i) if k in SPLIT_BOUNDS and v is not None else v for k, v in changes.items()}
        try:
            old, new, n = view.run(actions.set_config(keys, mine))
        except ValueError as exc:
            raise InvalidInput(f"config set refused on partition {name}: {exc}") from exc
        log_action(args, "config changed", "config_set", partition=name, fields_changed=n,
                   changes={k: [old[k], getattr(new, k)] for k in mine})
        for k in mine:
            print_line(name, k, _shown(old[k]), _shown(getattr(new, k)))
    return EXIT_OK


def _config_show_partitioned(args: argparse.Namespace, view: Any) -> int:
    """The logical config (split bounds summed, scale/layout.logical_config) beside each partition's."""
    stored = [view.run(views.stored_config(keys)) for keys in view.layout.keys]
    corrupt = {name: c for name, (_, c) in zip(view.layout.names, stored) if c}
    logical = None if corrupt else logical_config([QueueConfig(**values) for values, _ in stored])
    if args.json:
        print_json({"logical": logical, "partitions": {name: ({**values, "corrupt": c} if c else QueueConfig(**values))
                                                       for name, (values, c) in zip(view.layout.names, stored)}})
        return EXIT_OK
    shown = [render_config(values, c) for values, c in stored]
    rows = [(k, "?" if logical is None else _shown(getattr(logical, k)), *(part[k] for part in shown))
            for k in QueueConfig.__dataclass_fields__]
    render.emit([render.section(f"config of queue {args.queue} ({view.layout.count} partitions; the logical value "
                                f"of {', '.join(SPLIT_BOUNDS)} is the sum of the partitions' shares)",
                                ("field", "logical", *view.layout.names), rows)])
    return EXIT_OK


def _shown(value: Any) -> Any:
    if value is DERIVED:  # batch_groups left to the trainer (config.py, Derived)
        return "unset (none until a trainer derives it)"
    return "none" if value is None else value


def render_config(values: dict[str, Any], corrupt: dict[str, str]) -> dict[str, Any]:
    """Each field as `config show` prints it (QueueConfig.stored_fields): a stored field that does not
    decode is marked CORRUPT with its raw value (``config set`` repairs it)."""
    return {k: f"CORRUPT ({corrupt[k]}): repair with config set" if k in corrupt else _shown(values[k])
            for k in QueueConfig.__dataclass_fields__}


# -- drain ---------------------------------------------------------------------------------------


def cmd_drain(args: argparse.Namespace) -> int:
    """On a partitioned queue the drain is a hold on every partition; status merges them (draining
    while any partition's stands) and lists each."""
    if args.action == "status":
        view = open_view(args)
        if view.layout.count == 1:
            status = view.run(views.drain_status(view.keys))
            parts = []
        else:
            parts = view.run(partition_views.drain_statuses(view.layout))
            status = partition_views.merge_drains([d for _, d in parts])
        if args.json:
            print_json({**to_json(status), "partitions": {n: to_json(d) for n, d in parts}} if parts else status)
        else:
            for name, d in ([("", status)] if not parts else [("total", status)] + parts):
                left = None if d.deadline_ms is None else d.deadline_ms - d.server_ms
                print_line(*((name,) if parts else ()), "draining" if d.active else "not_draining",
                           f"executing={d.executing_groups}", f"left={render.duration(left) if d.active else '-'}",
                           f"reason={d.reason or '-'}")
        return EXIT_OK
    confirm(args, f"drain {args.action} {'closes' if args.action == 'start' else 'reopens'} admission")
    q = open_operated(args)
    layout = q.layout
    if args.action == "stop":
        left = sum(q.run(actions.drain_stop(keys)) for keys in layout.keys)
        log_action(args, "drain stopped", "drain_stop", other_holds=left)
        print_line("stopped", f"other_holds={left}", f"admission={'closed' if left else 'open'}")
        if left:  # the drain is gone, but admission is not back: say why, not just a number
            print(f"rollout-queue: the drain is stopped; admission stays closed while {left} other hold(s) stand "
                  "(a trainer publishing weights, or one that expired and awaits the reaper): "
                  "see `rollout-queue stats` or ZRANGE $Q:holds 0 -1 WITHSCORES", file=sys.stderr)
        return EXIT_OK
    started = [q.run(actions.drain_start(keys, args.timeout_s, args.reason)) for keys in layout.keys]
    deadline, executing = min(d for d, _ in started), sum(e for _, e in started)
    log_action(args, "drain started", "drain_start", deadline_ms=deadline, executing_groups=executing,
               reason=args.reason)
    print_line("draining", f"executing={executing}", f"deadline_ms={deadline}")
    if args.wait is not None:
        end = time.monotonic() + args.wait
        for keys in layout.keys:
            if not q.run(actions.wait_drained(keys, max(0.0, end - time.monotonic()), time.monotonic)):
                print(f"rollout-queue: still executing after {args.wait}s; the drain stands", file=sys.stderr)
                return EXIT_FAIL
    return EXIT_OK


# -- acl -----------------------------------------------------------------------------------------


def cmd_acl(args: argparse.Namespace) -> int:
    if not args.queue:
        raise UsageError("no queue: pass --queue or set ROLLOUT_QUEUE")
    passwords = dict(parse_password(p) for p in args.password)
    count = partitions(args)
    if args.apply:
        confirm(args, "acl --apply creates or overwrites these ACL users on the server")
        if given_partitions(args) is None:  # left out: the recorded count (1 for a plain or new queue)
            view = open_view(args)
            c, count = view.client, view.layout.count
        else:
            c = client(args)
    rules = acl.all_rules(args.queue, args.role or acl.ROLE_NAMES, passwords, partitions=count)
    if args.apply:
        # ACL users live on each node: on a cluster, set them on every node (masters and replicas)
        on_all: dict[str, Any] = {"target_nodes": redis.cluster.RedisCluster.ALL_NODES} if isinstance(
            c, redis.cluster.RedisCluster) else {}
        for r in rules:
            c.execute_command("ACL", "SETUSER", r.user, *r.rules, **on_all)
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
    p.add_argument("--json", action="store_true", help="list, show: JSON for scripts (times in ms since the epoch)")
    add_full(p)
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
