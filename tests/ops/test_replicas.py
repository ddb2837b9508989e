"""Replicas and failover (issue 12, item 15): what asynchronous replication loses, and durable mode.

A real replica (a second LocalServer, ``replica_of`` the primary through a Proxy that can stall the
replication link) is promoted mid-run with ``REPLICAOF NO ONE``, as Sentinel would, after the primary
is SIGKILLed; clients then move to it. While the link is stalled the primary still acknowledges every
call, so in plain mode each of those acknowledged operations (submit, complete, fail, commit, lease,
publish_version) is lost by the failover, and the test counts them and shows what each loss means
(docs/OPERATIONS.md, "Replicas and failover"). In durable mode
(``Durability(replicas=1, timeout_ms=...)``) the same calls raise NotReplicated instead of answering,
nothing acknowledged is lost, and repeating the calls on the promoted server (with its own replica)
finishes the job, because every transition replays.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
import redis

from rollout_queue import (
    AsyncRolloutQueue,
    Durability,
    InvalidInput,
    NotReplicated,
    PartitionedQueue,
    QueueConfig,
    RetryPolicy,
    RolloutQueue,
    Sample,
    SourceGroup,
)
from rollout_queue.core import flows
from rollout_queue.core.keys import QueueKeys
from rollout_queue.devtools.local_server import LocalServer
from rollout_queue.drivers.transport import READ_ONLY_SCRIPTS, changes_state
from rollout_queue.core import protocol as p
from tests.contract.conftest import SyncView
from tests.proxy import Proxy

NAME = "replicated"
CFG = QueueConfig(worker_timeout_s=30.0, max_attempts=3, lease_timeout_s=30.0)
#: A short window: each call made while the replica cannot acknowledge fails within ~0.3 s.
WINDOW = RetryPolicy(window_s=0.3, first_backoff_s=0.01, max_backoff_s=0.05)
#: While the replica is healthy: long enough for a loaded machine (a replica on loopback acknowledges in
#: milliseconds). The durable tests wait it out once per call refused while the link stalls (eight
#: calls in all), so it is also what those tests cost: 10 s made them ~3 minutes of the default suite.
HEALTHY = RetryPolicy(window_s=3.0, first_backoff_s=0.01, max_backoff_s=0.1)
DURABLE = Durability(replicas=1, timeout_ms=100)


def groups(prefix: str, count: int, n: int = 2) -> list[SourceGroup]:
    return [SourceGroup(f"{prefix}{i}", f"prompt {prefix}{i}", n, {}) for i in range(count)]


def samples(n: int, version: int = 0) -> list[Sample]:
    return [Sample(slot=i, token_ids=(1, 2), logprobs=(-0.5, -0.5), reward=float(i), version=version)
            for i in range(n)]


@dataclass
class Replicated:
    """A primary, a replica of it behind a stallable link, and what a failover does to them."""

    primary: LocalServer
    link: Proxy
    replica: LocalServer
    extra: list[LocalServer] = field(default_factory=list)

    def synced(self) -> None:
        self.replica.wait_synced(self.primary)

    def fail_over(self) -> LocalServer:
        """What Sentinel does when the primary dies: SIGKILL it, promote the replica (REPLICAOF NO
        ONE). Whatever the link held is gone. Returns the new primary."""
        self.primary.kill()
        self.link.cut()
        self.replica.promote()
        return self.replica

    def new_replica(self, of: LocalServer) -> LocalServer:
        """A replica for the promoted server, synced (so durable clients can go on)."""
        replica = LocalServer(of.kind, replica_of=of).start()
        self.extra.append(replica)
        replica.wait_synced(of)
        return replica


@pytest.fixture
def replicated(fresh_server: LocalServer) -> Iterator[Replicated]:
    link = Proxy(fresh_server.address)
    replica = LocalServer(fresh_server.kind, replica_of=link.address).start()
    setup = Replicated(fresh_server, link, replica)
    try:
        setup.synced()
        yield setup
    finally:
        for server in (replica, *setup.extra):
            server.cleanup(graceful=False)
        link.close()


def lagging(q: Any) -> None:
    """The replica stopped acknowledging: give ``q``'s calls the short window from now on."""
    for name in ("transport", "probe_transport"):
        transport = getattr(q, name, None)
        if transport is not None:
            transport.retry = WINDOW


