"""Who holds what: ``inspect ENTRY_ID``, ``workers``, ``leases``, ``holds``, ``reaped``, ``stragglers``,
``at-risk`` (read-only), and the two commands here that change state: ``requeue ENTRY_ID`` (it ends
exactly one executing attempt) and ``leases rollback LEASE_ID`` (it rolls back exactly one lease)."""

from __future__ import annotations

import argparse
import sys
from typing import Any, Callable

from rollout_queue.ops import acl, actions, partition_views
from rollout_queue.cli import render, top
from rollout_queue.cli.common import (EXIT_OK, PermissionDenied, UsageError, add_full, confirm, is_denied, log_action,
                                     open_operated, open_view, print_json, print_line)


def cmd_inspect(args: argparse.Namespace) -> int:
    view = open_view(args)
    e = view.run(partition_views.entry(view.layout, args.entry_id))
    if args.json:
        print_json(e)
    else:
        render.emit(render.entry_sections(e), full=args.full)
    return EXIT_OK


def _listing(args: argparse.Namespace, flow: Callable[[Any], Any],
             section: Callable[[Any, Any, bool], render.Section],
             concise: Callable[[Any, int, int], list[str]] | None = None) -> int:
    """A read-only listing: the rows as JSON with --json, else one section, given the view, the rows
    and whether the queue is partitioned (a partition column). ``concise``: on a terminal without
    --full, the lines of the rows laid out for (width, height) instead (top's rows)."""
    view = open_view(args)
    rows = view.run(flow(view.layout))
    if args.json:
        print_json(rows)
    elif concise is not None and sys.stdout.isatty() and not args.full and view.layout.count == 1:
        width, height = render.terminal_size()
        sys.stdout.write("\n".join(concise(rows, width, height)) + "\n")
    else:
        render.emit([section(view, rows, view.layout.count > 1)], full=args.full)
    return EXIT_OK


def cmd_workers(args: argparse.Namespace) -> int:
    """Silent workers first; on a terminal as many as fit (`top`'s rows), --full for all of them."""
    return _listing(args, partition_views.workers,
                    lambda _, ws, parted: render.workers_section(ws, limit=10_000, partitioned=parted),
                    lambda ws, width, height: top.worker_lines(ws, height, width, "(--full lists all)"))


def cmd_leases(args: argparse.Namespace) -> int:
    """The nearest due first (a silent holder's lease before its deadline); on a terminal as many as
    fit (`top`'s rows), --full for all. ``leases rollback LEASE_ID``: cmd_lease_rollback."""
    if args.words:
        if args.words[0] != "rollback" or len(args.words) != 2:
            raise UsageError("leases takes no argument (the list), or `rollback LEASE_ID`")
        args.lease_id = args.words[1]
        return cmd_lease_rollback(args)
    return _listing(args, partition_views.leases,
                    lambda _, ls, parted: render.leases_section(ls, limit=10_000, partitioned=parted),
                    lambda ls, width, height: top.lease_lines(ls, height, width, "(--full lists all)"))


def cmd_lease_rollback(args: argparse.Namespace) -> int:
    """Prints ``LEASE_ID<TAB>rolled_back|replay<TAB>groups requeued``. A lease of a dead or stuck trainer
    goes back now instead of at its deadline; the trainer's own commit is then refused (LeaseLost).
    Refusals exit 5 (committed or expired), 4 (no such lease), 6 with the role that may do it."""
    if not args.lease_id:
        raise UsageError("leases rollback takes the lease id (the LEASE column of `rollout-queue leases`)")
    confirm(args, f"leases rollback {args.lease_id} hands its groups back to be generated again")
    try:
        q = open_operated(args)
        layout = q.layout
        index, (word, groups) = q.run(partition_views.locate(
            layout, args.lease_id, "lease", lambda keys, ident: actions.revoke_lease(keys, ident, args.reason)))
    except Exception as exc:
        if not is_denied(exc):
            raise
        raise PermissionDenied(
            f"leases rollback runs revoke_lease.lua, which only the {' or '.join(acl.roles_running('revoke_lease'))} "
            f"role may run; this user's ACL role may not (it is refused by Redis: {exc}). Run it with an admin "
            "user's --url (`rollout-queue acl` prints the roles)") from exc
    lease_id = partition_views.split_ref(layout, args.lease_id)[1]
    log_action(args, "rolled back lease", "lease_rollback", lease_id=lease_id, outcome=word, groups=groups,
               reason=args.reason, **({"partition": layout.names[index]} if layout.count > 1 else {}))
    print_line(partition_views.qualified(layout, layout.names[index], lease_id), word, groups)
    return EXIT_OK


def cmd_holds(args: argparse.Namespace) -> int:
    """Who holds admission: each standing hold's holder, since when, why, and its deadline."""
    return _listing(args, partition_views.holds, lambda _, hs, parted: render.holds_section(hs, partitioned=parted))


def cmd_reaped(args: argparse.Namespace) -> int:
    """Workers the queue gave up on, newest first: when, why, what they held (the `reaped` stream)."""
    if args.count < 1:
        raise UsageError(f"--count must be >= 1, got {args.count}")
    return _listing(args, lambda layout: partition_views.reaped(layout, args.count),
                    lambda _, rs, parted: render.reaped_section(rs, partitioned=parted))


def _bounded_listing(args: argparse.Namespace, option: str, key: str, flow: Callable[[Any, int], Any],
                     section: Callable[..., render.Section]) -> int:
    """A read-only listing bounded by the positive ``--<option>``: ``{key: rows, "truncated": ...}``
    with --json, else one section (with a partition column on a partitioned queue)."""
    bound = getattr(args, option)
    if bound < 1:
        raise UsageError(f"--{option} must be >= 1, got {bound}")
    view = open_view(args)
    rows, truncated = view.run(flow(view.layout, bound))
    if args.json:
        print_json({key: rows, "truncated": truncated})
    else:
        render.emit([section(rows, truncated, partitioned=view.layout.count > 1)], full=args.full)
    return EXIT_OK


