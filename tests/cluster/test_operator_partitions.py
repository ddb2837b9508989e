"""The operator commands and the metrics exporter on partitioned queues: a local 3-master cluster with
P = 6 (a ``redis+cluster://`` URL) and a plain server with P = 3.

One known state per target: 18 groups submitted, 8 reserved by one worker (gathered over the
partitions), of which one failed (dead: max_attempts 1), two completed, one of those leased and
committed, the other leased and kept open; 5 still executing, 10 in the backlog. The expected
numbers per partition are derived from where each reservation came from (its receipt names its
partition), not from the views under test.
"""

from __future__ import annotations

import json
import uuid
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from rollout_queue import Progress, QueueConfig, RolloutQueue, Sample, SourceGroup
from rollout_queue.devtools.local_cluster import LocalCluster
from rollout_queue.devtools.local_server import LocalServer
from rollout_queue.ops import acl, views
from tests.cluster.conftest import delete_queue, spread_name
from tests.conftest import _delete_queue_keys
from tests.ops.conftest import Cli, cli  # noqa: F401  (the in-process CLI runner fixture)

pytest.importorskip("prometheus_client")

CONFIG = QueueConfig(worker_timeout_s=30, max_attempts=1, max_staleness=2)
WORKER, TRAINER = "host-a:gpu0", "trainer-0"


@dataclass
class Partitioned:
    url: str
    name: str
    count: int
    q: RolloutQueue
    lease_id: str
    #: partition name -> expected group counts by state
    expected: dict[str, Counter[str]]
    dead_partition: str
    dead_entry: str
    executing: list[tuple[str, str]]  # (partition, entry id)


def build(url: str, name: str, count: int) -> Partitioned:
    q = RolloutQueue.from_url(url, name, CONFIG, partitions=count)
    groups = [SourceGroup(f"src-{i}", f"What is {i} + {i}?", 2, {"row": i}) for i in range(18)]
    q.submit(groups)
    q.publish_version(1)
    where = {g.source_id: q.partition_for(g.source_id) for g in groups}
    expected: dict[str, Counter[str]] = {n: Counter() for n in q.partitions}
    for part in where.values():
        expected[part]["backlog"] += 1
    w = q.worker(WORKER)
    got = w.reserve(8)
    assert len(got) == 8
    for r in got:
        expected[r.receipt.queue]["backlog"] -= 1
        expected[r.receipt.queue]["executing"] += 1
    dead, done1, done2, rest = got[0], got[1], got[2], got[3:]
    w.fail(dead.receipt, "prompt too long")
    q.settle_parked()  # parked by the worker's fail (the worker role holds no XACK): the reaper's pass, here
    expected[dead.receipt.queue].update({"executing": -1, "dead": 1})
    for r in (done1, done2):
        w.complete(r.receipt, [Sample(slot=i, token_ids=(1, 2), logprobs=(-0.1, -0.2), reward=1.0, version=1)
                               for i in range(2)])
        expected[r.receipt.queue].update({"executing": -1, "completed": 1})
    first = q.lease(1, trainer_id=TRAINER)
    assert first is not None
    first_part = where[first.groups[0].group.source_id]
    first.commit()
    expected[first_part].update({"completed": -1, "committed": 1})
    kept = q.lease(1, trainer_id=TRAINER)
    assert kept is not None
    kept_part = where[kept.groups[0].group.source_id]
    expected[kept_part].update({"completed": -1, "leased": 1})
    return Partitioned(url, name, count, q, kept.lease_id, expected, dead.receipt.queue, dead.entry_id,
                       [(r.receipt.queue, r.entry_id) for r in rest])