def truth(server: LocalServer) -> redis.Redis:
    return redis.Redis.from_url(server.url, socket_timeout=10)


def owner(client: redis.Redis, entry_id: str) -> str | None:
    """The PEL owner of an entry (None: not pending)."""
    got = client.xpending_range(QueueKeys(NAME)["src"], "rollout", entry_id, entry_id, 1)
    return got[0]["consumer"].decode() if got else None


# -- the failover, counted -------------------------------------------------------------------------


@dataclass
class Acked:
    """The operations made while the replica lagged, by kind: those the primary acknowledged (the
    call returned), and those durable mode refused to acknowledge (NotReplicated)."""

    acked: dict[str, Any] = field(default_factory=dict)
    refused: list[str] = field(default_factory=list)
    durations: list[float] = field(default_factory=list)

    def attempt(self, kind: str, call: Callable[[], Any]) -> None:
        try:
            self.acked[kind] = call()
        except NotReplicated as exc:
            assert exc.wanted == 1 and exc.acked == 0, exc
            self.refused.append(kind)


def _run_failover(replicated: Replicated, durability: Durability | None) -> dict[str, Any]:
    q = RolloutQueue.from_url(replicated.primary.url, NAME, CFG, retry=HEALTHY, durability=durability)
    w, w2 = q.worker("w1"), q.worker("w2")
    # Before the lag: 6 groups; w1 executes 3 of them, 2 completed ones are leased (lease L1).
    ids = q.submit(groups("g", 6))
    got = w.reserve(3)
    got2 = w2.reserve(2)
    assert w2.complete(got2[0].receipt, samples(2)) == "buffered"
    assert w2.complete(got2[1].receipt, samples(2)) == "buffered"
    lease1 = q.lease(2)
    assert lease1 is not None
    start = time.perf_counter()
    beats = 50
    for _ in range(beats):
        w.heartbeat()
    per_call_ms = (time.perf_counter() - start) * 1000 / beats
    replicated.synced()
    before = q.stats()

    # The replica stops receiving: every call below is acknowledged by the primary alone (plain) or
    # refused an answer (durable).
    replicated.link.stall()
    lagging(q)
    ops = Acked()
    ops.attempt("submit", lambda: q.submit(groups("late", 2)))
    ops.attempt("complete", lambda: w.complete(got[0].receipt, samples(2)))
    ops.attempt("fail", lambda: w.fail(got[1].receipt, "engine error"))
    ops.attempt("commit", lambda: lease1.commit(step=1))
    ops.attempt("publish_version", lambda: q.publish_version(1))
    ops.attempt("heartbeat", lambda: w.heartbeat())
    assert replicated.link.held_bytes > 0 or not ops.acked, "the primary kept writing while the link stalled"
    q.close()

    new = replicated.fail_over()
    raw = truth(new)
    keys = QueueKeys(NAME)
    survived = {
        "submit": raw.hget(keys["ids"], "late0") is not None,
        "complete": owner(raw, got[0].entry_id) == "@done",
        "fail": owner(raw, got[1].entry_id) == "@ready",
        "commit": owner(raw, lease1.groups[0].entry_id) is None,
        "publish_version": raw.hget(keys["meta"], "version") == b"1",
        "heartbeat": True,  # a beat carries no state a test can tell apart; its loss only ages the worker
    }
    lost = sorted(kind for kind in ops.acked if not survived[kind])
    # What each loss leaves behind on the promoted server (docs/OPERATIONS.md, "Replicas and failover").
    consequences = {
        "complete": owner(raw, got[0].entry_id),  # still the worker's: it reconciles (owned -> abort)
        "fail": owner(raw, got[1].entry_id),
        "commit": owner(raw, lease1.groups[0].entry_id),  # still leased: expires, requeued, trained twice
        "ids": ids,
    }
    raw.close()
    return {"q": q, "new": new, "ops": ops, "lost": lost, "before": before, "consequences": consequences,
            "got": got, "lease1": lease1, "per_call_ms": per_call_ms}