def cmd_stragglers(args: argparse.Namespace) -> int:
    """The oldest executing attempts, oldest first (``ENTRY WORKER AGE ATTEMPT`` rows, or --json)."""
    return _bounded_listing(args, "count", "attempts", partition_views.stragglers, render.stragglers_section)


def cmd_at_risk(args: argparse.Namespace) -> int:
    """Entries that at most --within more counted failures send to the dead-letter queue."""
    return _bounded_listing(args, "within", "entries", partition_views.at_risk, render.at_risk_section)


def cmd_requeue(args: argparse.Namespace) -> int:
    """Prints ``ENTRY_ID<TAB>outcome`` (ready, dead, replay, already_ready). Refusals exit 5."""
    confirm(args, f"requeue {args.entry_id} ends its executing attempt")
    q = open_operated(args)
    layout = q.layout
    # On a partitioned queue: the partition the ID names (partition/id), else the one it is found in.
    index, entry_id = partition_views.split_ref(layout, args.entry_id)
    if index is None:
        index = layout.names.index(q.run(partition_views.entry(layout, args.entry_id)).partition)
    receipt, outcome = q.run(actions.requeue(layout.keys[index], entry_id, force=args.force, counted=args.counted,
                                             reason=args.reason))
    if receipt is not None:
        log_action(args, "requeued entry", "requeue", entry_id=entry_id, attempt=receipt.attempt,
                   worker_id=receipt.worker_id, force=args.force, outcome=outcome,
                   **({"partition": layout.names[index]} if layout.count > 1 else {}))
    print_line(partition_views.qualified(layout, layout.names[index], entry_id), outcome)
    return EXIT_OK


def register(sub: Any) -> None:
    p = sub.add_parser("inspect", help="one entry: state, owner, attempts with reasons, versions, pristine group")
    p.add_argument("entry_id", help="the entry's stream ID, e.g. 1717171717171-0; on a partitioned queue "
                   "looked up in every partition, or named as PARTITION/ID (q#3/1717171717171-0 or 3/...)")
    p.add_argument("--json", action="store_true")
    add_full(p)
    p.set_defaults(func=cmd_inspect)

    p = sub.add_parser("workers", help="workers: last heartbeat, executing groups, oldest attempt, groups/s, tokens/s")
    p.add_argument("--json", action="store_true")
    add_full(p)
    p.set_defaults(func=cmd_workers)

    p = sub.add_parser("leases", help="active leases: trainers, holders' last beats, deadlines; "
                       "`leases rollback LEASE_ID --yes` rolls one back (admin role)",
                       description="Lists the active leases. `leases rollback LEASE_ID --yes` rolls one back by its "
                                   "id (its holder is dead or stuck): its groups go back to ready, not counted, and "
                                   "the holder's commit is refused. Needs the admin role.")
    # One positional list, not two optional positionals: `leases X` with X no action would otherwise
    # be read as an invalid action (argparse fills optional positionals left to right).
    p.add_argument("words", nargs="*", metavar="rollback LEASE_ID", help="roll back the lease LEASE_ID "
                   "(PARTITION/ID on a partitioned queue, or the bare ID, looked up in every partition)")
    p.add_argument("--reason", default="rolled back by operator", help="with rollback: kept in the lease record")
    p.add_argument("--yes", action="store_true", help="confirm a rollback")
    p.add_argument("--json", action="store_true")
    add_full(p)
    p.set_defaults(func=cmd_leases)

    p = sub.add_parser("stragglers", help="the oldest executing attempts: entry, worker, age, attempt")
    p.add_argument("--count", type=int, default=20, help="how many (default 20)")
    p.add_argument("--json", action="store_true")
    add_full(p)
    p.set_defaults(func=cmd_stragglers)

    p = sub.add_parser("at-risk", help="entries one counted failure (or --within N) from the dead-letter queue")
    p.add_argument("--within", type=int, default=1, help="counted failures left at most (default 1)")
    p.add_argument("--json", action="store_true")
    add_full(p)
    p.set_defaults(func=cmd_at_risk)

    p = sub.add_parser("holds", help="who holds admission: holder, since when, why, deadline")
    p.add_argument("--json", action="store_true")
    add_full(p)
    p.set_defaults(func=cmd_holds)

    p = sub.add_parser("reaped", help="workers the queue gave up on: when, why, what they held")
    p.add_argument("--count", type=int, default=20, help="how many of the newest (default 20)")
    p.add_argument("--json", action="store_true")
    add_full(p)
    p.set_defaults(func=cmd_reaped)

    p = sub.add_parser("requeue", help="end one entry's executing attempt and put the entry back to ready",
                       description="Safe by default: acts only when the owning worker is silent past "
                                   "worker_timeout (terminal lost, as the reaper would). --force ends the attempt "
                                   "of a live worker (terminal aborted, or failed with --counted); either way the "
                                   "exact receipt is fenced, so that worker's late result is refused.")
    p.add_argument("entry_id")
    p.add_argument("--force", action="store_true", help="also when the worker still heartbeats (a stuck engine)")
    p.add_argument("--counted", action="store_true",
                   help="with --force: count the attempt toward max_attempts (a prompt that hangs engines)")
    p.add_argument("--reason", default="requeued by operator", help="kept in the attempt history")
    p.add_argument("--yes", action="store_true", help="confirm")
    p.set_defaults(func=cmd_requeue)
