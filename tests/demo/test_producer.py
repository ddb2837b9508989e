"""The producer: produce.lua's outcomes, the plan (templates, epochs, seeded shuffles, file kinds),
backpressure, and exactly-once enqueue across a producer killed mid-way and restarted."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import orjson
import pytest
import redis

from rollout_queue import QueueConfig, RolloutQueue, SourceGroup
from rollout_queue.core.errors import GroupTooLarge, InvalidInput, PayloadTooLarge, ProducerConflict
from rollout_queue.rl.producer import GroupBuilder, ProducePlan, load_records, run_producer
from rollout_queue.core.flows.producer import produce, read_cursor
from tests.helpers import wait_until

REPO = Path(__file__).resolve().parents[2]


def write_jsonl(path: Path, count: int) -> Path:
    path.write_bytes(b"".join(orjson.dumps({"question": f"what is {i} + {i}?", "answer": 2 * i, "uid": f"u{i}"})
                              + b"\n" for i in range(count)))
    return path


def dump(r: redis.Redis, queue: str) -> dict[bytes, bytes]:
    """Every key of the queue, serialised: a refusal must leave them all byte-identical."""
    return {k: r.dump(k) for k in sorted(r.scan_iter(match=f"rollout:{{{queue}}}:*")) if not k.endswith((b"wake:work", b":clock"))}


def stream_source_ids(r: redis.Redis, queue: str) -> list[str]:
    return [f[b"sid"].decode() for _, f in r.xrange(f"rollout:{{{queue}}}:src", "-", "+")]


@pytest.fixture
def q(redis_url: str, queue_name: str) -> Any:
    queue = RolloutQueue.from_url(redis_url, queue_name, QueueConfig())
    yield queue
    queue.close()


def groups(prefix: str, count: int) -> list[SourceGroup]:
    return [SourceGroup(f"{prefix}-{i}", f"prompt {i}", 2) for i in range(count)]


# -- produce.lua ----------------------------------------------------------------------------------


def test_a_batch_and_the_cursor_move_together_and_a_resend_is_a_replay(q: Any, r: redis.Redis) -> None:
    got = q.run(produce(q.keys, "ds", "plan1", 0, groups("a", 3), 0, 10**6))
    assert (got.status, got.cursor, got.new, got.backlog) == ("ok", 3, 3, 3)
    assert q.run(read_cursor(q.keys, "ds")) == (3, "plan1")
    before = dump(r, q.name)
    again = q.run(produce(q.keys, "ds", "plan1", 0, groups("a", 3), 0, 10**6))  # the reply was lost: resend
    assert (again.status, again.cursor, again.new) == ("replay", 3, 0)
    assert dump(r, q.name) == before
    assert stream_source_ids(r, q.name) == ["a-0", "a-1", "a-2"]
    assert q.stats().submitted == 3


def test_another_instance_or_another_plan_is_refused_and_changes_nothing(q: Any, r: redis.Redis) -> None:
    q.run(produce(q.keys, "ds", "plan1", 0, groups("a", 2), 0, 10**6))
    before = dump(r, q.name)
    with pytest.raises(ProducerConflict, match="cursor is at 2, not 1"):
        q.run(produce(q.keys, "ds", "plan1", 1, groups("b", 2), 0, 10**6))
    with pytest.raises(ProducerConflict, match="plan"):
        q.run(produce(q.keys, "ds", "plan2", 2, groups("b", 2), 0, 10**6))
    assert dump(r, q.name) == before
    assert q.run(produce(q.keys, "other", "plan2", 0, groups("b", 1), 0, 10**6)).status == "ok"  # names are separate


def test_a_full_backlog_refuses_the_batch_and_changes_nothing(q: Any, r: redis.Redis) -> None:
    q.run(produce(q.keys, "ds", "p", 0, groups("a", 4), 5, 10**6))
    before = dump(r, q.name)
    got = q.run(produce(q.keys, "ds", "p", 4, groups("b", 2), 5, 10**6))
    assert (got.status, got.backlog) == ("backlog_full", 4)
    assert dump(r, q.name) == before
    q.worker("w").reserve(max_groups=2)  # reserved groups leave the backlog
    assert q.run(produce(q.keys, "ds", "p", 4, groups("b", 2), 5, 10**6)).status == "ok"


def test_a_group_already_submitted_is_stored_once_whichever_path_added_it(q: Any, r: redis.Redis) -> None:
    q.submit(groups("a", 1))
    got = q.run(produce(q.keys, "ds", "p", 0, groups("a", 2), 0, 10**6))
    assert (got.new, got.cursor) == (1, 2) and stream_source_ids(r, q.name) == ["a-0", "a-1"]


def test_an_oversized_group_is_refused_before_anything_is_written(redis_url: str, queue_name: str) -> None:
    q = RolloutQueue.from_url(redis_url, queue_name, QueueConfig(max_payload_bytes=200))
    big = [SourceGroup("ok", "p", 1), SourceGroup("big", "x" * 500, 1)]
    with pytest.raises(PayloadTooLarge):
        q.run(produce(q.keys, "ds", "p", 0, big, 0, 10**6))
    assert q.run(read_cursor(q.keys, "ds")) == (0, None) and q.stats().submitted == 0


def test_a_plan_with_groups_the_queue_can_never_run_is_refused_before_anything_is_enqueued(
        redis_url: str, queue_name: str, r: redis.Redis, tmp_path: Path) -> None:
    """Issue 12 item 9: n > max_executing_samples was enqueued and then dead-lettered group by group."""
    records = load_records(write_jsonl(tmp_path / "d.jsonl", 3))
    with RolloutQueue.from_url(redis_url, queue_name, QueueConfig(max_executing_samples=4)) as small:
        before = dump(r, queue_name)
        with pytest.raises(GroupTooLarge, match="n=8 .* max_executing_samples=4"):
            run_producer(small, records, ProducePlan(name="ds", n=8, prompt_field="question"))
        assert dump(r, queue_name) == before and small.stats().submitted == 0


# -- the plan -------------------------------------------------------------------------------------


def test_template_epochs_and_a_seeded_shuffle_give_one_fixed_order(tmp_path: Path) -> None:
    records = load_records(write_jsonl(tmp_path / "d.jsonl", 6))
    plan = ProducePlan(name="ds", n=4, prompt_field=None, template="Q: {question}\nA:", epochs=2, shuffle=True,
                       seed=3, metadata_fields=("answer",))
    first = [GroupBuilder(plan, records).group(k) for k in range(12)]
    again = [GroupBuilder(plan, records).group(k) for k in range(12)]
    assert [g.source_id for g in first] == [g.source_id for g in again]
    assert len({g.source_id for g in first}) == 12  # every (epoch, record) once
    assert sorted(g.source_id for g in first[:6]) == sorted(f"ds:0:{i}" for i in range(6))
    assert [g.source_id.split(":")[2] for g in first[:6]] != [g.source_id.split(":")[2] for g in first[6:]]
    g = first[0]
    i = g.metadata["record"]
    assert g.prompt == f"Q: what is {i} + {i}?\nA:" and g.n == 4
    assert g.metadata == {"answer": 2 * i, "epoch": 0, "record": i}
    other = ProducePlan(name="ds", n=4, template="Q: {question}", prompt_field=None)
    assert plan.digest(records) != other.digest(records)


def test_a_prompt_field_and_an_id_field(tmp_path: Path) -> None:
    records = load_records(write_jsonl(tmp_path / "d.jsonl", 2))
    b = GroupBuilder(ProducePlan(name="ds", n=2, prompt_field="question", id_field="uid"), records)
    assert (b.group(1).source_id, b.group(1).prompt, b.source_id(1)) == ("u1:0", "what is 1 + 1?", "u1:0")
    assert set(b.group(0).metadata) == {"answer", "uid", "epoch", "record"}
    with pytest.raises(InvalidInput, match="no field"):
        GroupBuilder(ProducePlan(name="ds", n=2, prompt_field="nope"), records).group(0)
    with pytest.raises(InvalidInput, match="exactly one"):
        ProducePlan(name="ds", n=2, prompt_field="question", template="{question}")


def test_parquet_files_are_read_with_pyarrow(tmp_path: Path) -> None:
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"prompt": ["a", "b", "c"], "answer": [1, 2, 3]}), tmp_path / "d.parquet")
    records = load_records(tmp_path / "d.parquet")
    assert len(records) == 3 and dict(records[2]) == {"prompt": "c", "answer": 3}


def test_a_datasets_folder_is_read_with_load_from_disk(tmp_path: Path) -> None:
    datasets = pytest.importorskip("datasets")
    datasets.DatasetDict({"train": datasets.Dataset.from_dict({"prompt": ["a", "b"]})}).save_to_disk(tmp_path / "hf")
    records = load_records(tmp_path / "hf")
    assert len(records) == 2 and records[1]["prompt"] == "b"
    with pytest.raises(InvalidInput, match="splits"):
        load_records(tmp_path / "hf", split="test")


def test_unknown_files_and_missing_readers_say_what_to_do(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "d.csv").write_text("a,b\n")
    with pytest.raises(InvalidInput, match="unknown dataset kind"):
        load_records(tmp_path / "d.csv")
    monkeypatch.setitem(sys.modules, "datasets", None)  # import fails as if not installed
    (tmp_path / "folder").mkdir()
    with pytest.raises(ImportError, match="pip install datasets"):
        load_records(tmp_path / "folder")


# -- the loop: backpressure, exactly once across crashes -------------------------------------------


def test_backpressure_keeps_the_backlog_under_its_bound(q: Any, tmp_path: Path) -> None:
    records = load_records(write_jsonl(tmp_path / "d.jsonl", 30))
    plan = ProducePlan(name="ds", n=2, prompt_field="question")
    seen: list[int] = []
    stop = threading.Event()
    t = threading.Thread(target=run_producer, args=(q, records, plan),
                         kwargs={"max_backlog": 7, "batch_size": 5, "stop": stop, "poll_s": 0.01,
                                 "on_progress": lambda rep: seen.append(rep.backlog)})
    t.start()
    w = q.worker("w")
    reserved = 0
    try:
        while reserved < 30:
            wait_until(lambda: q.stats().backlog > 0 or reserved >= 30, 10, message="the producer to add groups")
            assert q.stats().backlog <= 7
            reserved += len(w.reserve(max_groups=3))
    finally:
        stop.set()
        t.join(10)
    assert max(seen) <= 7 and reserved == 30 and q.stats().submitted == 30


def produce_cli(url: str, queue: str, dataset: Path, *extra: str) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.Popen([sys.executable, "-m", "rollout_queue", "--url", url, "--queue", queue, "produce",
                             str(dataset), "--prompt-field", "question", "--n", "2", "--epochs", "2", "--shuffle",
                             "--seed", "7", "--no-progress", *extra], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


@pytest.mark.parametrize("when", ["blocked on a full backlog", "while enqueueing"])
def test_a_producer_killed_mid_way_and_restarted_enqueues_each_group_exactly_once(
        redis_url: str, queue_name: str, r: redis.Redis, tmp_path: Path, when: str) -> None:
    size = 150 if when.startswith("blocked") else 1500  # large enough that the kill lands mid-way
    dataset = write_jsonl(tmp_path / "d.jsonl", size)
    q = RolloutQueue.from_url(redis_url, queue_name, QueueConfig())
    bound = ["--max-backlog", "40"] if when.startswith("blocked") else ["--max-backlog", "0"]
    first = produce_cli(redis_url, queue_name, dataset, "--batch-size", "1", *bound)
    cursor = lambda: q.run(read_cursor(q.keys, "d.jsonl"))[0]  # noqa: E731
    wait_until(lambda: cursor() >= (40 if bound[1] == "40" else 60), 60, message="the producer to get mid-way")
    first.send_signal(signal.SIGKILL)
    first.communicate()
    stopped_at = cursor()
    assert 0 < stopped_at < 2 * size
    if bound[1] == "40":
        q.worker("w").reserve(max_groups=100)  # make room: the restarted producer can finish
        q.worker("w2").reserve(max_groups=100)
    second = produce_cli(redis_url, queue_name, dataset, "--batch-size", "50", "--max-backlog", "0")
    out, err = second.communicate(timeout=120)
    assert second.returncode == 0, err
    ids = stream_source_ids(r, queue_name)
    assert len(ids) == len(set(ids)) == 2 * size  # no group twice, none missing
    assert set(ids) == {f"d.jsonl:{e}:{i}" for e in (0, 1) for i in range(size)}
    assert cursor() == 2 * size and q.stats().submitted == 2 * size
    q.close()


def test_the_cli_refuses_a_field_and_a_template_together(redis_url: str, queue_name: str, tmp_path: Path) -> None:
    from rollout_queue.cli import main

    dataset = write_jsonl(tmp_path / "d.jsonl", 2)
    code = main(["--url", redis_url, "--queue", queue_name, "produce", str(dataset), "--prompt-field", "question",
                 "--template", "{question}"])
    assert code == 2
    # The producer never creates a missing queue unless told to: exit 4 and nothing written.
    assert main(["--url", redis_url, "--queue", queue_name, "produce", str(dataset), "--prompt-field", "question",
                 "--no-progress"]) == 4
    assert not list(redis.Redis.from_url(redis_url).scan_iter(match=f"rollout:{{{queue_name}*"))
    assert main(["--url", redis_url, "--queue", queue_name, "produce", str(dataset), "--prompt-field", "question",
                 "--no-progress", "--create"]) == 0
    assert RolloutQueue.from_url(redis_url, queue_name).stats().submitted == 2


def test_a_cli_template_decodes_backslash_escapes_as_a_shell_user_means_them(redis_url: str, queue_name: str,
                                                                            tmp_path: Path) -> None:
    from rollout_queue.cli import main
    from rollout_queue.cli.rl import unescape_template

    dataset = write_jsonl(tmp_path / "d.jsonl", 1)
    # What `--template 'Q: {question}\nA:'` passes from a shell: a backslash and an n.
    assert main(["--url", redis_url, "--queue", queue_name, "produce", str(dataset), "--template",
                 "Q: {question}\\nA:", "--no-progress", "--create"]) == 0
    (group,) = [r.group for r in RolloutQueue.from_url(redis_url, queue_name).worker("w").reserve(1)]
    assert "\n" in group.prompt and "\\" not in group.prompt and group.prompt.endswith("\nA:")
    assert unescape_template(r"a\tb\\n\x") == "a\tb\\n\\x"  # \\ is a backslash; \x stays as typed


def test_the_producer_acl_role_may_produce_and_nothing_more(redis_url: str, queue_name: str, r: redis.Redis,
                                                           tmp_path: Path) -> None:
    from rollout_queue.ops import acl

    RolloutQueue.from_url(redis_url, queue_name, QueueConfig()).close()  # the admin creates the queue
    rules = acl.role_rules(queue_name, "producer", "pw")
    r.execute_command("ACL", "SETUSER", rules.user, "reset", *rules.rules)
    try:
        host = redis_url.split("//")[1].split("/")[0]
        q = RolloutQueue.from_url(f"redis://{rules.user}:pw@{host}/0", queue_name)
        records = load_records(write_jsonl(tmp_path / "d.jsonl", 5))
        report = run_producer(q, records, ProducePlan(name="ds", n=2, prompt_field="question"), max_backlog=10)
        assert report.done and q.run(read_cursor(q.keys, "ds"))[0] == 5  # its script, and its cursor read
        with pytest.raises(Exception, match="(?i)noperm|no permissions"):
            q.worker("w").reserve(1)  # a producer may not reserve
        q.close()
    finally:
        r.execute_command("ACL", "DELUSER", rules.user)


def test_on_a_partitioned_queue_each_partition_keeps_its_own_cursor_and_a_resume_adds_each_group_once(
        redis_url: str, queue_name: str, r: redis.Redis, tmp_path: Path) -> None:
    q = RolloutQueue.from_url(redis_url, queue_name, QueueConfig(), partitions=3)
    records = load_records(write_jsonl(tmp_path / "d.jsonl", 40))
    plan = ProducePlan(name="ds", n=2, prompt_field="question")
    stop = threading.Event()
    # Shares of 2 groups each: the producer stops while some partitions are full and others ahead.
    first = run_producer(q, records, plan, max_backlog=6, batch_size=4, poll_s=0.01,
                         on_progress=lambda rep: rep.waiting and stop.set(), stop=stop)
    cursors = [q.run(read_cursor(keys, "ds"))[0] for keys in q.layout.keys]
    assert not first.done and max(cursors) <= 2 and sum(cursors) >= first.cursor
    q.worker("w").reserve(max_groups=100)  # make room; the rest goes in without a bound
    second = run_producer(q, records, plan, max_backlog=0, batch_size=7)
    assert second.done and second.started_at == first.cursor
    ids = [sid for name in q.partitions for sid in stream_source_ids(r, name)]
    assert sorted(ids) == sorted(f"ds:0:{i}" for i in range(40))  # no group twice, none missing
    cursors = [q.run(read_cursor(keys, "ds"))[0] for keys in q.layout.keys]
    assert sum(cursors) == 40 and q.stats().submitted == 40
    assert all(q.layout.names[q.layout.of_source(sid)] == name for name in q.partitions
               for sid in stream_source_ids(r, name))  # each group in its source_id's partition
    assert run_producer(q, records, plan).new == 0  # done: a rerun adds nothing
    with pytest.raises(InvalidInput, match="partitions"):
        run_producer(q, records, ProducePlan(name="ds2", n=2, prompt_field="question"), max_backlog=2)
    q.close()
