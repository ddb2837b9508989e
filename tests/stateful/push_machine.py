"""A hypothesis rule-based machine over the rounds of a weights push, on a real server, against a model.

Each example opens a new queue (a uuid name) on the session's server (redis and valkey) and drives
random push_open, push_join, push_seal and push_close calls (issue 29's "make the suite find these
next time"), with the perturbations that broke them: replies lost after the script ran (the same
call sent again, as the transport does), members that go silent or close after joining, ids that
never heartbeat, workers a retry leaves out, versions recorded meanwhile, and the join window and
the deadline passing. Every call's answer is compared with the model's; after EVERY step the round
in Redis is compared with the model and these invariants are checked:

- the ranks of a round are 1..n without gaps, and match the model's members;
- only workers live at the instant they joined hold ranks (checked at each join, on Redis truth);
- a resent open is a replay: the same epoch, nothing written (one open makes one round);
- sealing twice, or a resent seal, answers the same members, and a seal before the window passed
  never counted a member that was not live (the model counts only live ones; the step also
  recounts on Redis truth);
- a round always ends by its deadline: past it, nobody new takes a rank, a member's ticket says
  no time is left, and a seal answers whatever the trainer expected.

Time is made deterministic the way ledger_machine.py makes it: a silent worker's heartbeat and a
round's windows are moved into the past in Redis, never waited for.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import pytest
import redis
from hypothesis import event
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from rollout_queue import QueueConfig, RetryPolicy, RolloutQueue, VersionRegression
from rollout_queue.core import flows
from rollout_queue.core.errors import WorkerNotLive
from rollout_queue.core.keys import QueueKeys
from rollout_queue.core.models import PushSeal, PushTicket
from rollout_queue.devtools.local_server import LocalServer

from .redis_truth import snapshot

WORKERS = ("w1", "w2", "w3", "w4")
GHOST = "ghost"  # never heartbeats
ADDR = "127.0.0.1:29500"
TIMEOUT_MS = 60_000
OUTCOMES = ("done", "partial", "failed", "empty")


@dataclass
class Round:
    """The model's current round."""

    epoch: int
    round_id: str
    version: int
    unreached: frozenset[str]
    state: str = "open"
    members: dict[str, int] = field(default_factory=dict)
    window_open: bool = True
    past_deadline: bool = False


@dataclass
class PushModel:
    """What the queue must hold: registered workers (live or not), the policy version, the round."""

    live: dict[str, bool] = field(default_factory=dict)  # registered worker -> live now
    policy: int | None = None
    epochs: int = 0
    round: Round | None = None

    def is_live(self, worker: str) -> bool:
        return self.live.get(worker, False)

    def live_members(self) -> int:
        assert self.round is not None
        return sum(self.is_live(w) for w in self.round.members)

    def sealed(self) -> PushSeal:
        assert self.round is not None
        return PushSeal(self.round.epoch, len(self.round.members) + 1, dict(self.round.members))


def run_twice(make_flow: Callable[[], Any], execute: Callable[[Any], Any]) -> tuple[Any, Any]:
    """The call of ``make_flow()`` sent twice, as the transport resends it after a lost reply: both
    replies parsed by a flow of their own (two flows with the same arguments build the same call).
    Each result is a value or the exception its parser raised."""
    results = []
    op = None
    for _ in range(2):
        flow = make_flow()
        built = next(flow)
        op = built if op is None else op
        assert built == op, "the resend must be the same call"
        try:
            flow.send(execute(op))
        except StopIteration as stop:
            results.append(stop.value)
        except Exception as exc:  # noqa: BLE001 - a refusal: compared by the caller
            results.append(exc)
    return results[0], results[1]