@pytest.fixture(scope="module", params=["cluster-6", "plain-3"])
def state(request: pytest.FixtureRequest, cluster: LocalCluster, server: LocalServer) -> Iterator[Partitioned]:
    if cluster.kind != server.kind:
        pytest.skip("one server kind at a time")  # (the two session fixtures are parametrized alike)
    if request.param == "cluster-6":
        local = cluster
        name = spread_name(local, 6)
        s = build(local.url, name, 6)
        yield s
        s.q.close()
        delete_queue(local, name)
    else:
        name = f"t-{uuid.uuid4().hex[:12]}"
        s = build(server.url, name, 3)
        yield s
        s.q.close()
        for n in (name, *(f"{name}#{i}" for i in range(3))):
            _delete_queue_keys(server.url, n)


STATES = ("backlog", "ready", "executing", "completed", "leased", "committed", "filtered", "dead")


def counts(stats: dict) -> dict[str, int]:
    return {"backlog": stats["backlog"], "ready": stats["ready"], "executing": stats["executing_groups"],
            "completed": stats["completed"], "leased": stats["leased"], "committed": stats["committed"],
            "filtered": stats["filtered"], "dead": stats["dead"]}


def test_stats_shows_each_partition_and_the_total(state: Partitioned, cli: Cli) -> None:
    for extra in ((), ("--partitions", str(state.count))):  # the recorded count, or the one given
        code, out, err = cli(state.url, state.name, "stats", "--json", *extra)
        assert code == 0, err
        doc = json.loads(out)
        parts = {p["partition"]: p for p in doc["partitions"]}
        assert list(parts) == [f"{state.name}#{i}" for i in range(state.count)]
        for name, want in state.expected.items():
            assert not parts[name]["unreachable"]
            assert counts(parts[name]) == {s: want[s] for s in STATES}, name
        assert counts(doc) == {"backlog": 10, "ready": 0, "executing": 5, "completed": 0, "leased": 1,
                               "committed": 1, "filtered": 0, "dead": 1}
        assert doc["counters"]["partitions"] == state.count and doc["counters"]["partitions_unreachable"] == 0
        # the worker registered in the partitions it reserved from: one row in each
        executing = {n for n, c in state.expected.items() if c["executing"]}
        assert executing <= {w["partition"] for w in doc["workers"]} <= set(parts)
        assert [x["partition"] for x in doc["leases"]] == [next(n for n, c in state.expected.items() if c["leased"])]
    code, out, _ = cli(state.url, state.name, "stats")
    assert code == 0
    assert f"partitions: {state.count}" in out and "total" in out
    table = out[out.index("== partitions"):out.index("== groups by state")]
    for name, want in state.expected.items():
        row = next(line.split() for line in table.splitlines() if line.startswith(name + " "))
        assert [int(x) for x in row[1:9]] == [want[s] for s in STATES]
    total = next(line.split() for line in table.splitlines() if line.startswith("total"))
    assert [int(x) for x in total[1:9]] == [10, 0, 5, 0, 1, 1, 0, 1]


def test_top_once(state: Partitioned, cli: Cli) -> None:
    code, out, err = cli(state.url, state.name, "top", "--once")
    assert code == 0, err
    assert f"parts   {state.count}: {state.name}#0 " in out
    code, out, _ = cli(state.url, state.name, "top", "--once", "--json")
    assert code == 0 and json.loads(out)["executing_groups"] == 5 and len(json.loads(out)["partitions"]) == state.count


def test_workers_and_leases_have_a_partition_column(state: Partitioned, cli: Cli) -> None:
    code, out, _ = cli(state.url, state.name, "workers", "--json")
    rows = json.loads(out)
    per = {r["partition"]: r["executing_groups"] for r in rows}
    assert code == 0 and {r["worker_id"] for r in rows} == {WORKER} and len(per) == len(rows)
    assert {n: per.get(n, 0) for n in state.expected} == {n: c["executing"] for n, c in state.expected.items()}
    code, out, _ = cli(state.url, state.name, "workers")
    assert code == 0 and "partition" in out.splitlines()[1] and "1 alive" in out
    code, out, _ = cli(state.url, state.name, "leases", "--json")
    rows = json.loads(out)
    assert code == 0 and [(r["partition"], r["trainer"], r["groups"]) for r in rows] == [
        (next(n for n, c in state.expected.items() if c["leased"]), TRAINER, 1)]
    code, out, _ = cli(state.url, state.name, "leases")
    assert code == 0 and "partition" in out


