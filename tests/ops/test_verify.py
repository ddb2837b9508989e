"""`rollout-queue verify`: the queue's promise checked from its own records, on real queues built
through the public API, as the read-only operator role. It passes where the promise holds (also
across a restore, whose groups are legitimately in two commits lines, and past the commits stream's
cap), and fails, naming the entries, where the records were broken by hand (an XACK of an owned
entry, a duplicate commit line, a settled line on an owned entry)."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator

import pytest
import redis

from rollout_queue import QueueConfig, RolloutQueue, SourceGroup
from rollout_queue.core.flows import Flow
from rollout_queue.devtools.local_server import LocalServer
from rollout_queue.ops import acl, verify
from rollout_queue.ops.view_models import VerifyReport
from tests.conftest import _delete_queue_keys
from tests.ops.conftest import ALIVE, Cli, KnownState, samples

#: The known state's groups by state (tests/ops/conftest.py).
KNOWN = {"backlog": 2, "ready": 1, "executing": 2, "completed": 1, "leased": 1, "committed": 1, "filtered": 0,
         "dead": 1, "lost": 0}


@pytest.fixture
def operator_url(server: LocalServer, known_state: KnownState, r: redis.Redis) -> Iterator[str]:
    """A URL logged in as the known state's read-only operator role."""
    rules = acl.role_rules(known_state.queue, "operator", password="pw-operator")
    r.execute_command("ACL", "SETUSER", rules.user, *rules.rules)
    host = server.url.split("//")[1].split("/")[0]
    yield f"redis://{rules.user}:pw-operator@{host}/0"
    r.execute_command("ACL", "DELUSER", rules.user)


def run_json(cli: Cli, url: str, queue: str, *args: str) -> tuple[int, dict]:
    code, out, err = cli(url, queue, "verify", "--json", *args)
    assert code in (0, 1), err
    return code, json.loads(out)


def test_a_healthy_queue_passes_and_final_names_what_still_moves(cli: Cli, known_state: KnownState,
                                                                 operator_url: str) -> None:
    code, report = run_json(cli, operator_url, known_state.queue)
    assert code == 0 and report["verdict"] == "PASS" and report["problems"] == []
    assert report["submitted"] == 9 and report["states"] == KNOWN
    assert (report["commit_lines"], report["commit_lines_trimmed"], report["committed_twice"]) == (1, 0, 0)
    # --final: the run is not over; the seven groups still owned or waiting are the one problem.
    code, report = run_json(cli, operator_url, known_state.queue, "--final")
    assert code == 1 and [p["kind"] for p in report["problems"]] == ["not_settled"]
    assert report["problems"][0]["groups"] == 7 and "backlog 2" in report["problems"][0]["what"]
    code, out, err = cli(operator_url, known_state.queue, "verify")
    assert code == 0 and "PASS: the 9 submitted groups" in out, err
    assert cli(known_state.url, "no-such-queue", "verify")[0] == 4


def test_a_broken_ledger_fails_and_names_the_entries(cli: Cli, known_state: KnownState, r: redis.Redis,
                                                     operator_url: str) -> None:
    st, k = known_state, known_state.q.keys
    r.xack(k["src"], "rollout", st.ids[3])                       # g3 (completed) released by hand: lost
    r.xadd(k["commits"], {"lease": "forged", "ids": st.ids[1]})  # g1 committed a second time
    r.xadd(k["commits"], {"lease": "forged", "ids": st.ids[7]})  # g7 (backlog) "committed"
    r.hset(k["ledger"], st.ids[4], f"s|dead|1|{ALIVE}|forged")   # g4 (ready) settled while owned
    code, report = run_json(cli, operator_url, st.queue)
    assert code == 1 and report["verdict"] == "FAIL"
    found = {p["kind"]: (p["groups"], p["examples"]) for p in report["problems"]}
    assert found == {"lost": (1, [st.ids[3]]), "committed_twice": (1, [st.ids[1]]),
                     "settled_owned": (1, [st.ids[4]]), "commit_not_settled": (1, [st.ids[7]])}, found
    assert report["states"]["lost"] == 1 and report["states"]["completed"] == 0
    code, out, _ = cli(operator_url, st.queue, "verify")
    assert code == 1 and "FAIL: 4 problem(s)" in out and st.ids[3] in out and "LOST" in out