def test_a_failover_loses_acknowledged_operations_in_plain_mode(replicated: Replicated) -> None:
    run = _run_failover(replicated, None)
    ops, lost = run["ops"], run["lost"]
    assert ops.refused == []
    assert sorted(ops.acked) == sorted(["submit", "complete", "fail", "commit", "publish_version", "heartbeat"])
    assert lost == ["commit", "complete", "fail", "publish_version", "submit"], lost
    got, lease1 = run["got"], run["lease1"]
    cons = run["consequences"]
    assert cons["complete"] == "w1" and cons["fail"] == "w1", "the settlements are undone: w1 owns them again"
    assert cons["commit"] == f"@lease:{lease1.lease_id}", "the commit is undone: the lease will expire"
    # Clients move to the promoted server: the worker reconciles its orphaned attempts...
    q2 = RolloutQueue.from_url(run["new"].url, NAME, None)
    orphans = {a.receipt.entry_id for a in q2.worker("w1").owned()}
    assert {got[0].entry_id, got[1].entry_id} <= orphans
    # ... and the lost commit's lease is active again on the promoted server: a trainer that already
    # applied its update sees its groups again once the lease expires (trained twice).
    assert q2.stats().leased == len(lease1.groups)
    print(f"\nplain mode, {run['new'].kind}: {len(ops.acked)} operations acknowledged while the replica lagged, "
          f"{len(lost)} lost by the failover ({', '.join(lost)}); {run['per_call_ms']:.3f} ms per heartbeat")
    q2.close()


def test_durable_mode_loses_no_acknowledged_operation(replicated: Replicated) -> None:
    run = _run_failover(replicated, DURABLE)
    ops, lost = run["ops"], run["lost"]
    assert ops.acked == {}, "nothing is acknowledged while no replica can acknowledge it"
    assert sorted(ops.refused) == sorted(["submit", "complete", "fail", "commit", "publish_version", "heartbeat"])
    assert lost == []
    # Everything acknowledged before the lag is on the promoted server.
    new = run["new"]
    q2 = RolloutQueue.from_url(new.url, NAME, None, retry=HEALTHY)
    after = q2.stats()
    before = run["before"]
    assert (after.backlog, after.executing_groups, after.leased, after.committed) == \
        (before.backlog, before.executing_groups, before.leased, before.committed)
    q2.close()
    # Repeating the refused calls on the promoted server (given a replica of its own) finishes the job.
    replicated.new_replica(new)
    q3 = RolloutQueue.from_url(new.url, NAME, None, retry=HEALTHY, durability=DURABLE)
    got, lease1 = run["got"], run["lease1"]
    w = q3.worker("w1")
    assert len(q3.submit(groups("late", 2))) == 2
    assert w.complete(got[0].receipt, samples(2)) == "buffered"
    assert w.fail(got[1].receipt, "engine error") == "ready"
    q3.run(flows.commit(q3.keys, lease1.lease_id, lease1.token, 1))
    assert q3.publish_version(1) is True
    stats = q3.stats()
    assert (stats.committed, stats.leased) == (2, 0)
    print(f"\ndurable mode, {new.kind}: 0 operations acknowledged while the replica lagged "
          f"({len(ops.refused)} raised NotReplicated), 0 lost; {run['per_call_ms']:.3f} ms per durable heartbeat")
    q3.close()


