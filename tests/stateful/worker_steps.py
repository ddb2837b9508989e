"""The producer and worker steps of the ledger machine: submit, reserve, settle, lose workers.

Each step draws its arguments, asks the model what must happen, runs the real call and compares;
the invariants run after it. This module must not check invariants itself (invariants.py does).
"""

from __future__ import annotations

from functools import partial
from typing import Any, Callable

import pytest
from hypothesis import event
from hypothesis import strategies as st

from rollout_queue import MalformedCompletion, PayloadTooLarge, Receipt, Sample, SourceGroup, StaleReceipt, Turn
from rollout_queue.core import flows, protocol
from rollout_queue.core.codec import encode_partial
from rollout_queue.core.errors import GroupTooLarge, PartialTooLarge

from .model_entries import DEAD
from .steps_base import WORKERS, Steps

SOURCES = tuple(f"p-{i}" for i in range(10))  # a small pool, so duplicate source_ids are common
LOGPROBS = (-0.5, -0.25, -1.0)                # exact in float32: samples round-trip bit for bit
PAYLOAD_LIMIT = 4096                          # the queue's max_payload_bytes (ledger_machine.py)
#: How a drawn completion is shaped: mostly valid, sometimes malformed or over max_payload_bytes.
COMPLETION_SHAPES = st.sampled_from(["ok"] * 6 + ["missing_slot", "bad_slot", "too_large"])
#: The model's outcome -> what the client raises for it (a complete_many item carries it as its
#: value instead). Every other outcome is the call's return value.
RAISES: dict[str, type[Exception]] = {"too_large": PayloadTooLarge, "stale": StaleReceipt,
                                      "malformed": MalformedCompletion}
#: Outcomes that must leave every key of the queue as it was: refused before or by the script, or replayed.
WRITES_NOTHING = frozenset({"too_large", "stale", "replay"})


def check_outcome(outcome: Any, want: str, detail: str = "", where: str = "") -> None:
    """``outcome`` (a return value, or the exception raised) is what the model predicted: ``want``,
    and for a malformed completion the state its group was requeued to (``detail``; a replay of
    one answers the original error, whose state the model no longer knows)."""
    kind = RAISES.get(want)
    if kind is None:
        assert outcome == want, f"{where}{outcome!r}, model {want}"
        return
    assert isinstance(outcome, kind), f"{where}{outcome!r}, model {want}"
    if want == "malformed" and detail != "replay":
        assert outcome.requeued_to == detail, f"{where}the group went {detail}, the error says otherwise"


