"""The trainer, operator and crash steps of the ledger machine: leases, commits, expiry, reaping,
policy versions, admission holds, checkpoints, lost replies and server restarts.

Each step draws its arguments, asks the model what must happen, runs the real call and compares;
the invariants run after it. This module must not check invariants itself (invariants.py does).
"""

from __future__ import annotations

import threading
from functools import partial
from typing import Any, Callable

import pytest
from hypothesis import event
from hypothesis import strategies as st

from rollout_queue import CheckpointPruned, HoldLost, Lease, LeaseLost, VersionRegression, flows, protocol
from tests.helpers import wait_until

from .steps_base import WORKERS, Steps


class TrainerSteps(Steps):
    """Trainer, operator and crash steps; each takes the example's ``data`` and draws its own arguments."""

    def lease(self, data: st.DataObject) -> None:
        groups = data.draw(st.integers(1, 2), label="groups")
        partial_ok = data.draw(st.booleans(), label="partial")
        members = self.model.lease(groups, partial_ok)
        self.check_lease(members, self.q.lease(groups, partial=partial_ok))

    def check_lease(self, members: list[str] | None, lease: Any) -> None:
        """The lease holds exactly the model's members, pristine and fresh; then the model binds them."""
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
            assert (g.samples, g.attempt, g.min_version) == (e.samples, e.attempt, e.min_version)
            # Invariant 5: no lease ever holds a group staler than max_staleness.
            assert lease.version - g.min_version <= self.model.staleness_bound, (
                f"lease {lease.lease_id} holds {g.entry_id} at version {g.min_version}, policy {lease.version}")
        self.model.leased(lease.lease_id, members, lease)

    def commit(self, data: st.DataObject) -> None:
        record = data.draw(st.sampled_from(self.model.active_leases()), label="lease")
        step = None
        if data.draw(st.booleans(), label="with step"):
            self.model.step += 1
            step = self.model.step
        assert self.model.commit(record.lease_id, step) == ("committed", "")
        record.commit_id = record.handle.commit(step=step)
        event("commit with a step" if step is not None else "commit")

    def rollback(self, data: st.DataObject) -> None:
        record = data.draw(st.sampled_from(self.model.active_leases()), label="lease")
        status, n = self.model.rollback(record.lease_id)
        assert status == "rolled_back" and record.handle.rollback() == n

    def extend(self, data: st.DataObject) -> None:
        record = data.draw(st.sampled_from(self.model.active_leases()), label="lease")
        old = record.handle.deadline_ms
        assert record.handle.extend(900) > old  # longer than lease_timeout_s: the deadline moves on

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
            call = lease.rollback
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
        how = data.draw(st.sampled_from(["reap", "commit", "extend", "rollback", "reserve", "lease"]), label="then")
        members = self.model.lease(groups, partial_ok)
        lease = self.q.lease(groups, timeout_s=0.02, partial=partial_ok)
        self.check_lease(members, lease)
        if lease is None:
            return
        wait_until(lambda: self.server_ms() > lease.deadline_ms, timeout=5.0, message="the lease deadline")
        event(f"short lease expired, then {how}")
        if how in ("commit", "extend"):
            call = partial(lease.commit, step=None) if how == "commit" else partial(lease.extend, 60)
            with pytest.raises(LeaseLost) as exc:
                self.unchanged(call)
            assert exc.value.state == "expired"
        if how == "rollback":  # the trainer gives up after the deadline, before the reaper does
            status, n = self.model.rollback(lease.lease_id)
            assert status == "rolled_back" and lease.rollback() == n
        elif how in ("reserve", "lease"):
            self.model.expire(lease.lease_id)  # both roll back the earliest expired lease first
            getattr(self, how)(data)
        else:
            assert self.reap_pass() == self.model.reap(expired=[lease.lease_id])

    def reap(self, data: st.DataObject) -> None:
        expected = self.model.reap()
        if expected.pruned:
            event("reap pruned settled groups")
        assert self.reap_pass() == expected

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
            event(f"lost reserve reply -> {len(expected)} groups")
            return
        groups = data.draw(st.integers(1, 2), label="groups")
        members = self.model.lease(groups, True)
        first, got = self.run_losing_first_reply(
            flows.lease(self.keys, "trainer-1", groups, True, None, 0, self.q.clock))
        self.check_lease(members, None if got is None else Lease(self.q, *got))
        if got is not None:
            assert [m.entry_id for m in protocol.parse_lease(first, got[0].lease_id).members] == members
        event(f"lost lease reply -> {'none' if members is None else len(members)}")

    def run_losing_first_reply(self, flow: Any) -> tuple[Any, Any]:
        """Drive ``flow`` but send its first call twice, as after a dropped connection; only the
        second reply reaches the flow. Returns (the lost first reply, the flow's result)."""
        op = next(flow)
        first = self.q.transport.execute(op)
        reply = self.q.transport.execute(op)
        while True:
            try:
                op = flow.send(reply)
            except StopIteration as stop:
                return first, stop.value
            reply = self.q.transport.execute(op)

    def server_restart(self, data: st.DataObject) -> None:
        """kill -9, then restart on the same AOF: the client keeps working (retries, script reload)."""
        # Draw before the kill: a draw can end the example (hypothesis stops a test case that runs
        # out of data), and the next example must not find the server down.
        call_while_down = data.draw(st.booleans(), label="call while down")
        self.restarts += 1
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
        assert self.q.checkpoint(step) == self.model.checkpoint_at(step)

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