def test_stragglers_name_their_partition(state: Partitioned, cli: Cli) -> None:
    code, out, _ = cli(state.url, state.name, "stragglers", "--json")
    attempts = json.loads(out)["attempts"]
    assert code == 0 and {(a["partition"], a["entry_id"]) for a in attempts} == set(state.executing)
    assert {a["worker_id"] for a in attempts} == {WORKER}
    code, out, _ = cli(state.url, state.name, "stragglers")
    assert code == 0 and "partition" in out.splitlines()[1]
    code, out, _ = cli(state.url, state.name, "at-risk", "--within", "99", "--json")
    entries = json.loads(out)["entries"]
    assert code == 0 and all(e["partition"] in state.expected for e in entries)


def test_inspect_finds_the_entry_in_its_partition(state: Partitioned, cli: Cli) -> None:
    part, entry_id = state.executing[0]
    for ref in (f"{part}/{entry_id}", f"{part.rsplit('#', 1)[1]}/{entry_id}"):
        code, out, err = cli(state.url, state.name, "inspect", ref, "--json")
        assert code == 0, err
        doc = json.loads(out)
        assert doc["partition"] == part and doc["state"] == "executing" and doc["owner"] == WORKER
    code, out, err = cli(state.url, state.name, "inspect", entry_id, "--json")
    if code == 0:  # found in exactly one partition
        assert json.loads(out)["partition"] == part
    else:  # entry IDs repeat across partitions: the message names the candidates
        assert code == 2 and f"{part}/{entry_id}" in err
    code, out, _ = cli(state.url, state.name, "inspect", f"{state.dead_partition}/{state.dead_entry}")
    assert code == 0 and "dead" in out and state.dead_partition in out
    assert cli(state.url, state.name, "inspect", f"{part}/1-0")[0] == 4
    assert cli(state.url, state.name, "inspect", f"nope/{entry_id}")[0] == 2


def test_dlq_list_and_show_name_the_partition(state: Partitioned, cli: Cli) -> None:
    code, out, _ = cli(state.url, state.name, "dlq", "list")
    lines = out.splitlines()
    assert code == 0 and len(lines) == 1
    dlq_ref, entry_ref = lines[0].split("\t")[:2]
    assert dlq_ref.startswith(state.dead_partition + "/") and entry_ref == f"{state.dead_partition}/{state.dead_entry}"
    code, out, _ = cli(state.url, state.name, "dlq", "list", "--json")
    assert code == 0 and json.loads(out)[0]["queue"] == state.dead_partition
    for ref in (dlq_ref, dlq_ref.split("/", 1)[1]):
        code, out, err = cli(state.url, state.name, "dlq", "show", ref, "--json")
        assert code == 0, err
        assert json.loads(out)["entry_id"] == state.dead_entry and json.loads(out)["queue"] == state.dead_partition
        code, out, err = cli(state.url, state.name, "dlq", "show", ref)  # for people: the partition named
        assert code == 0 and f"== dead letter {dlq_ref}" in out and f"partition    {state.dead_partition}" in out
    assert cli(state.url, state.name, "dlq", "show", f"{state.dead_partition}/1-0")[0] == 4