class WorkerSteps(Steps):
    """Producer and worker steps; each takes the example's ``data`` and draws its own arguments."""

    def submit(self, data: st.DataObject) -> None:
        """A batch of source groups, often naming a source_id already submitted (stored once). The
        payload varies (unicode, token ids) so that every later pristine-copy check means something."""
        groups = []
        for i in range(data.draw(st.integers(1, 3), label="groups")):
            tokens = (1, 2, i) if data.draw(st.booleans(), label="prompt_token_ids") else None
            groups.append(SourceGroup(source_id=data.draw(st.sampled_from(SOURCES), label="source_id"),
                                      prompt=f"prompt {i} \u00e9\U0001f600", n=data.draw(st.integers(1, 3), label="n"),
                                      metadata={"i": i, "tags": ["a", "b"]}, prompt_token_ids=tokens))
        if any(g.n > self.model.cfg.max_executing_samples for g in groups):
            with pytest.raises(GroupTooLarge):  # could never run (issue 12 item 9): refused whole, nothing sent
                self.unchanged(partial(self.q.submit, groups))
            return
        if data.draw(st.sampled_from([False] * 9 + [True]), label="one group too large"):
            groups.append(SourceGroup(source_id="p-huge", prompt="x" * PAYLOAD_LIMIT, n=1))
            with pytest.raises(PayloadTooLarge):  # refused whole, before anything is sent
                self.unchanged(partial(self.q.submit, groups))
            return
        self.model.submitted(groups, self.q.submit(groups))

    def reserve(self, data: st.DataObject, worker: str | None = None) -> None:
        worker = worker or data.draw(st.sampled_from(WORKERS), label="worker")
        max_groups = data.draw(st.integers(1, 3), label="max_groups")
        max_samples = data.draw(st.sampled_from([0, 0, 0, 1, 2, 4]), label="max_samples")
        overcommit = max_samples > 0 and data.draw(st.booleans(), label="overcommit")
        stale_before = self.model.counters["partial_stale"]
        expected = self.model.reserve(worker, max_groups, max_samples, overcommit=overcommit)
        if self.model.counters["partial_stale"] > stale_before:
            event("reserve dropped a progress record already past the staleness bound")
        got = self.q.worker(worker).reserve(max_groups, max_samples=max_samples, overcommit=overcommit)
        event(f"reserve -> {len(expected)} groups ({self.model.last_reserve})")
        assert [(x.entry_id, x.receipt.attempt) for x in got] == expected
        self.check_handed(got)
        for x in got:
            assert x.group == self.model.entries[x.entry_id].group, "an attempt did not see the pristine group"
            assert x.version == self.model.version and x.receipt.worker_id == worker

    def check_handed(self, got: list[Any]) -> None:
        """Each grant carries exactly the progress record the model says its entry kept (and did not
        drop as already stale): what an earlier attempt saved, slot by slot, bit for bit."""
        for x in got:
            handed = self.model.entries[x.entry_id].handed
            assert x.progress == handed, f"{x.entry_id} was handed {x.progress}, the model saved {handed}"
            if handed:
                event("reserve handed progress to the next attempt")
    def settle_attempt(self, data: st.DataObject) -> None:
        receipt = data.draw(st.sampled_from(self.model.executing_receipts()), label="receipt")
        op = data.draw(st.sampled_from(["complete"] * 5 + ["complete_many"] * 2 + ["fail", "abort", "abort", "filter"]),
                       label="op")
        if op == "complete_many":
            self.complete_batch(data, receipt)
        else:
            self.settle(op, receipt, data)

    def complete_batch(self, data: st.DataObject, first: Receipt) -> None:
        """One worker's completions in one complete_many: its executing attempts, sometimes a receipt
        whose attempt is over, sometimes one receipt twice. Each item must answer what its own
        complete would (the model settles them in order); sometimes the reply is lost and the
        transport sends the call again, which must replay and write nothing more."""
        worker = first.worker_id
        pool = [r for r in self.model.executing_receipts() + self.model.old_receipts() if r.worker_id == worker]
        receipts = [first] + data.draw(st.lists(st.sampled_from(pool), max_size=3), label="more receipts")
        items: list[tuple[Receipt, list[Sample]]] = []
        shapes = []
        for r in receipts:
            shape = data.draw(COMPLETION_SHAPES, label="completion")
            items.append((r, self.samples_for(data, self.model.entries[r.entry_id].n, shape, r)))
            shapes.append(shape)
        lose_reply = data.draw(st.booleans(), label="reply lost") and any(s != "too_large" for s in shapes)
        expected = [("too_large", "") if shape == "too_large" else self.model.complete(r, samples)
                    for (r, samples), shape in zip(items, shapes)]
        event(f"complete_many of {len(items)} -> {sorted(e for e, _ in expected)}" + (" (reply lost)" * lose_reply))
        flow = flows.complete_many(self.keys, worker, items, PAYLOAD_LIMIT)
        if lose_reply:
            first_reply, got = self.run_losing_first_reply(flow)
            sent = [r for (r, _), shape in zip(items, shapes) if shape != "too_large"]
            answered = iter(protocol.parse_complete_many(first_reply, sent))
            self.check_batch([next(answered) if s != "too_large" else o for o, s in zip(got, shapes)], expected)
            # The resend writes nothing, so each item answers what its complete would answer now: a
            # settled completion replays unless a later item of the batch settled the same entry on a
            # newer attempt (the ledger keeps an entry's last terminal only: the older receipt is stale).
            self.check_batch(got, [e if e[0] == "too_large" else self.model.complete(r, samples)
                                   for e, (r, samples) in zip(expected, items)])
        elif all(e in ("stale", "replay", "too_large") for e, _ in expected):
            self.check_batch(self.unchanged(partial(self.q.run, flow)), expected)
        else:
            self.check_batch(self.q.run(flow), expected)

    @staticmethod
    def check_batch(got: list[Any], expected: list[tuple[str, str]]) -> None:
        assert len(got) == len(expected)
        for i, (outcome, (want, detail)) in enumerate(zip(got, expected)):
            check_outcome(outcome, want, detail, f"item {i}: ")

    def check_call(self, call: Callable[[], Any], want: str, detail: str = "",
                   too_large: type[Exception] = PayloadTooLarge) -> None:
        """Run one call the model predicted ``want`` for: its return value or the exception it raised
        (``too_large``: the exact PayloadTooLarge expected) must match, and a call in WRITES_NOTHING
        must leave every key as it was."""
        run = partial(self.unchanged, call) if want in WRITES_NOTHING else call
        kind = too_large if want == "too_large" else RAISES.get(want)
        if kind is None:
            check_outcome(run(), want, detail)
            return
        with pytest.raises(kind) as raised:
            run()
        check_outcome(raised.value, want, detail)

    def late_settlement(self, data: st.DataObject) -> None:
        """A paused worker wakes up with a receipt whose attempt is over: StaleReceipt (or, for the
        very settlement that ended it, an idempotent replay), and nothing changes."""
        receipt = data.draw(st.sampled_from(self.model.old_receipts()), label="old receipt")
        self.settle(data.draw(st.sampled_from(["complete", "fail", "abort", "filter"]), label="op"), receipt, data)

    def settle(self, op: str, receipt: Receipt, data: st.DataObject) -> None:
        """Run one settlement with ``receipt`` and compare it with the model's prediction."""
        w = self.q.worker(receipt.worker_id)
        detail = ""  # complete's second answer: the evicted entry, or where a malformed attempt went
        if op == "complete":
            shape = data.draw(COMPLETION_SHAPES, label="completion")
            samples = self.samples_for(data, self.model.entries[receipt.entry_id].n, shape, receipt)
            expected, detail = ("too_large", "") if shape == "too_large" else self.model.complete(receipt, samples)
            call: Callable[[], Any] = partial(w.complete, receipt, samples)
        elif op == "fail":
            expected, call = self.model.fail(receipt), partial(w.fail, receipt, "engine error")
        elif op == "abort" and data.draw(st.sampled_from([True, True, False]), label="abort with progress"):
            self.abort_with_progress(receipt, data)
            return
        elif op == "abort":
            thrown = data.draw(st.integers(0, 9), label="aborted tokens")  # token accounting's conservation
            expected, call = self.model.abort(receipt), partial(w.abort, receipt, "weight update", discarded=thrown)
        else:
            reason = data.draw(st.sampled_from(["all_equal", "too_long"]), label="filter reason")
            tokens = data.draw(st.integers(0, 9), label="filtered tokens")  # token accounting's conservation
            expected, call = self.model.filter(receipt, reason), partial(w.filter, receipt, reason, tokens)
        event(f"{op} -> {expected}" + (" (overflow eviction)" if expected == "buffered" and detail else ""))
        self.check_call(call, expected, detail)  # too_large: refused before the script, still executing

    def samples_for(self, data: st.DataObject, n: int, shape: str, receipt: Receipt | None = None) -> list[Sample]:
        """A completion; an executing attempt handed progress continues it: the first output of each
        handed slot is the saved prefix plus new tokens (the prefix's logprobs and segments kept)."""
        v = self.model.version
        slots = list(range(n))
        if shape == "missing_slot":
            slots.remove(data.draw(st.sampled_from(slots), label="missing slot"))
        handed = self.handed_to(receipt)
        # Sometimes every output started the same versions behind and ended at the current version
        # (a long rollout that spanned updates): stale by its oldest tokens, fresh by its newest, what
        # tells the staleness modes apart and, completed again and again, meets the fairness rule.
        spanned = data.draw(st.sampled_from([0, 0, 0, 1, 2]), label="every output spanned updates from") if v else 0
        out = []
        for slot in slots:
            for j in range(data.draw(st.integers(1, 2), label=f"outputs of slot {slot}")):
                if j == 0 and slot in handed:
                    new = data.draw(st.integers(1, 3), label="new tokens")
                    out.append(self.continue_sample(handed[slot], slot, new, "stop"))
                    continue
                # Mostly the current policy; sometimes one or two versions behind (maybe stale).
                version = max(0, v - (spanned or data.draw(st.sampled_from([0, 0, 0, 1, 2]), label="versions behind")))
                # Some outputs are trajectories: a model turn, an observation, a model turn one version on.
                turns = ((Turn("model", 1, version), Turn("observation", 1), Turn("model", 1, v))
                         if data.draw(st.booleans(), label="trajectory") else ())
                # Some single-turn outputs spanned an update: their last token at the current version
                # (what staleness_mode 'continue' judges them by).
                segments = (((0, version), (2, v)) if not turns and version < v
                            and (spanned or data.draw(st.booleans(), label="spanned an update")) else ())
                out.append(Sample(slot=slot, token_ids=(slot, j, 7), logprobs=LOGPROBS, reward=float(j),
                                  version=version, turns=turns, metadata={"steps": j} if turns else None,
                                  segments=segments))
        if shape == "bad_slot":
            out.append(Sample(slot=n, token_ids=(1,), logprobs=(-0.5,), version=v))
        if shape == "too_large":
            out.append(Sample(slot=0, token_ids=(5,) * PAYLOAD_LIMIT, version=v))
        return out

    def close_worker(self, data: st.DataObject) -> None:
        worker = data.draw(st.sampled_from(WORKERS), label="worker")
        terminal = data.draw(st.sampled_from(["aborted", "lost"]), label="terminal")
        assert self.q.worker(worker).close(terminal=terminal) == self.model.close_worker(worker, terminal)

    def worker_goes_silent(self, data: st.DataObject) -> None:
        """The worker's last heartbeat moves past worker_timeout: the reaper, or the next reserve or
        lease (which reap the oldest silent worker first), requeues its work as lost (counted)."""
        worker = data.draw(st.sampled_from(sorted(self.model.workers)), label="silent worker")
        how = data.draw(st.sampled_from(["reap", "reserve", "lease"]), label="noticed by")
        past = self.server_ms() - 2 * int(self.model.cfg.worker_timeout_s * 1000)
        self.raw.zadd(self.keys["workers"], {worker: past})
        event(f"silent worker noticed by {how}")
        if how == "reap":
            self.check_reap(self.model.reap(silent=[worker]))
            return
        if how == "lease" and self.model.lease_limit()[1] < 2:
            how = "reserve"  # a lease the bounds refuse at once (LeaseUnsatisfiable) reaps nothing
        self.model.close_worker(worker, "lost")
        if how == "reserve":  # another worker: reserving refreshes the reserver's own heartbeat
            self.reserve(data, worker=data.draw(st.sampled_from([w for w in WORKERS if w != worker]), label="worker"))
        else:
            self.lease(data)

    def heartbeat(self, data: st.DataObject) -> None:
        worker = data.draw(st.sampled_from(WORKERS), label="worker")
        self.model.workers.add(worker)
        info = self.q.worker(worker).heartbeat()
        assert (info.version, info.version_published, info.weights_uri or "", info.held) == (
            self.model.version, self.model.published, self.model.weights_uri, bool(self.model.holds))

    def requeue_dead_letter(self, data: st.DataObject) -> None:
        """Every dead letter holds its reason, last attempt and pristine group; one goes back to the
        backlog under a new entry ID (dead -> backlog), and its source_id now maps there."""
        letters = {d.entry_id: d for d in self.q.dead_letters(count=1000)}
        dead = self.model.in_state(DEAD)
        assert set(letters) == {e.entry_id for e in dead}
        for e in dead:
            d = letters[e.entry_id]
            _, _, attempt, worker, reason = (e.ledger or "").split("|", 4)
            assert (d.source_id, d.reason, d.attempt, d.worker_id) == (e.group.source_id, reason, int(attempt), worker)
            assert d.group == e.group, "a dead letter lost its pristine group"
            if reason == "max_attempts":  # every counted attempt's reason reaches the dead letter
                counted = [h for h in d.history if h.get("t") in ("failed", "malformed", "lost")]
                assert len(counted) == self.model.cfg.max_attempts, d.history
        e = data.draw(st.sampled_from(dead), label="dead entry")
        self.model.requeue_dead_letter(e.entry_id, self.q.requeue_dead_letter(letters[e.entry_id].dlq_id))

    # -- partial rollouts (issue 30): progress records ---------------------------------------------

    def handed_to(self, receipt: Receipt | None) -> dict[int, Sample]:
        """The progress the receipt's attempt was handed, by slot, while it still owns its entry."""
        e = self.model.entries[receipt.entry_id] if receipt is not None else None
        return {x.slot: x for x in e.handed} if e is not None and e.owns(receipt) else {}  # type: ignore[arg-type]

    def continue_sample(self, prefix: Sample | None, slot: int, new: int, finish_reason: str) -> Sample:
        """A sample of ``new`` more tokens at the current version after ``prefix`` (its tokens,
        logprobs and segments kept, a segment added when the version moved), as a worker continues one."""
        v = self.model.version
        tokens = tuple(100 * (slot + 1) + i for i in range(new))
        logprobs = tuple(LOGPROBS[i % len(LOGPROBS)] for i in range(new))
        if prefix is None:
            return Sample(slot=slot, token_ids=tokens, logprobs=logprobs, version=v, finish_reason=finish_reason)
        segments = prefix.segments or ((0, prefix.version),)
        if v > segments[-1][1]:
            segments += ((len(prefix.token_ids), v),)
        return Sample(slot=slot, token_ids=prefix.token_ids + tokens, logprobs=prefix.logprobs + logprobs,
                      version=prefix.version, finish_reason=finish_reason,
                      segments=segments if len(segments) > 1 else ())

    def progress_for(self, data: st.DataObject, receipt: Receipt) -> list[Sample]:
        """An unfinished attempt's samples so far: every slot it was handed (continued further) and
        some others, each cut short ('abort')."""
        n = self.model.entries[receipt.entry_id].n
        handed = self.handed_to(receipt)
        slots = set(handed) | set(data.draw(st.lists(st.integers(0, n - 1), min_size=1, max_size=n, unique=True),
                                            label="progress slots"))
        return [self.continue_sample(handed.get(slot), slot, data.draw(st.integers(1, 3), label="new tokens"), "abort")
                for slot in sorted(slots)]

    def save_partial(self, data: st.DataObject) -> None:
        """save_partial by the owner ('saved', or 'replay' when it sends the record already stored), by
        an attempt that is over (StaleReceipt, or 'replay' when the stored record is its own), over
        max_partial_bytes (PartialTooLarge before anything is sent); a lost reply is resent at once or
        after the attempt was aborted: a replay either way, nothing written or counted (rule 5; after
        the abort the record is the next attempt's to continue)."""
        owners, old = self.model.executing_receipts(), self.model.old_receipts()
        receipt = data.draw(st.sampled_from(owners * 3 + old[-4:]), label="receipt")
        samples = self.progress_for(data, receipt)
        size = len(encode_partial(samples))
        expected = self.model.save_partial(receipt, samples, size)
        w = self.q.worker(receipt.worker_id)
        resend = data.draw(st.sampled_from(["no", "no", "at once", "after abort"]), label="reply lost")
        lost = expected == "saved" and resend != "no"
        event(f"save_partial -> {expected}" + (f" (reply lost, resent {resend})" if lost else ""))
        call = partial(w.save_partial, receipt, samples)
        if not lost:
            self.check_call(call, expected, too_large=PartialTooLarge)
        else:
            flow = flows.save_partial(self.keys, receipt, samples, self.q.config.max_partial_bytes)
            op = next(flow)
            first = self.q.driver.execute(op)
            assert protocol.parse_save_partial(first, receipt) == "saved"
            if resend == "after abort":
                assert self.model.abort(receipt) == "ready" and w.abort(receipt, "weight update") == "ready"
            # Either way the resend is a replay: the record is this one, written and counted once.
            assert self.model.save_partial(receipt, samples, size) == "replay"
            with pytest.raises(StopIteration) as stop:
                flow.send(self.unchanged(partial(self.q.driver.execute, op)))
            assert stop.value.value == "replay"

    def abort_with_progress(self, receipt: Receipt, data: st.DataObject) -> None:
        """abort carrying the attempt's samples so far: the record is written in the same call (the
        owner's only); a lost reply's resend is a replay that writes nothing."""
        samples = self.progress_for(data, receipt)
        size = len(encode_partial(samples))
        expected = self.model.abort(receipt, samples, size)
        lose = expected == "ready" and data.draw(st.booleans(), label="reply lost")
        event(f"abort with progress -> {expected}" + (" (reply lost)" if lose else ""))
        w = self.q.worker(receipt.worker_id)
        call = partial(w.abort, receipt, "weight update", samples)
        if not lose:
            self.check_call(call, expected, too_large=PartialTooLarge)
        else:
            flow = flows.abort(self.keys, receipt, "weight update", samples, self.q.config.max_partial_bytes)
            op = next(flow)
            assert protocol.parse_ended(self.q.driver.execute(op), "abort", receipt) == "ready"
            with pytest.raises(StopIteration) as stop:
                flow.send(self.unchanged(partial(self.q.driver.execute, op)))
            assert stop.value.value == "replay"
