"""Staleness modes and the fairness rule (DESIGN: Staleness modes), against real servers.

``drop`` judges a group by its oldest token and regenerates stale work; ``continue`` judges it by
its newest tokens and keeps every prefix; ``pace`` evicts nothing finished for staleness
and counts the reserves admission control turned away. In every mode but ``pace`` a group evicted
for staleness ``max_stale_evictions`` times is judged at the version it completes under: the
longest rollouts are trained, not regenerated for ever.
"""

from __future__ import annotations

from typing import Any

import orjson
import pytest
import redis

from rollout_queue import QueueConfig, Sample
from rollout_queue.cli.admin import parse_setting
from rollout_queue.cli.common import UsageError
from rollout_queue.core.errors import InvalidInput
from rollout_queue.ops import actions
from tests.contract.lifecycle import keys, owners, zmembers
from tests.contract.worker_support import counter, group


def spanning(slot: int, versions: tuple[int, ...], per: int = 2) -> Sample:
    """A sample whose generation spanned weight updates: ``per`` tokens at each of ``versions``."""
    n = per * len(versions)
    return Sample(slot=slot, token_ids=tuple(range(n)), logprobs=(-0.5,) * n, version=versions[0],
                  segments=tuple((i * per, v) for i, v in enumerate(versions)))


def complete_one(q: Any, worker: str, samples: list[Sample]) -> str:
    w = q.worker(worker)
    [res] = w.reserve(1)
    assert w.complete(res.receipt, samples) == "buffered"
    return str(res.entry_id)


def history(raw: redis.Redis, queue_name: str, entry_id: str) -> dict[str, Any]:
    value = raw.hget(keys(queue_name)["history"], entry_id)
    return orjson.loads(value) if value else {}


def test_drop_judges_a_group_by_its_oldest_token(open_queue, raw, queue_name) -> None:
    q = open_queue(QueueConfig(max_staleness=1, staleness_mode="drop"))
    q.publish_version(3)
    q.submit([group("d", n=2)])
    eid = complete_one(q, "w1", [spanning(0, (0, 3)), spanning(1, (1, 3))])
    assert q.lease(1, block_ms=0) is None, "its oldest token (v0) is 3 versions old: stale"
    assert owners(raw, queue_name, [eid]) == ["@ready"]
    assert history(raw, queue_name, eid)["s"] == 1


def test_continue_judges_a_group_by_its_samples_newest_tokens(open_queue, raw, queue_name) -> None:
    q = open_queue(QueueConfig(max_staleness=1, staleness_mode="continue"))
    q.publish_version(3)
    q.submit([group("c", n=2)])
    complete_one(q, "w1", [spanning(0, (0, 3)), spanning(1, (1,))])  # newest: 3 and 1, judged by 3
    lease = q.lease(1, block_ms=0)
    assert lease is not None
    [g] = lease.groups
    # The group reports its oldest token, as the samples say: the trainer masks or corrects them.
    assert g.min_version == 0 and lease.staleness == (3, 3.0)
    lease.commit()


def test_continue_evicts_a_group_none_of_whose_samples_is_fresh(open_queue, raw, queue_name) -> None:
    q = open_queue(QueueConfig(max_staleness=1, staleness_mode="continue"))
    q.publish_version(4)
    q.submit([group("c", n=2)])
    eid = complete_one(q, "w1", [spanning(0, (0, 2)), spanning(1, (1, 2))])  # judged by 2: 4 - 2 > 1
    assert q.lease(1, block_ms=0) is None
    assert owners(raw, queue_name, [eid]) == ["@ready"]
    assert q.stats().evictions["stale"] == 1


def test_pace_never_evicts_finished_work_for_staleness(open_queue, raw, queue_name) -> None:
    q = open_queue(QueueConfig(max_staleness=0, staleness_mode="pace", batch_groups=4))
    q.submit([group("p", n=2)])
    eid = complete_one(q, "w1", [spanning(0, (0,)), spanning(1, (0,))])
    q.publish_version(5)
    assert q.reap().stale == 0
    assert zmembers(raw, queue_name, "buffer") == [eid]
    lease = q.lease(1, block_ms=0)
    assert lease is not None and lease.staleness == (5, 5.0)
    lease.commit()
    assert q.stats().evictions["stale"] == 0


def test_continue_is_the_default() -> None:
    """Chosen by scripts/bench_waste.py (DESIGN: Staleness modes): it wastes the least with the bound kept."""
    assert (QueueConfig().staleness_mode, QueueConfig().max_stale_evictions) == ("continue", 2)


def test_pace_needs_admission_control() -> None:
    with pytest.raises(InvalidInput, match="batch_groups"):
        QueueConfig(staleness_mode="pace", batch_groups=None)
    with pytest.raises(InvalidInput, match="staleness_mode"):
        QueueConfig(staleness_mode="sometimes")  # type: ignore[arg-type]


def test_admission_waits_count_the_reserves_admission_turned_away(open_queue, raw, queue_name) -> None:
    q = open_queue(QueueConfig(max_staleness=0, staleness_mode="pace", batch_groups=1))
    q.submit([group(f"a{i}", n=1) for i in range(3)])
    w = q.worker("w1")
    assert len(w.reserve(3)) == 1  # (0 + 0 + 1) x 1 admitted
    assert w.reserve(3) == []
    assert w.reserve(3) == []
    st = q.stats()
    assert st.counters["admission_waits"] == 2 and st.staleness_mode == "pace"