def test_what_a_durable_call_costs(fresh_server: LocalServer) -> None:
    """Not a timed assertion: prints ms per call, plain and durable, with a replica on loopback
    (no proxy), for the closing note. Both modes must work on the same queue."""
    replica = LocalServer(fresh_server.kind, replica_of=fresh_server).start()
    try:
        replica.wait_synced(fresh_server)
        figures = {}
        for label, durability in (("plain", None), ("durable", DURABLE)):
            q = RolloutQueue.from_url(fresh_server.url, f"{NAME}-{label}", CFG, durability=durability)
            w = q.worker("w1")
            count = 100
            q.submit(groups(label, count))
            start = time.perf_counter()
            for _ in range(count):
                w.heartbeat()
            beat = (time.perf_counter() - start) * 1000 / count
            start = time.perf_counter()
            for _ in range(count):
                [res] = w.reserve(1)
                w.complete(res.receipt, samples(2))
            cycle = (time.perf_counter() - start) * 1000 / count
            figures[label] = (beat, cycle)
            q.close()
        (pb, pc), (db, dc) = figures["plain"], figures["durable"]
        print(f"\n{fresh_server.kind}: heartbeat {pb:.3f} -> {db:.3f} ms, reserve+complete {pc:.3f} -> {dc:.3f} ms "
              f"(plain -> durable, replicas=1, loopback)")
    finally:
        replica.cleanup(graceful=False)


# -- durable mode, both transports -----------------------------------------------------------------


@pytest.fixture(params=["sync", "async"])
def open_durable(request: pytest.FixtureRequest) -> Iterator[Callable[..., Any]]:
    loop = asyncio.new_event_loop()
    opened: list[Any] = []

    def open_(url: str, durability: Durability | None = DURABLE, retry: RetryPolicy = HEALTHY) -> Any:
        if request.param == "sync":
            q: Any = RolloutQueue.from_url(url, NAME, CFG, retry=retry, durability=durability)
        else:
            q = SyncView(loop.run_until_complete(
                AsyncRolloutQueue.from_url(url, NAME, CFG, retry=retry, durability=durability)), loop)
        opened.append(q)
        return q

    yield open_
    for q in opened:
        q.close()
    loop.close()


def test_a_durable_call_answers_once_replicated_and_otherwise_ran_but_raises(open_durable,
                                                                              replicated: Replicated) -> None:
    q = open_durable(replicated.primary.url)
    [eid] = q.submit(groups("a", 1))
    assert truth(replicated.replica).hget(QueueKeys(NAME)["ids"], "a0") == eid.encode(), \
        "a durable call answers only once the replica has it"
    replicated.link.stall()
    lagging(q)
    with pytest.raises(NotReplicated) as caught:
        q.submit(groups("b", 1))
    assert "ran on the primary" in str(caught.value) and "safe" in str(caught.value)
    assert q.stats().backlog == 2, "it ran on the primary (stats is read-only: no WAIT, it answers)"
    with pytest.raises(NotReplicated):
        q.submit(groups("b", 1))  # a repeat replays, and is still not replicated
    assert q.stats().backlog == 2, "the repeat replayed"
    assert truth(replicated.replica).hget(QueueKeys(NAME)["ids"], "b0") is None


def test_a_partitioned_queue_is_durable_on_every_partition(replicated: Replicated) -> None:
    pq = PartitionedQueue.from_url(replicated.primary.url, NAME, 2, CFG, retry=HEALTHY, durability=DURABLE)
    ids = pq.submit(groups("p", 4))
    replica = truth(replicated.replica)
    for i, name in enumerate(pq.partitions):
        stored = replica.hgetall(QueueKeys(name)["ids"])
        assert all(v.decode() in ids for v in stored.values())
    assert sum(len(replica.hgetall(QueueKeys(n)["ids"])) for n in pq.partitions) == 4
    replicated.link.stall()
    lagging(pq)
    with pytest.raises(Exception) as caught:  # NotReplicated, or PartitionsUnreachable naming them
        pq.submit(groups("q", 4))
    assert "ran on the primary" in str(caught.value) or "could not be reached" in str(caught.value)
    pq.close()


# -- the one list of what needs no WAIT ------------------------------------------------------------