def test_metrics_scrape_labels_each_partition(state: Partitioned, cli: Cli) -> None:
    from prometheus_client.parser import text_string_to_metric_families

    code, out, err = cli(state.url, state.name, "metrics", "--once")
    assert code == 0, err
    samples = {(s.name, tuple(sorted(s.labels.items()))): s.value
               for f in text_string_to_metric_families(out) for s in f.samples}
    for name, want in state.expected.items():
        assert samples[("rollout_queue_up", (("partition", name), ("queue", state.name)))] == 1
        for s in STATES:
            key = ("rollout_queue_groups", (("partition", name), ("queue", state.name), ("state", s)))
            assert samples[key] == want[s], (name, s)
        key = ("rollout_queue_worker_executing_groups", (("partition", name), ("queue", state.name), ("worker", WORKER)))
        assert samples.get(key, 0) == want["executing"]
    total = Counter()
    for (metric, labels), value in samples.items():
        if metric == "rollout_queue_groups":
            total[dict(labels)["state"]] += value
    assert total == Counter({"backlog": 10, "executing": 5, "leased": 1, "committed": 1, "dead": 1})
    # each worker counted once over the partitions; the logical counters sum to the whole queue
    assert samples[("rollout_queue_workers", (("queue", state.name), ("status", "alive")))] == 1
    assert samples[("rollout_queue_partitions", (("queue", state.name),))] == state.count
    assert sum(v for (m, _), v in samples.items() if m == "rollout_queue_submitted_total") == 18
    assert sum(v for (m, _), v in samples.items() if m == "rollout_queue_commits_total") == 1


def test_a_mistyped_queue_is_not_found(state: Partitioned, cli: Cli) -> None:
    for args in (("stats",), ("top", "--once"), ("workers",), ("leases",), ("dlq", "list"), ("inspect", "1-0"),
                 ("metrics", "--once"), ("stats", "--partitions", str(state.count))):
        code, _, err = cli(state.url, state.name + "-typo", *args)
        assert code == 4, (args, err)
    code, _, err = cli(state.url, state.name, "stats", "--partitions", str(state.count + 1))
    assert code == 1 and "partitions" in err  # the recorded count differs: ConfigMismatch, nothing read


def test_operator_role_reads_a_partitioned_queue(state: Partitioned, cli: Cli) -> None:
    import redis

    user = acl.user_name(state.name, "operator")
    code, _, err = cli(state.url, state.name, "acl", "--apply", "--yes", "--role", "operator",
                       "--password", "operator=pw-op")  # the recorded partition count: no --partitions
    assert code == 0, err
    try:
        scheme, rest = state.url.split("//", 1)
        host = rest.split("/", 1)[0]
        url = f"{scheme}//{user}:pw-op@{host}" + ("" if "cluster" in scheme else "/0")
        for args in (("stats", "--json"), ("workers",), ("leases",), ("dlq", "list"), ("metrics", "--once"),
                     ("inspect", f"{state.executing[0][0]}/{state.executing[0][1]}")):
            code, out, err = cli(url, state.name, *args)
            assert code == 0, (args, err)
        assert json.loads(cli(url, state.name, "stats", "--json")[1])["executing_groups"] == 5
        assert cli(url, state.name, "dlq", "purge", "--all", "--yes")[0] == 6  # read-only
    finally:
        if state.url.startswith("redis+cluster"):  # the user was set on every node
            import redis.cluster

            c = redis.cluster.RedisCluster.from_url(state.url.replace("redis+cluster", "redis"))
            c.execute_command("ACL", "DELUSER", user, target_nodes=redis.cluster.RedisCluster.ALL_NODES)
            c.close()
        else:
            redis.Redis.from_url(state.url).execute_command("ACL", "DELUSER", user)