def test_fairness_rule_stops_evicting_a_group_after_k_stale_evictions(open_queue, raw, queue_name) -> None:
    q = open_queue(QueueConfig(max_staleness=0, max_stale_evictions=2, max_attempts=1, staleness_mode="drop"))
    q.submit([group("long", n=1)])
    for evictions in (1, 2):
        q.publish_version(evictions)
        eid = complete_one(q, f"w{evictions}", [spanning(0, (evictions - 1, evictions))])  # always a version behind
        assert q.lease(1, block_ms=0) is None, f"eviction {evictions}: stale, requeued (not dead: not counted)"
        assert history(raw, queue_name, eid)["s"] == evictions
    q.publish_version(3)
    complete_one(q, "w3", [spanning(0, (2, 3))])  # stale again, but evicted twice already: judged at 3
    lease = q.lease(1, block_ms=0)
    assert lease is not None, "judged at the version it completed under: fresh"
    [g] = lease.groups
    assert g.min_version == 2 and lease.staleness == (1, 1.0)  # the samples' truth: the trainer corrects it
    lease.commit()
    assert q.stats().evictions["stale"] == 2


def test_no_fairness_rule_with_k_zero(open_queue, raw, queue_name) -> None:
    q = open_queue(QueueConfig(max_staleness=0, max_stale_evictions=0, staleness_mode="drop"))
    q.submit([group("long", n=1)])
    for evictions in (1, 2, 3):
        q.publish_version(evictions)
        complete_one(q, f"w{evictions}", [spanning(0, (evictions - 1, evictions))])
        assert q.lease(1, block_ms=0) is None
    assert q.stats().evictions["stale"] == 3


def prefix(version: int) -> list[Sample]:
    return [Sample(slot=s, token_ids=(1, 2, 3), logprobs=(-0.25,) * 3, version=version, finish_reason="abort")
            for s in (0, 1)]


@pytest.mark.parametrize("mode,kept", [("drop", False), ("continue", True), ("pace", True)])
def test_a_stale_prefix_is_dropped_only_in_drop_mode(open_queue, raw, queue_name, mode: str, kept: bool) -> None:
    q = open_queue(QueueConfig(max_staleness=1, staleness_mode=mode, batch_groups=8))  # type: ignore[arg-type]
    q.publish_version(1)
    q.submit([group("x", n=2)])
    w = q.worker("w1")
    [res] = w.reserve(1)
    w.abort(res.receipt, "weight update", progress=prefix(version=0))
    q.publish_version(5)
    [res2] = w.reserve(1)
    assert bool(res2.progress) is kept
    assert counter(raw, queue_name, "partial_stale") == (0 if kept else 6)


def test_a_protected_group_keeps_its_stale_prefix_in_drop_mode(open_queue, raw, queue_name) -> None:
    q = open_queue(QueueConfig(max_staleness=0, max_stale_evictions=1, staleness_mode="drop"))
    q.publish_version(1)
    q.submit([group("x", n=2)])
    w = q.worker("w1")
    [res] = w.reserve(1)
    w.abort(res.receipt, "weight update", progress=prefix(version=1))
    q.publish_version(2)
    [res2] = w.reserve(1)
    assert res2.progress == (), "stale: dropped, and counted as its first eviction for staleness"
    assert history(raw, queue_name, str(res2.entry_id))["s"] == 1
    w.abort(res2.receipt, "weight update", progress=prefix(version=2))
    q.publish_version(4)
    [res3] = w.reserve(1)
    assert res3.progress, "evicted once (k=1): its prefix is kept from now on"


def test_config_set_parses_the_modes() -> None:
    assert parse_setting("staleness_mode=continue") == ("staleness_mode", "continue")
    assert parse_setting("max_stale_evictions=3") == ("max_stale_evictions", 3)
    with pytest.raises(UsageError, match="drop or continue or pace"):
        parse_setting("staleness_mode=none")


def test_config_set_changes_the_mode_for_every_client(open_queue, raw, queue_name) -> None:
    q = open_queue(QueueConfig(max_staleness=1, staleness_mode="drop"))
    q.publish_version(3)
    old, new, changed = q.run(actions.set_config(q.keys, {"staleness_mode": "continue"}))
    assert (old["staleness_mode"], new.staleness_mode, changed) == ("drop", "continue", 1)
    assert raw.hget(keys(queue_name)["meta"], "staleness_mode") == b"continue"
    q.submit([group("c", n=1)])
    complete_one(q, "w1", [spanning(0, (0, 3))])
    lease = q.lease(1, block_ms=0)
    assert lease is not None
    lease.commit()


@pytest.mark.parametrize("mode", ["continue", "pace"])
def test_strictly_on_policy_overrides_the_mode(open_queue, raw, queue_name, mode: str) -> None:
    """max_staleness=None: no token of an older version is trained, whatever staleness_mode says."""
    q = open_queue(QueueConfig(max_staleness=None, staleness_mode=mode, batch_groups=4))  # type: ignore[arg-type]
    q.publish_version(1)
    q.submit([group("o", n=1)])
    eid = complete_one(q, "w1", [spanning(0, (0, 1))])  # newest at the current version, oldest not
    assert q.lease(1, block_ms=0) is None
    assert owners(raw, queue_name, [eid]) == ["@ready"]
