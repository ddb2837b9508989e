"""The trainer, operator and crash steps of the ledger machine: leases, commits, plain and errored
rollbacks (a trainer that raised on the data: counted, held apart, dead-lettered at max_attempts),
expiry, reaping, policy versions, admission holds, checkpoints, the trainer contract (TrainingStream
and RankedStream in a world of one rank: restore at any step, 0 included; a resumed trainer next to a
dead predecessor's lease), lost replies and server restarts.

Each step draws its arguments, asks the model what must happen, runs the real call and compares;
the invariants run after it. This module must not check invariants itself (invariants.py does).
"""

from __future__ import annotations

import threading
import time
from functools import partial
from typing import Any, Callable

import pytest
from hypothesis import event
from hypothesis import strategies as st

from rollout_queue import (
    CheckpointPruned,
    CheckpointRegression,
    HoldLost,
    Lease,
    LeaseLost,
    LeasesOpen,
    LeaseUnsatisfiable,
    VersionRegression,
)
from rollout_queue.core.errors import StreamStarved
from rollout_queue.core import flows, protocol
from tests.helpers import wait_until

from .model_entries import EXECUTING
from .steps_base import WORKERS, Steps


class TrainerSteps(Steps):
    """Trainer, operator and crash steps; each takes the example's ``data`` and draws its own arguments."""

    def lease(self, data: st.DataObject) -> None:
        groups = data.draw(st.integers(1, 2), label="groups")
        self.lease_groups(data, groups)

    def errored_pair(self, data: st.DataObject) -> None:
        """Two groups leased together break the trainer (an errored rollback marks both and puts them
        back at the head of the buffer), then the next lease: the two are held apart while another
        group can come (issue 29 item 12)."""
        if self.refused_lease(2, False):
            return
        members = self.model.lease(2, False)
        lease = self.q.lease(2)
        self.check_lease(members, lease)
        if lease is None:
            return
        status, n = self.model.rollback(lease.lease_id, "ValueError: a poison group")
        assert status == "rolled_back" and lease.rollback("ValueError: a poison group") == n
        event("errored rollback of two groups")
        if data.draw(st.sampled_from([True, True, False]), label="a worker reserves first"):
            self.reserve(data)  # an attempt executing: another group can come, so the two are held apart
        self.lease_groups(data, data.draw(st.sampled_from([2, 2, 1, 3]), label="groups"))

    def lease_beside_marked(self, data: st.DataObject) -> None:
        """A lease of several groups while groups marked by errored rollbacks are buffered: at most one
        of them per lease while another group can come (issue 29 item 12, lua/lease.lua)."""
        event("lease beside marked groups")
        self.lease_groups(data, data.draw(st.integers(2, 3), label="groups"))

    def lease_groups(self, data: st.DataObject, groups: int) -> None:
        partial_ok = data.draw(st.booleans(), label="partial")
        if self.refused_lease(groups, partial_ok):
            return
        members = self.model.lease(groups, partial_ok)
        self.check_lease(members, self.q.lease(groups, partial=partial_ok))

    def refused_lease(self, groups: int, partial_ok: bool) -> bool:
        """A lease the bounds can never satisfy is refused at once, writing nothing (issue 12 item 3)."""
        if not self.model.unsatisfiable(groups, partial_ok):
            return False
        event("lease -> unsatisfiable")
        with pytest.raises(LeaseUnsatisfiable) as exc:
            self.unchanged(partial(self.q.lease, groups, partial=partial_ok))
        assert (exc.value.bound, exc.value.limit) == self.model.lease_limit()
        return True

    def check_lease(self, members: list[str] | None, lease: Any) -> None:
        """The lease holds exactly the model's members, pristine and fresh; then the model binds them."""
        if self.model.held_apart:
            event("lease held marked groups apart")
        if members is None:
            assert lease is None, f"the model expected no lease, got {lease!r}"
            event("lease -> none")
            return
        assert lease is not None, f"the model expected a lease of {members}"
        event(f"lease -> {len(members)} groups")
        assert [g.entry_id for g in lease.groups] == members
        assert lease.version == self.model.version
        for g in lease.groups:
            e = self.model.entries[g.entry_id]
            assert g.group == e.group, "a leased group is not the pristine reservation"
            # The group reports its oldest token (the samples'); the queue judged it by e.min_version.
            assert (g.samples, g.attempt, g.min_version) == (e.samples, e.attempt, min(x.version for x in e.samples))
            # A continued sample starts with the record its attempt was handed, tokens and logprobs.
            for prefix in e.continued_from:
                first = next(x for x in g.samples if x.slot == prefix.slot)
                n = len(prefix.token_ids)
                assert (first.token_ids[:n], first.logprobs[:n]) == (prefix.token_ids, prefix.logprobs), (
                    f"{g.entry_id} slot {prefix.slot} does not continue its saved progress")
                event("leased a group continued from progress")
            # Invariant 5: no lease ever holds a group staler than max_staleness, as its mode judges
            # it (its oldest token in 'drop', its samples' newest in 'continue', never in 'pace'; the
            # fairness rule's judged version for a protected one).
            if self.model.mode != "pace":
                assert lease.version - e.min_version <= self.model.staleness_bound, (
                    f"lease {lease.lease_id} holds {g.entry_id} judged at {e.min_version}, policy {lease.version}")
            if e.min_version != g.min_version:
                event(f"leased a group judged apart from its oldest token ({self.model.mode})")
        self.model.leased(lease.lease_id, members, lease)

    def commit(self, data: st.DataObject) -> None:
        record = data.draw(st.sampled_from(self.model.active_leases()), label="lease")
        self.commit_lease(record.lease_id, data.draw(st.booleans(), label="with step"))

    def commit_lease(self, lease_id: str, with_step: bool = False) -> None:
        record = self.model.leases[lease_id]
        step = None
        if with_step:
            self.model.step += 1
            step = self.model.step
        assert self.model.commit(record.lease_id, step) == ("committed", "")
        record.commit_id = record.handle.commit(step=step)
        event("commit with a step" if step is not None else "commit")

    def rollback(self, data: st.DataObject) -> None:
        """Plain (the trainer gave up), or errored: the trainer raised on the data (issue 29 item 12),
        so every member is marked, goes back to the head of the buffer and dies at max_attempts marks."""
        record = data.draw(st.sampled_from(self.model.active_leases()), label="lease")
        reason = data.draw(st.sampled_from([None, "ValueError: nan loss"]), label="reason")
        status, n = self.model.rollback(record.lease_id, reason)
        event("errored rollback" if reason else "rollback")
        assert status == "rolled_back" and record.handle.rollback(reason) == n

    def hostile_claim(self, data: st.DataObject) -> None:
        """A worker credential XCLAIMs a leased member away (issue 29 item 7): to a made-up consumer,
        a worker (at a forged count: a receipt it could settle with), a parking consumer with a forged
        record, or another lease's consumer. Redis then holds the member elsewhere in the PEL, but
        `leased` still names its lease: the lease's own commit or rollback takes it back and settles
        it exactly as the model says, and the invariants (no leftover parked record, nothing owned by a
        consumer the model does not know) hold after it."""
        record = data.draw(st.sampled_from(self.model.active_leases()), label="lease")
        member = data.draw(st.sampled_from(record.members), label="member")
        others = [r.lease_id for r in self.model.active_leases() if r.lease_id != record.lease_id]
        to = data.draw(st.sampled_from(["made-up", "worker", "@dead", "@filtered"] + (["lease"] if others else [])),
                       label="to")
        consumer = {"made-up": "chaos-adversary", "worker": data.draw(st.sampled_from(WORKERS), label="worker"),
                    "@dead": "@dead", "@filtered": "@filtered",
                    "lease": f"@lease:{others[0]}" if others else ""}[to]
        count = data.draw(st.integers(1, 4), label="count")
        assert self.raw.xclaim(self.keys["src"], "rollout", consumer, 0, [member], retrycount=count,
                               justid=True) == [member.encode()]
        if to.startswith("@"):
            self.raw.hset(self.keys["parked"], member, f"{to[1:]}|{count}|chaos-adversary|0|forged")
        event(f"hostile claim of a leased member to {to}")
        if data.draw(st.booleans(), label="then commit"):
            self.commit_lease(record.lease_id)
        else:
            status, n = self.model.rollback(record.lease_id, None)
            assert status == "rolled_back" and record.handle.rollback() == n

    def extend(self, data: st.DataObject) -> None:
        record = data.draw(st.sampled_from(self.model.active_leases()), label="lease")
        old = record.handle.deadline_ms
        # Longer than lease_timeout_s, so the deadline moves on; two extends within one millisecond of
        # the queue clock set the same deadline (now + 900 s), hence >= (seen on a fast valkey run).
        assert record.handle.extend(900) >= old

    def closed_lease_call(self, data: st.DataObject) -> None:
        """Repeating a settled lease's own call replays its answer; anything else raises LeaseLost."""
        record = data.draw(st.sampled_from(self.model.closed_leases()), label="closed lease")
        op = data.draw(st.sampled_from(["commit", "rollback", "extend"]), label="op")
        lease = record.handle
        if op == "commit":
            status, detail = self.model.commit(record.lease_id, None)
            call: Callable[[], Any] = lease.commit
        elif op == "rollback":
            status, detail = self.model.rollback(record.lease_id)
            call = partial(lease.rollback, data.draw(st.sampled_from([None, "late error"]), label="reason"))
        else:
            status, detail, call = "lost", record.state, partial(lease.extend, 60)
        event(f"closed lease {op} -> {status}")
        if status == "lost":
            with pytest.raises(LeaseLost) as exc:
                self.unchanged(call)
            assert exc.value.state == detail
        else:
            assert self.unchanged(call) == detail

    def short_lease_expires(self, data: st.DataObject) -> None:
        """Real time passes a 20 ms lease deadline; the reaper (or the next reserve or lease) rolls
        it back; a commit or extend in between is refused (LeaseLost 'expired') and writes nothing."""
        groups = data.draw(st.integers(1, 2), label="groups")
        partial_ok = data.draw(st.booleans(), label="partial")
        how = data.draw(st.sampled_from(["reap", "commit", "extend", "rollback", "lease"]), label="then")
        if self.refused_lease(groups, partial_ok):
            return
        members = self.model.lease(groups, partial_ok)
        lease = self.q.lease(groups, timeout_s=0.02, partial=partial_ok)
        self.check_lease(members, lease)
        if lease is None:
            return
        wait_until(lambda: self.server_ms() > lease.deadline_ms, timeout=5.0, message="the lease deadline")
        if self.model.in_grace:
            # The server restarted in this example: for two worker timeouts nothing expires (every
            # client gets that long to come back, lua/include/now_ms.lua), so the lease is still good.
            event("short lease past its deadline in an outage's grace")
            self.check_reap(self.model.reap())
            self.commit_lease(lease.lease_id)
            return
        event(f"short lease expired, then {how}")
        if how in ("commit", "extend"):
            call = partial(lease.commit, step=None) if how == "commit" else partial(lease.extend, 60)
            with pytest.raises(LeaseLost) as exc:
                self.unchanged(call)
            assert exc.value.state == "expired"
        if how == "rollback":  # the trainer gives up after the deadline, before the reaper does
            status, n = self.model.rollback(lease.lease_id)
            assert status == "rolled_back" and lease.rollback() == n
        elif how == "lease" and self.model.lease_limit()[1] >= 2:
            self.model.expire(lease.lease_id)  # lease rolls back the earliest expired lease first
            self.lease(data)
        else:
            self.check_reap(self.model.reap(expired=[lease.lease_id]))

    def reap(self, data: st.DataObject) -> None:
        expected = self.model.reap()
        if expected.pruned:
            event("reap pruned settled groups")
        self.check_reap(expected)

    # -- lost replies and crashes ----------------------------------------------------------------

    def lost_reply(self, data: st.DataObject) -> None:
        """A reserve or lease whose reply is lost on the way back: the transport sends the same call
        again (same request id, or lease id and token), and the retry must replay the first answer,
        never grant twice (DESIGN rule 5)."""
        op = data.draw(st.sampled_from(["reserve", "lease"]), label="call")
        if op == "reserve":
            worker = data.draw(st.sampled_from(WORKERS), label="worker")
            max_groups = data.draw(st.integers(1, 3), label="max_groups")
            expected = self.model.reserve(worker, max_groups, reply_lost=True)
            first, got = self.run_losing_first_reply(
                flows.reserve(self.keys, worker, max_groups, 0, 0, self.q.clock))
            assert [(x.entry_id, x.receipt.attempt) for x in got] == expected
            assert [(r.entry_id, r.attempt) for r, _ in protocol.parse_reserve(first, worker).granted] == expected
            self.check_handed(got)  # the replay hands out the records again, dropping none
            event(f"lost reserve reply -> {len(expected)} groups")
            return
        groups = data.draw(st.integers(1, 2), label="groups")
        if self.refused_lease(groups, True):
            return
        members = self.model.lease(groups, True)
        first, got = self.run_losing_first_reply(
            flows.lease(self.keys, "trainer-1", groups, True, None, 0, self.q.clock))
        self.check_lease(members, None if got is None else Lease(self.q, [(0, *got)], self.q.config.lease_timeout_s))
        if got is not None:
            assert [m.entry_id for m in protocol.parse_lease(first, got[0].lease_id).members] == members
        event(f"lost lease reply -> {'none' if members is None else len(members)}")

    def note_outage(self) -> None:
        """A restart ahead: a new run_id makes the queue clock grant every client its grace, if the
        clock had a reading before (a queue whose first timed call comes after the restart has no
        outage to measure, and nothing that could expire)."""
        if self.raw.hexists(self.keys["clock"], "ms"):
            self.model.in_grace = True

    def run_losing_first_reply(self, flow: Any) -> tuple[Any, Any]:
        """Drive ``flow`` but send its first call twice, as after a dropped connection; only the
        second reply reaches the flow. Returns (the lost first reply, the flow's result)."""
        op = next(flow)
        first = self.q.driver.execute(op)
        reply = self.q.driver.execute(op)
        while True:
            try:
                op = flow.send(reply)
            except StopIteration as stop:
                return first, stop.value
            reply = self.q.driver.execute(op)

    def server_restart(self, data: st.DataObject) -> None:
        """kill -9, then restart on the same AOF: the client keeps working (retries, script reload)."""
        # Draw before the kill: a draw can end the example (hypothesis stops a test case that runs
        # out of data), and the next example must not find the server down.
        call_while_down = data.draw(st.booleans(), label="call while down")
        self.restarts += 1
        self.note_outage()
        self.server.kill()
        if not call_while_down:
            self.server.restart()
            return
        failures: list[BaseException] = []

        def bring_back() -> None:
            try:
                self.server.restart()
            except BaseException as exc:  # handed to the main thread, which fails the test with it
                failures.append(exc)

        timer = threading.Timer(0.05, bring_back)
        timer.start()
        try:
            self.q.stats()  # sent while the server is down: the transport retries until it is back
        finally:
            timer.join()
        assert not failures, failures

    # -- policy versions, holds, checkpoints -----------------------------------------------------

    def publish_version(self, data: st.DataObject) -> None:
        m = self.model
        kind = data.draw(st.sampled_from(["next", "next", "jump", "replay", "regression"]), label="version")
        version = {"next": m.version + 1, "jump": m.version + 2, "replay": m.version,
                   "regression": max(0, m.version - 1)}[kind]
        uri = "s3://elsewhere" if kind == "regression" else f"s3://w/{version}"
        hold_id = None
        if m.holds and data.draw(st.booleans(), label="through a hold"):
            hold_id = data.draw(st.sampled_from(sorted(m.holds)), label="hold")
        expected = m.publish(version, uri, hold_id)
        event(f"publish -> {expected}" + (" through a hold" if hold_id else ""))
        call: Callable[[], Any] = partial(self.q.publish_version, version, uri)
        if hold_id is not None:
            call = partial(self.holds[hold_id].record_weight_update, version, uri)
        if expected == "regression":
            with pytest.raises(VersionRegression):
                self.unchanged(call)
        else:
            assert call() == (expected == "published")

    def hold_open(self, data: st.DataObject) -> None:
        hold = self.q.hold()
        assert hold.waiting == self.model.hold_open(hold.hold_id)
        self.holds[hold.hold_id] = hold

    def hold_wait_or_release(self, data: st.DataObject) -> None:
        hold_id = data.draw(st.sampled_from(sorted(self.model.holds)), label="hold")
        if data.draw(st.sampled_from([True, True, False]), label="release"):
            assert self.holds[hold_id].release() == self.model.hold_release(hold_id)
            with pytest.raises(HoldLost):  # a released hold can no longer record a weight update
                self.unchanged(partial(self.holds[hold_id].record_weight_update, self.model.version + 1))
        else:
            assert self.holds[hold_id].wait_terminal(0) == self.model.hold_wait(hold_id)

    def checkpoint(self, data: st.DataObject) -> None:
        # Up to two steps ahead of the trainer: later commits at or below it keep no copy.
        step = data.draw(st.integers(0, self.model.step + 2), label="step")
        expected = self.model.checkpoint_at(step)
        event(f"checkpoint -> {expected if isinstance(expected, str) else 'ok'}")
        if expected == "regression":
            with pytest.raises(CheckpointRegression):
                self.unchanged(partial(self.q.checkpoint, step))
        elif expected == "leases_open":
            with pytest.raises(LeasesOpen):
                self.unchanged(partial(self.q.checkpoint, step))
        else:
            assert self.q.checkpoint(step) == expected

    # -- the trainer contract (integrations/stream.py, ranks.py): issue 29 items 15, 16 ------------

    def trainer_restore(self, data: st.DataObject) -> None:
        """A trainer resumed from checkpoint ``step`` (0: from scratch, or after a crash before its
        first checkpoint) restores through the contract: TrainingStream.restore, or RankedStream.restore
        in a torch.distributed world of one rank; either requeues every group committed after it."""
        from rollout_queue.integrations.ranks import RankedStream
        from rollout_queue.integrations.stream import TrainingStream

        how = data.draw(st.sampled_from(["stream", "ranks"] if self.ranks else ["stream"]), label="through")
        step = data.draw(st.one_of(st.just(0), st.integers(0, self.model.step)), label="step")  # 0 often
        expected = self.model.restore(step)
        event(f"{how} restore({'0' if step == 0 else 'k'}) -> {'pruned' if expected is None else 'ok'}")
        trainer: Any = (TrainingStream(self.q, wait_s=1.0) if how == "stream"
                        else RankedStream(self.q, groups_per_step=1, wait_s=1.0))
        if expected is None:
            with pytest.raises(CheckpointPruned):
                self.unchanged(partial(trainer.restore, step))
        else:
            assert trainer.restore(step) == expected
            self.model.step = step

    def resumed_trainer_next(self, data: st.DataObject) -> None:
        """A trainer resumed with its source exhausted, while another trainer's lease (a dead
        predecessor's) may be out: next() leases what the model leases; otherwise StreamStarved,
        ``exhausted`` only when fewer groups than a batch may still come: queued, executing,
        buffered, and leased by others (they come back at their deadline), not its own open leases."""
        from rollout_queue.integrations.stream import TrainingStream

        m = self.model
        queued = sum(m.count(state) for state in ("backlog", "ready", "executing", "completed"))
        # One more than is queued while others hold leases: only their leased groups can fill it.
        tight = [queued + 1] * 3 if m.active_leases() and queued + 1 <= m.lease_limit()[1] else []
        groups = data.draw(st.sampled_from([1, 2, 3] + tight), label="groups")
        stream = TrainingStream(self.q, groups_per_step=groups, wait_s=0.3, block_ms=50, exhausted=lambda: True,
                                trainer_id="resumed-trainer")
        for _ in range(data.draw(st.integers(1, 2), label="next() calls")):
            if self.model.unsatisfiable(groups, False):
                with pytest.raises(LeaseUnsatisfiable):
                    self.unchanged(stream.next)
                return
            members = self.model.lease(groups, False)
            if members is not None:
                self.check_lease(members, stream.next())
                continue
            own = sum(len(x.groups) for x in stream.open)
            left = sum(m.count(state) for state in ("backlog", "ready", "executing", "completed", "leased")) - own
            with pytest.raises(StreamStarved) as exc:
                stream.next()
            assert exc.value.exhausted == (left < groups), f"{left} groups may still come, {groups} wanted"
            event(f"resumed trainer starved, {'exhausted' if left < groups else 'waiting out others'}")
            return

    def restore(self, data: st.DataObject) -> None:
        step = data.draw(st.integers(0, self.model.step), label="step")
        expected = self.model.restore(step)
        event(f"restore -> {'pruned' if expected is None else expected}")
        if expected is None:
            with pytest.raises(CheckpointPruned):
                self.unchanged(partial(self.q.restore, step))
        else:
            assert self.q.restore(step) == expected
            self.model.step = step  # the trainer resumes from the checkpoint it restored

    # -- issue 12: interrupted operations, outages past the timeouts, liveness ----------------------

    def interrupted_op(self, data: st.DataObject) -> None:
        """A multi-call operation cut short after a few of its calls (the caller died); another
        process finishes it (the reaper, or the caller again). The outcome is the whole operation's."""
        m = self.model
        choices = (["rollback"] * bool(m.active_leases()) + ["close_worker"] * bool(m.in_state(EXECUTING))
                   + ["restore", "checkpoint"] * (m.step > 0))
        if not choices:
            return
        op = data.draw(st.sampled_from(choices), label="interrupted op")
        calls = data.draw(st.integers(1, 3), label="calls before the caller dies")
        finisher = data.draw(st.sampled_from(["reaper", "caller again"]), label="finished by")
        finish: Callable[[], Any]
        if op == "rollback":
            record = data.draw(st.sampled_from(m.active_leases()), label="lease")
            reason = data.draw(st.sampled_from([None, "ValueError: nan loss"]), label="reason")
            # An errored rollback cut short is finished plain by the reaper (the trainer died), errored
            # by the caller again (the record keeps the first call's reason, whatever is resent).
            m.rollback(record.lease_id, reason, batch=1, errored_calls=calls if finisher == "reaper" else None)
            flow = flows.rollback(self.keys, record.lease_id, record.handle.token, reason)
            finish = partial(record.handle.rollback, None)
        elif op == "close_worker":
            worker = data.draw(st.sampled_from(sorted({e.worker or "" for e in m.in_state(EXECUTING)})), label="worker")
            terminal = data.draw(st.sampled_from(["aborted", "lost"]), label="terminal")
            m.close_worker(worker, terminal)
            flow = flows.close_worker(self.keys, worker, terminal, "closing")
            finish = partial(self.q.worker(worker).close, terminal)
        elif op == "restore":
            step = data.draw(st.integers(0, m.step), label="step")
            if m.restore(step) is None:
                return  # refused whole (CheckpointPruned): the restore step covers it
            m.step = step
            flow, finish = flows.restore(self.keys, step), partial(self.q.restore, step)
        else:
            step = data.draw(st.integers(0, m.step + 2), label="step")
            covered = sorted((e for e in m.entries.values() if e.kept_step is not None and e.kept_step <= step),
                             key=lambda e: (e.kept_step, e.entry_id))  # kept's order: score, then member
            if isinstance(m.checkpoint_at(step), str):
                return  # refused whole: the checkpoint step covers it
            flow, finish = flows.checkpoint(self.keys, step), partial(self.q.checkpoint, step)
            if finisher == "reaper":
                # One entry per call: the first `calls` are dropped (and recorded) before the reap
                # pass, the rest by its finish_interrupted, after its prune: not pruned in that pass.
                late = covered[calls:]
                for e in late:
                    e.recorded = False
                saved, flows.BATCH = flows.BATCH, 1
                try:
                    self.run_calls(flow, calls)
                    self.model.reap()
                    self.reap_pass()
                finally:
                    flows.BATCH = saved
                for e in late:
                    e.recorded = m.records
                event(f"{op} interrupted after {calls} call(s), finished by {finisher}")
                return
        event(f"{op} interrupted after {calls} call(s), finished by {finisher}")
        saved, flows.BATCH = flows.BATCH, 1  # one entry per call: every cut point is reachable
        try:
            self.run_calls(flow, calls)
            if finisher == "reaper":
                self.model.reap()  # the pass's other work (stale groups, prune) is the model's too
                self.reap_pass()
            else:
                finish()
        finally:
            flows.BATCH = saved

    def run_calls(self, flow: Any, calls: int) -> None:
        """Send at most ``calls`` of ``flow``'s calls, then drop it (its process died)."""
        reply: Any = None
        for _ in range(calls):
            try:
                op = flow.send(reply)
            except StopIteration:
                return
            reply = self.q.driver.execute(op)
        flow.close()

    def long_outage(self, data: st.DataObject) -> None:
        """Redis is down for longer than a lease's timeout (kill -9, back on the same AOF after it):
        that time does not count, so the lease is still the trainer's and commits (now_ms.lua)."""
        groups = data.draw(st.integers(1, 2), label="groups")
        if self.refused_lease(groups, True):
            return
        members = self.model.lease(groups, True)
        # 2 s: the lease must still be good when Redis goes down, on a loaded machine too (a 0.1 s
        # lease was past its deadline before the kill once the lease call and its first beat took
        # that long: then it rightly expires, and the model said it would not).
        lease = self.q.lease(groups, timeout_s=2.0, partial=True)
        self.check_lease(members, lease)
        self.restarts += 1
        self.note_outage()
        self.server.kill()
        try:
            time.sleep(2.5)  # down past the lease's deadline
        finally:
            self.server.restart()
        event("outage longer than a lease's timeout")
        if lease is not None:
            self.check_reap(self.model.reap())  # nothing expired
            self.commit_lease(lease.lease_id)

    def drain_to_settlement(self, no_reaper: bool, rounds: int = 40) -> None:
        """Liveness: once workers and a trainer keep calling, every group reaches a settlement within
        a bounded number of rounds, with no reaper process (inline reaping only) in part of the runs.
        Runs at the end of an example, through the real client only (the model is done by then)."""
        from rollout_queue import StaleReceipt

        q = self.q
        for hold in list(self.holds.values()):
            hold.release()
        for record in self.model.active_leases():
            try:
                record.handle.commit()
            except LeaseLost:
                pass
        version = q.version
        for r in self.model.executing_receipts():
            try:
                q.worker(r.worker_id).complete(r, self.drain_samples(self.model.entries[r.entry_id].n, version))
            except StaleReceipt:
                pass
        for i in range(rounds):
            s = q.stats()
            if s.backlog + s.ready + s.executing_groups + s.completed + s.leased == 0:
                assert s.partial_records == 0 and s.counters.get("partial_bytes", 0) == 0, (
                    f"progress records left after every group settled: {s.partial_records}")
                event(f"drained in {i} rounds" + (" without a reaper" if no_reaper else ""))
                return
            version = q.version
            for j, worker in enumerate(WORKERS):
                w = q.worker(worker)
                for res in w.reserve(4, max_samples=(0, 2, 1)[j], overcommit=j == 2):
                    w.complete(res.receipt, self.drain_samples(res.group.n, version))
            lease = None
            try:
                lease = q.lease(self.model.cfg.max_completed_groups, partial=True)
            except LeaseUnsatisfiable:
                pass
            if lease is not None:
                lease.commit()
            q.publish_version(version + 1)  # the trainer's next step: admission opens further
            if not no_reaper:
                q.reap()
        s = q.stats()
        raise AssertionError(f"not every group settled within {rounds} rounds (liveness): {s}")

    @staticmethod
    def drain_samples(n: int, version: int) -> list[Any]:
        from rollout_queue import Sample

        return [Sample(slot=i, token_ids=(i, 1), logprobs=(-0.5, -0.5), reward=float(i), version=version)
                for i in range(n)]
