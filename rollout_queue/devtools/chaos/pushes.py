"""Weight pushes in a chaos run: the pusher role (rank 0) and the push-fault role (members that misbehave).

The pusher publishes a version every ``--publish-interval-s``: every ``--push-every``-th one first
over a torch.distributed push (``weights/push.py`` ``WeightPush``, gloo, the queue as rendezvous) to
the shipped workers that join, then, like every version, recorded through an admission hold
(``roles.weight_update``). It is the run's only publisher when it runs (trainer 0 then publishes
nothing: two publishers would race for the same next version). Each push is logged with its rounds
(epoch, outcome, seconds, members, acked, unreached), which the checker holds to the round deadline.

The push-fault role is the faults a member can be: a live worker (it heartbeats, it owns nothing)
that joins some rounds and cannot reach the trainer (it connects where nothing listens), so the
round fails at its deadline and its retry must leave it out; and a worker id that never heartbeat
trying to join (``--invented-rate``), which the queue must refuse (WorkerNotLive). Members killed or
stopped mid-round are the nemesis's (``push_member_kill``, ``push_member_pause``).

Both import torch, which is why they live here and not in roles.py: the test-engine workers never
pay for it.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import random
import secrets
import socket
import threading
from typing import Any

import redis

from rollout_queue.devtools.chaos.oplog import OpLog


def dead_address() -> str:
    """A loopback address where nothing listens (a member's network that cannot reach the trainer)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{s.getsockname()[1]}"


def _rounds(report: Any) -> list[dict[str, Any]]:
    return [{"epoch": r.epoch, "outcome": r.outcome, "seconds": round(r.seconds, 3), "members": sorted(r.members),
             "acked": list(r.acked), "unreached": list(r.unreached), "error": r.error} for r in report.rounds]


def run_pusher(args: argparse.Namespace) -> int:
    from rollout_queue.devtools.chaos import roles

    log = OpLog(args.log, "pusher")
    stop = roles.stop_event()

    def body() -> None:
        import torch

        from rollout_queue.weights.push import WeightPush

        q = roles.connect(args, f"chaos-pusher:{os.getpid()}|work")
        push = WeightPush(q, join_s=args.push_join_s, deadline_s=args.push_deadline_s, expect=args.push_expect,
                          retries=1, host="127.0.0.1")
        log.write("start", addr=push.addr, join_s=args.push_join_s, deadline_s=args.push_deadline_s,
                  expect=args.push_expect)
        state = {"w": torch.zeros(args.push_floats)}
        count = 0
        while not stop.wait(args.publish_interval_s):
            count += 1
            version = q.version + 1
            if args.push_every > 0 and count % args.push_every == 0:
                state["w"].fill_(float(version))
                uri = roles.weights_uri(version)
                log.write("push_invoke", version=version, uri=uri, deadline_s=args.push_deadline_s)
                report = push.push(state, version, uri)
                log.write("push_ok", version=version, rounds=_rounds(report), acked=list(report.acked),
                          dropped=list(report.dropped))
            roles.weight_update(q, log, version)

    return roles.guarded(log, body)


def run_pushfault(args: argparse.Namespace) -> int:
    from rollout_queue.core.errors import WorkerNotLive
    from rollout_queue.devtools.chaos import roles

    ghost_id = f"chaos-ghost:{os.getpid()}:{secrets.token_hex(2)}"
    log = OpLog(args.log, "pushfault", worker=ghost_id)
    stop = roles.stop_event()
    rng = random.Random(f"{args.seed}:{ghost_id}")
    beat = roles.HeartbeatThread(args, ghost_id, log)

    def unreachable(ticket: Any) -> None:
        from rollout_queue.core.errors import WeightsError
        from rollout_queue.weights.push import receive

        try:
            receive(dataclasses.replace(ticket, addr=dead_address()))
            log.write("push_unreachable_received", epoch=ticket.epoch)  # impossible: nothing listens there
        except WeightsError as exc:
            log.write("push_unreachable_failed", epoch=ticket.epoch, error=str(exc)[:300])

    def invented(q: Any, epoch: int) -> None:
        wid = f"chaos-invented:{secrets.token_hex(4)}"
        log.write("push_invented_invoke", worker=wid, epoch=epoch)
        try:
            ticket = q.worker(wid).join_push(epoch)
        except WorkerNotLive:
            log.write("push_invented_refused", worker=wid, epoch=epoch)
            return
        if ticket is None:
            log.write("push_invented_closed", worker=wid, epoch=epoch)  # the round was no longer joinable
        else:
            log.write("push_invented_joined", worker=wid, epoch=ticket.epoch, rank=ticket.rank)

    def body() -> None:
        import torch.distributed  # noqa: F401  # before the first round: a member is on time

        q = roles.connect(args, f"{ghost_id}|work")
        ghost = q.worker(ghost_id)
        ghost.heartbeat()
        beat.start()
        log.write("start")
        seen = 0
        threads: list[threading.Thread] = []
        while not stop.wait(0.05):
            try:  # read only: is a round open? (a raw read: no retry policy, so Redis restarting is skipped)
                raw = q.client.hmget(q.keys["push"], "epoch", "state", "version")
            except redis.RedisError:
                continue
            epoch = int(raw[0] or 0)
            if epoch <= seen or raw[1] != b"open":
                continue
            seen = epoch
            log.write("push_round_seen", epoch=epoch, version=int(raw[2] or 0))
            if rng.random() < args.invented_rate:
                invented(q, epoch)
            if rng.random() < args.unreachable_rate:
                ticket = ghost.join_push(epoch)
                if ticket is not None:
                    log.write("push_unreachable_joined", epoch=ticket.epoch, rank=ticket.rank)
                    thread = threading.Thread(target=unreachable, args=(ticket,), daemon=True)
                    thread.start()
                    threads.append(thread)
        # A receive still connecting when the interpreter exits aborts the process (std::terminate in
        # torch's store client, exit -6): let each end at its round's deadline first.
        for thread in threads:
            thread.join(timeout=args.push_deadline_s + 2)
        beat.halt.set()
        beat.join(timeout=5)
        ghost.close()

    return roles.guarded(log, body)


# -- the checker's push rules ---------------------------------------------------------------------

#: A round may end this long after its deadline: its acks are read (up to 1 s after a failed
#: broadcast) and push_close is one more call, after the deadline the members gave up on.
ROUND_SLACK_S = 2.5


def check_pushes(c: Any) -> None:
    """The push rules (``Checker.check_pushes``): every round ends by its deadline (plus
    ROUND_SLACK_S and any Redis downtime in it); a push the pusher began returns unless its process
    died; an id that never heartbeat never joins; a member that never reached the trainer is not in
    the retry round; no worker applies a version no publisher asked the queue to record, nor goes
    back to an older one; and every shipped worker alive at the end ends on the last recorded version."""
    from rollout_queue.devtools.chaos.checker import _up_s

    h, r = c.h, c.report
    stats: dict[str, Any] = {"pushes": len(h.by_op["push_ok"]), "rounds": {}, "received": len(h.by_op["push_received"]),
                             "missed": len(h.by_op["push_missed"]),
                             "invented_refused": len(h.by_op["push_invented_refused"]),
                             "unreachable_joined": len(h.by_op["push_unreachable_joined"])}
    for rec in h.by_op["push_ok"]:
        invoke = max((i for i in h.by_op["push_invoke"] if i["pid"] == rec["pid"] and i["t"] <= rec["t"]),
                     key=lambda i: i["t"], default={"t": rec["t"], "deadline_s": 0})
        down = (rec["t"] - invoke["t"]) - _up_s(c.down, invoke["t"], rec["t"])
        left_out: set[str] = set()
        for rnd in rec["rounds"]:
            stats["rounds"][rnd["outcome"]] = stats["rounds"].get(rnd["outcome"], 0) + 1
            if rnd["seconds"] > float(invoke.get("deadline_s") or 0) + ROUND_SLACK_S + down:
                r.violate(f"push round {rnd['epoch']} of version {rec['version']} took {rnd['seconds']} s, past its "
                          f"{invoke.get('deadline_s')} s deadline ({rnd['outcome']}: {rnd['error']})")
            back = left_out & set(rnd["members"])
            if back:
                r.violate(f"push round {rnd['epoch']} of version {rec['version']} admitted {sorted(back)}, which never "
                          "reached the trainer in its earlier round")
            left_out |= set(rnd["unreached"])
    ended = {(rec["pid"], rec["version"]) for rec in h.by_op["push_ok"]}
    dead = {x["child"] for x in h.by_op["signal"] if x.get("sig") == "SIGKILL"} | {
        x["pid"] for x in h.ops("exit_unknown", "crash")}
    for rec in h.by_op["push_invoke"]:
        if (rec["pid"], rec["version"]) not in ended and rec["pid"] not in dead:
            r.violate(f"the push of version {rec['version']} began at {rec['t']:.3f} and never returned")
    for rec in h.by_op["push_invented_joined"]:
        r.violate(f"an id that never heartbeat ({rec['worker']}) joined push round {rec['epoch']} as rank "
                  f"{rec['rank']}: only live workers may take a rank")
    _check_versions(c, stats)
    r.pushes = stats


def _check_versions(c: Any, stats: dict[str, Any]) -> None:
    h, r = c.h, c.report
    recorded = {(rec["version"], rec["uri"]) for rec in h.by_op["publish_record"]}
    pushed = {rec["version"] for rec in h.by_op["push_invoke"]}
    last: dict[int, int] = {}  # pid -> the newest version it applied (or started on)
    for rec in sorted(h.ops("start", "weights_applied", "push_received"), key=lambda x: x["t"]):
        if rec.get("role") != "traj" or rec.get("version") is None:
            continue
        version = int(rec["version"])
        if rec["op"] == "push_received":
            if version not in pushed:
                r.violate(f"worker {rec['worker']} received version {version} by a push no pusher made")
            continue
        if rec["op"] == "weights_applied" and version and (version, rec.get("uri")) not in recorded:
            r.violate(f"worker {rec['worker']} applied version {version} ({rec.get('uri')}), which no publisher "
                      "asked the queue to record")
        if version < last.get(rec["pid"], 0):
            r.violate(f"worker {rec['worker']} went back from version {last[rec['pid']]} to {version}")
        last[rec["pid"]] = max(version, last.get(rec["pid"], 0))
    for final in h.by_op["final_version"]:
        stats["final_version"] = final["version"]
        behind = {pid: last.get(pid, 0) for pid in final["live"] if last.get(pid, 0) != final["version"]}
        for pid, version in behind.items():
            r.violate(f"shipped worker pid {pid}, alive at the end, is on version {version}; the queue recorded "
                      f"{final['version']} (waited {final.get('waited_s')} s)")