def test_a_restore_is_no_double_commit_and_a_trimmed_commits_stream_is_said(cli: Cli, redis_url: str,
                                                                            queue_name: str) -> None:
    """Restore puts committed groups back: each is trained again and is in two commits lines, which
    the history explains. Past commits_maxlen the oldest lines are trimmed: groups committed in them
    are counted, not failed, and the report says how many lines went."""
    q = RolloutQueue.from_url(redis_url, queue_name, QueueConfig(commits_maxlen=10))
    q.submit([SourceGroup(f"g-{i}", f"prompt {i}", 1) for i in range(150)])
    w = q.worker("w")

    def train(groups: int, step: int | None = None) -> None:
        for r in w.reserve(groups):
            w.complete(r.receipt, samples(1, 0))
        for _ in range(groups):
            lease = q.lease(1)
            assert lease is not None
            lease.commit(step=step)

    train(2, step=1)
    assert q.restore(0) == 2  # the trainer resumed from checkpoint 0: both groups go back to ready
    train(2, step=1)
    code, report = run_json(cli, redis_url, queue_name)
    assert code == 0, report["problems"]
    assert report["recommitted_after_restore"] == 2 and report["committed_twice"] == 0
    for _ in range(3):
        train(min(64, q.stats().backlog))
    code, report = run_json(cli, redis_url, queue_name, "--final")
    assert code == 0, report["problems"]
    assert report["states"]["committed"] == 150 and report["commit_lines_trimmed"] >= 100
    assert report["committed_unlisted"] > 0 and report["commit_lines"] < 152
    out = cli(redis_url, queue_name, "verify")[1]
    assert "trimmed past commits_maxlen" in out
    q.close()


def test_every_page_is_bounded_and_the_answer_does_not_depend_on_the_page_size(
        known_state: KnownState, monkeypatch: pytest.MonkeyPatch) -> None:
    whole = known_state.q.run(verify.verify(known_state.q.keys))
    pages: list[int] = []

    def spy(flow: Flow[VerifyReport]) -> Flow[VerifyReport]:
        """The flow, unchanged, noting the page size of every read that takes one."""
        try:
            op = next(flow)
            while True:
                args = op.args  # type: ignore[union-attr]
                if "COUNT" in args:
                    pages.append(int(args[args.index("COUNT") + 1]))
                elif args[0] == "XPENDING":
                    pages.append(int(args[5]))
                op = flow.send((yield op))
        except StopIteration as done:
            return done.value  # type: ignore[no-any-return]

    monkeypatch.setattr(verify, "PAGE", 2)
    monkeypatch.setattr(verify, "BACKLOG_PAGE", 1)
    paged = known_state.q.run(spy(verify.verify(known_state.q.keys)))
    assert paged.states == whole.states == KNOWN and paged.ok and whole.ok
    assert len(pages) > 8 and max(pages) <= 2  # many reads, each one small page


def test_a_partitioned_queue_is_checked_partition_by_partition(cli: Cli, redis_url: str, r: redis.Redis) -> None:
    name = f"vp-{uuid.uuid4().hex[:8]}"
    q = RolloutQueue.from_url(redis_url, name, partitions=2)
    try:
        q.submit([SourceGroup(f"g-{i}", f"prompt {i}", 1) for i in range(6)])
        code, report = run_json(cli, redis_url, name)
        assert code == 0 and report["submitted"] == 6 and report["states"]["backlog"] == 6
        w = q.worker("w")
        (res,) = w.reserve(1)
        keys = q.layout.keys[q.layout.names.index(res.receipt.queue)]
        r.xack(keys["src"], "rollout", res.entry_id)  # lost in its partition
        code, report = run_json(cli, redis_url, name)
        (problem,) = report["problems"]
        assert code == 1 and problem["kind"] == "lost"
        assert problem["examples"] == [f"{res.receipt.queue}/{res.entry_id}"]
    finally:
        q.close()
        _delete_queue_keys(redis_url, name)