def test_only_read_only_scripts_and_reads_skip_the_wait() -> None:
    keys = QueueKeys(NAME)
    assert READ_ONLY_SCRIPTS == {"stats", "reap_scan"}
    assert not changes_state(p.build(keys, "stats"))
    for name in ("submit", "reserve", "complete", "fail", "commit", "lease", "heartbeat", "publish_version"):
        assert changes_state(p.Call(p.SCRIPTS[name], (), ())), name
    assert not changes_state(p.Command(("XREAD", "BLOCK", 10, "STREAMS", keys["wake_work"], "$")))
    assert not changes_state(p.Command(("HGET", keys["meta"], "version")))
    assert changes_state(p.Command(("SET", "rollout:{x}:partitions", 2, "NX")))


def test_durability_is_checked_before_anything_is_sent() -> None:
    for bad in (Durability, ):
        with pytest.raises(InvalidInput):
            bad(replicas=0)
        with pytest.raises(InvalidInput):
            bad(replicas=True)  # type: ignore[arg-type]
        with pytest.raises(InvalidInput):
            bad(replicas=1, timeout_ms=0)
    nowhere = redis.Redis(port=1, socket_timeout=1.0)  # never connected: the check sends nothing
    with pytest.raises(InvalidInput, match="socket_timeout"):
        RolloutQueue(nowhere, NAME, CFG, durability=Durability(replicas=1, timeout_ms=5000))


# -- the shipped processes -------------------------------------------------------------------------


def test_the_cli_runs_durable_with_durable_replicas(cli, replicated: Replicated) -> None:
    """``--durable-replicas N`` (env ROLLOUT_DURABLE_REPLICAS) reaches every state-changing command;
    a call the replica cannot acknowledge exits 3 with NotReplicated's message."""
    q = RolloutQueue.from_url(replicated.primary.url, NAME, CFG)
    flags = ("--durable-replicas", "1", "--durable-timeout-ms", "50")
    code, _, err = cli(replicated.primary.url, NAME, *flags, "config", "set", "max_attempts=5", "--yes")
    assert code == 0, err
    replicated.link.stall()
    code, _, err = cli(replicated.primary.url, NAME, *flags, "config", "set", "max_attempts=6", "--yes")
    assert code == 3 and "ran on the primary" in err, err
    code, _, err = cli(replicated.primary.url, NAME, "config", "set", "max_attempts=7", "--yes")
    assert code == 0, "plain mode answers without the replica"
    q.close()


def test_the_worker_cli_passes_durability_to_its_queue_client(monkeypatch: pytest.MonkeyPatch) -> None:
    from rollout_queue.workers.cli import build_parser, build_runtime

    base = ["--url", "redis://127.0.0.1:1/0", "--queue", NAME, "--engine", "scripted"]
    runtime = build_runtime(build_parser().parse_args(base + ["--durable-replicas", "2", "--durable-timeout-ms", "300"]))
    assert runtime.durability == Durability(replicas=2, timeout_ms=300)
    assert build_runtime(build_parser().parse_args(base)).durability is None
    monkeypatch.setenv("ROLLOUT_DURABLE_REPLICAS", "1")
    assert build_runtime(build_parser().parse_args(base)).durability == Durability(replicas=1, timeout_ms=1000)


def test_a_durable_call_without_permission_to_wait_ran_and_says_so(replicated: Replicated) -> None:
    """The generated ACL roles do not grant WAIT yet (docs/OPERATIONS.md, Roles and ACLs)."""
    control = truth(replicated.primary)
    control.acl_setuser("nowait", enabled=True, passwords=["+pw"], keys=["*"], channels=["*"],
                        commands=["+@all", "-wait"])
    url = f"redis://nowait:pw@127.0.0.1:{replicated.primary.port}/0"
    with pytest.raises(NotReplicated, match="NoPermissionError: .*'wait'"):
        RolloutQueue.from_url(url, NAME, CFG, retry=WINDOW, durability=DURABLE)  # open is a write too
    q = RolloutQueue.from_url(url, NAME, CFG, retry=WINDOW)
    q.driver.durability = DURABLE
    with pytest.raises(NotReplicated, match="NoPermissionError: .*'wait'"):
        q.submit(groups("acl", 1))
    assert q.stats().backlog == 1, "it ran"
    q.close()
    control.close()