class PushMachine(RuleBasedStateMachine):
    """Drives the push rounds of one queue; ``server`` is bound by the test function."""

    server: LocalServer

    def __init__(self) -> None:
        super().__init__()
        self.q: RolloutQueue | None = None
        self.raw: redis.Redis | None = None
        self.model = PushModel()
        self.last_open: Callable[[], Any] | None = None  # the current round's open, to resend

    @initialize()
    def open_queue(self) -> None:
        self.raw = redis.Redis.from_url(self.server.url)
        self.q = RolloutQueue.from_url(self.server.url, f"pm-{uuid.uuid4().hex[:12]}",
                                       QueueConfig(worker_timeout_s=TIMEOUT_MS / 1000),
                                       retry=RetryPolicy(window_s=20.0))

    @property
    def keys(self) -> QueueKeys:
        assert self.q is not None
        return self.q.keys

    def teardown(self) -> None:
        if self.q is not None:
            self.q.close()
        if self.raw is not None:
            if self.q is not None:
                doomed = list(self.raw.scan_iter(match=self.q.keys.pattern, count=1000))
                if doomed:
                    self.raw.unlink(*doomed)
            self.raw.close()

    @rule(data=st.data())
    def step(self, data: st.DataObject) -> None:
        table = [name for name, weight, ready in ACTIONS if ready(self) for _ in range(weight)]
        getattr(self, data.draw(st.sampled_from(table), label="action"))(data)

    # -- helpers ----------------------------------------------------------------------------------

    def server_ms(self) -> int:
        assert self.raw is not None
        sec, usec = self.raw.time()
        return sec * 1000 + usec // 1000

    def execute(self, op: Any) -> Any:
        assert self.q is not None
        return self.q.driver.execute(op)

    def unchanged(self, call: Callable[[], Any]) -> Any:
        """Run ``call`` and assert that no key of the queue changed (refusals and replays)."""
        assert self.raw is not None
        before = snapshot(self.raw, self.keys)
        try:
            return call()
        finally:
            assert snapshot(self.raw, self.keys) == before, "a refused or replayed push call wrote to Redis"

    def live_in_redis(self, worker: str) -> bool:
        assert self.raw is not None
        seen = self.raw.zscore(self.keys["workers"], worker)
        return seen is not None and seen >= self.server_ms() - TIMEOUT_MS + 1000  # a second of slack

    # -- workers ----------------------------------------------------------------------------------

    def heartbeat(self, data: st.DataObject) -> None:
        assert self.q is not None
        worker = data.draw(st.sampled_from(WORKERS), label="worker")
        self.q.worker(worker).heartbeat()
        self.model.live[worker] = True

    def goes_silent(self, data: st.DataObject) -> None:
        """A worker (a member, often) stops heartbeating: its last beat moves past worker_timeout."""
        assert self.raw is not None
        worker = data.draw(st.sampled_from(sorted(self.model.live)), label="silent worker")
        self.raw.zadd(self.keys["workers"], {worker: self.server_ms() - 2 * TIMEOUT_MS})
        self.model.live[worker] = False
        event("a worker goes silent" + (" (a member)" if self.model.round and worker in self.model.round.members
                                          else ""))

    def closes(self, data: st.DataObject) -> None:
        """A worker closes (drains): it is registered no more."""
        assert self.q is not None
        worker = data.draw(st.sampled_from(sorted(self.model.live)), label="closing worker")
        self.q.worker(worker).close()
        del self.model.live[worker]

    # -- the trainer's calls ----------------------------------------------------------------------

    def open(self, data: st.DataObject) -> None:
        assert self.q is not None
        m = self.model
        floor = m.policy if m.policy is not None else -1
        regress = m.policy is not None and data.draw(st.sampled_from([False, False, False, True]),
                                                     label="regressed version")
        version = data.draw(st.integers(0, floor) if regress else st.integers(floor + 1, floor + 3), label="version")
        earlier = sorted(m.round.members) if m.round else []
        unreached = data.draw(st.lists(st.sampled_from(earlier + [GHOST]), unique=True, max_size=2)
                              if earlier else st.just([]), label="unreached")
        lost = data.draw(st.booleans(), label="reply lost")
        round_id = flows.new_id()
        make = partial(flows.push_open, self.keys, round_id, version, f"/w/v{version}", ADDR, "gloo", 30.0, 60.0,
                       unreached)
        if regress:
            event("open -> version_regression")
            with pytest.raises(VersionRegression):
                self.unchanged(partial(self.q.run, make()))
            return
        if lost:
            first, second = run_twice(make, self.execute)
            event("open, first reply lost")
        else:
            first = second = self.q.run(make())
        m.epochs += 1
        assert first == second == m.epochs, f"open answered {first}, {second}; one round must be {m.epochs}"
        m.round = Round(m.epochs, round_id, version, frozenset(unreached))
        self.last_open = make

    def resend_open(self, data: st.DataObject) -> None:
        """The current round's open arrives again (a resend after a lost reply): a replay, whatever
        happened to the round since."""
        assert self.last_open is not None and self.model.round is not None
        got = self.unchanged(partial(self.q.run, self.last_open()))
        assert got == self.model.round.epoch
        event(f"resent open of a round {self.model.round.state}")

    def seal(self, data: st.DataObject) -> None:
        assert self.q is not None
        m = self.model
        epoch = data.draw(st.sampled_from([m.epochs, m.epochs, m.epochs, max(1, m.epochs - 1), m.epochs + 1]),
                          label="epoch")
        expect = data.draw(st.integers(0, 4), label="expect")
        lost = data.draw(st.booleans(), label="reply lost")
        r = m.round
        window_open = r is not None and r.window_open
        seals_now = False
        if r is None or epoch != r.epoch or r.state not in ("open", "sealed"):
            want: Any = None
        elif r.state == "sealed":
            want = m.sealed()
        else:
            expected = expect or sum(m.live.values())
            live, joined = m.live_members(), len(r.members)
            if live < expected and r.window_open:
                want = (joined if joined < expected else live, expected)  # the members, until there are enough
            else:
                r.state, seals_now = "sealed", True
                want = m.sealed()
        make = partial(flows.push_seal, self.keys, epoch, expect)
        if lost:
            first, second = run_twice(make, self.execute)
        elif seals_now:
            first = second = self.q.run(make())
        else:  # waiting, sealed before, or not this round: nothing written
            first = second = self.unchanged(partial(self.q.run, make()))
        assert first == second == want, f"seal answered {first}, {second}; the model says {want}"
        if seals_now and window_open:
            # Sealed by this call before the window passed: enough members were live (Redis truth).
            assert sum(self.live_in_redis(w) for w in want.members) >= (expect or sum(m.live.values()))
        event(f"seal -> {type(want).__name__}" + (" (reply lost)" if lost else ""))

    def close(self, data: st.DataObject) -> None:
        assert self.q is not None
        m = self.model
        epoch = data.draw(st.sampled_from([m.epochs, max(1, m.epochs - 1)]), label="epoch")
        outcome = data.draw(st.sampled_from(OUTCOMES), label="outcome")
        current = m.round is not None and epoch == m.round.epoch
        call = partial(self.q.close_push, epoch, outcome, 0, 0)
        got = call() if current else self.unchanged(call)
        assert got == current
        if current:
            assert m.round is not None
            m.round.state = outcome

    def publish_version(self, data: st.DataObject) -> None:
        assert self.q is not None
        m = self.model
        version = (m.policy if m.policy is not None else -1) + data.draw(st.integers(1, 2), label="step")
        self.q.publish_version(version)
        m.policy = version

    # -- the workers' join ------------------------------------------------------------------------

    def join(self, data: st.DataObject) -> None:
        assert self.q is not None
        m, r = self.model, self.model.round
        worker = data.draw(st.sampled_from(WORKERS + (GHOST,)), label="joiner")
        epoch = data.draw(st.sampled_from([0, m.epochs, m.epochs, m.epochs, max(1, m.epochs - 1)]), label="epoch")
        held = [-1, -1, -1, -1] + ([r.version - 1, r.version] if r else [])
        newer_than = data.draw(st.sampled_from(held), label="newer_than")
        lost = data.draw(st.booleans(), label="reply lost")
        want: Any = None
        new_rank, why = False, ""
        if r is None or (epoch != 0 and epoch != r.epoch) or r.version <= newer_than:
            want, why = None, "no round" if r is None else "a version it holds" if epoch in (0, r.epoch) \
                else "an earlier round"
        elif worker in r.members:
            want = r.members[worker] if r.state in ("open", "sealed") else None
        elif r.state != "open" or not r.window_open or worker in r.unreached:
            want, why = None, "left out" if worker in r.unreached else "round no longer joinable"
        elif not m.is_live(worker):
            want = WorkerNotLive
        else:
            want, new_rank = len(r.members) + 1, True
            assert self.live_in_redis(worker), "the model and Redis disagree on a joiner's liveness"
        make = partial(flows.push_join, self.keys, worker, epoch, newer_than)
        if lost:
            first, second = run_twice(make, self.execute)
        elif new_rank:
            first = second = self.q.run(make())
        else:
            try:
                first = second = self.unchanged(partial(self.q.run, make()))
            except WorkerNotLive as exc:
                first = second = exc
        for got in (first, second):
            if want is WorkerNotLive:
                assert isinstance(got, WorkerNotLive), f"{worker} is not live, yet join answered {got}"
            elif want is None:
                assert got is None, f"join of {worker} answered {got}; no round is joinable for it"
            else:
                assert r is not None
                assert isinstance(got, PushTicket) and (got.epoch, got.rank, got.version) == (r.epoch, want, r.version)
                assert (got.remaining_ms == 0) == r.past_deadline, "a ticket's time left must end with the deadline"
        if new_rank:
            assert r is not None
            r.members[worker] = want
        event("join -> " + ("not live" if want is WorkerNotLive else f"none ({why or 'closed'})" if want is None
                            else "new rank" if new_rank else "same rank"))

    # -- time -------------------------------------------------------------------------------------

    def window_passes(self, data: st.DataObject) -> None:
        assert self.raw is not None and self.model.round is not None
        self.raw.hset(self.keys["push"], "join_until_ms", 1)
        self.model.round.window_open = False

    def deadline_passes(self, data: st.DataObject) -> None:
        """Past the deadline the round is over for everyone: no new rank, no time left on a ticket,
        and the trainer's seal ends it whatever it expected."""
        assert self.raw is not None and self.q is not None and self.model.round is not None
        r = self.model.round
        self.raw.hset(self.keys["push"], mapping={"join_until_ms": 1, "deadline_ms": 1})
        r.window_open, r.past_deadline = False, True
        for worker in WORKERS + (GHOST,):
            got = self.unchanged(partial(self.q.run, flows.push_join(self.keys, worker, r.epoch, -1)))
            if worker not in r.members or r.state not in ("open", "sealed"):
                assert got is None, f"{worker} joined a round past its deadline: {got}"
            else:
                assert isinstance(got, PushTicket) and got.remaining_ms == 0
        if r.state == "open":
            assert self.q.seal_push(r.epoch, 4096) == self.model.sealed()
            r.state = "sealed"
            event("a round past its deadline sealed")

    # -- invariants -------------------------------------------------------------------------------

    @invariant()
    def round_matches_redis(self) -> None:
        if self.q is None or self.raw is None:
            return
        record = {k.decode(): v.decode() for k, v in self.raw.hgetall(self.keys["push"]).items()}
        members = {k.decode(): int(v) for k, v in self.raw.hgetall(self.keys["push_members"]).items()}
        assert sorted(members.values()) == list(range(1, len(members) + 1)), f"ranks with gaps: {members}"
        r = self.model.round
        if r is None:
            assert record.get("epoch", "0") == str(self.model.epochs) and not members
            return
        assert (int(record["epoch"]), record["round"], int(record["version"]), record["state"]) == (
            r.epoch, r.round_id, r.version, r.state)
        assert members == r.members
        assert {k.removeprefix("unreached:") for k in record if k.startswith("unreached:")} == set(r.unreached)
        if r.state != "open":
            assert int(record["world"]) == len(members) + 1 or r.state in OUTCOMES and record["world"] == "1"


def _round(m: PushMachine) -> bool:
    return m.model.round is not None


ACTIONS: list[tuple[str, int, Callable[[PushMachine], bool]]] = [
    ("heartbeat", 4, lambda m: True),
    ("goes_silent", 1, lambda m: bool(m.model.live)),
    ("closes", 1, lambda m: bool(m.model.live)),
    ("open", 2, lambda m: True),
    ("resend_open", 1, _round),
    ("join", 8, _round),
    ("join", 1, lambda m: True),
    ("seal", 3, _round),
    ("close", 1, _round),
    ("publish_version", 1, lambda m: True),
    ("window_passes", 1, lambda m: _round(m) and m.model.round.window_open),  # type: ignore[union-attr]
    ("deadline_passes", 1, lambda m: _round(m) and not m.model.round.past_deadline),  # type: ignore[union-attr]
]