def test_state_changing_commands_act_in_the_right_partition(server: LocalServer, cli: Cli) -> None:
    name = f"t-{uuid.uuid4().hex[:12]}"
    s = build(server.url, name, 3)
    try:
        code, out, err = cli(s.url, name, "drain", "start", "--timeout-s", "60", "--yes")
        assert code == 0, err
        code, out, _ = cli(s.url, name, "drain", "status")
        lines = [x.split("\t") for x in out.splitlines()]
        assert code == 0 and [x[:2] for x in lines] == [["total", "draining"]] + [[f"{name}#{i}", "draining"]
                                                                                 for i in range(3)]
        assert cli(s.url, name, "drain", "stop", "--yes")[0] == 0
        part, entry_id = s.executing[0]
        code, out, err = cli(s.url, name, "requeue", f"{part}/{entry_id}", "--force", "--yes")
        assert code == 0, err
        assert out.strip() == f"{part}/{entry_id}\tready"
        assert s.q.partition(s.q.partitions.index(part)).stats().ready == 1
        code, out, _ = cli(s.url, name, "dlq", "requeue", "--all", "--yes")
        assert code == 0 and out.split("\t")[0].startswith(s.dead_partition + "/")
        assert s.q.stats().dead == 0 and cli(s.url, name, "dlq", "list")[1] == ""
        code, out, err = cli(s.url, name, "config", "set", "max_attempts=3", "max_executing_samples=3000", "--yes")
        assert code == 0, err
        shares = [s.q.partition(i).run(views.stored_config(k))[0] for i, k in enumerate(s.q.layout.keys)]
        assert [c["max_attempts"] for c in shares] == [3, 3, 3]
        assert sum(c["max_executing_samples"] for c in shares) == 3000
        code, out, _ = cli(s.url, name, "config", "show", "--json")
        assert code == 0 and json.loads(out)["logical"]["max_executing_samples"] == 3000
    finally:
        s.q.close()
        for n in (name, *(f"{name}#{i}" for i in range(3))):
            _delete_queue_keys(server.url, n)


def test_holds_and_reaped_read_every_partition(state: Partitioned, cli: Cli) -> None:
    """A hold stands on every partition: `holds` lists it once per partition, naming each, with its
    holder and reason; `reaped` reads every partition's stream (nobody was reaped here)."""
    hold = state.q.hold(timeout_s=60, holder=TRAINER, reason="weight update v2")
    try:
        code, out, _ = cli(state.url, state.name, "holds", "--json")
        rows = json.loads(out)
        assert code == 0 and sorted(r["partition"] for r in rows) == sorted(state.q.partitions)
        assert {(r["hold_id"], r["holder"], r["reason"]) for r in rows} == {(hold.hold_id, TRAINER, "weight update v2")}
        code, out, _ = cli(state.url, state.name, "holds")
        assert code == 0 and "partition" in out and TRAINER in out
    finally:
        hold.release()
    assert json.loads(cli(state.url, state.name, "holds", "--json")[1]) == []
    code, out, _ = cli(state.url, state.name, "reaped", "--json")
    assert code == 0 and json.loads(out) == []


def test_sample_histograms_count_each_worker_once_over_the_partitions(state: Partitioned, cli: Cli) -> None:
    """A partitioned worker registers in every partition but reports its progress to the lead one
    only: `stats` and the exporter's sum over the partitions count its samples once."""
    from prometheus_client.parser import text_string_to_metric_families

    lengths, durations = (0, 3) + (0,) * 10 + (1,), (4,) + (0,) * 12
    state.q.worker(WORKER).heartbeat(Progress(2, 100, 5000, lengths, durations))
    code, out, err = cli(state.url, state.name, "stats", "--json")
    assert code == 0, err
    doc = json.loads(out)
    assert doc["samples"]["tokens"]["counts"] == list(lengths) and doc["samples"]["tokens"]["workers"] == 1
    assert (doc["samples"]["tokens"]["p50"], doc["samples"]["tokens"]["max"]) == (32, "+Inf")
    assert doc["samples"]["seconds"]["count"] == 4 and doc["samples"]["seconds"]["p99"] == 0.25
    parts = {p["partition"]: p["samples"]["tokens"]["count"] for p in doc["partitions"]}
    assert parts == {name: (4 if i == 0 else 0) for i, name in enumerate(state.q.partitions)}
    code, out, _ = cli(state.url, state.name, "stats")
    assert code == 0 and "reported by 1 worker(s)" in out
    code, out, err = cli(state.url, state.name, "metrics", "--once")
    assert code == 0, err
    counts = Counter()
    for family in text_string_to_metric_families(out):
        for s in family.samples:
            if s.name in ("rollout_queue_sample_tokens_count", "rollout_queue_sample_seconds_count"):
                assert s.labels["partition"] in state.q.partitions
                counts[s.name] += s.value
    assert counts == {"rollout_queue_sample_tokens_count": 4, "rollout_queue_sample_seconds_count": 4}
