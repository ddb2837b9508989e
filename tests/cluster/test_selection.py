"""Pure parts of scaling out, with no Redis: partition names and placement, bound splitting, the
partition selector, aggregated stats, routing of plain commands, and the fleet's weighted share."""

from __future__ import annotations

import zlib
from collections import Counter
from typing import Any

import pytest

from rollout_queue import InvalidInput, MalformedReservation, QueueConfig, Receipt, Reservation, SourceGroup
from rollout_queue.core.errors import GroupTooLarge
from rollout_queue.scale.fleet import BLOCK_SLICE_MS, WeightedShare, plan_reserve
from rollout_queue.core.models import QueueStats, check_group_sizes
from rollout_queue.scale.layout import (
    Layout,
    PartitionReceipt,
    Selector,
    partition_index,
    partition_names,
    largest_group,
    logical_config,
    split_config,
    sum_stats,
)
from rollout_queue.drivers.transport import routing_key

# -- partitions ------------------------------------------------------------------------------------


def test_one_partition_is_the_queue_itself() -> None:
    assert partition_names("q", 1) == ("q",)
    assert partition_names("q", 3) == ("q#0", "q#1", "q#2")
    assert Layout("q", 1).keys[0]["src"] == "rollout:{q}:src"
    assert Layout("q", 3).keys[2]["src"] == "rollout:{q#2}:src"
    with pytest.raises(ValueError):
        partition_names("q", 0)


def test_placement_is_a_stable_function_of_the_source_id() -> None:
    assert partition_index("p-17", 6) == zlib.crc32(b"p-17") % 6  # not Python's salted hash()
    spread = Counter(partition_index(f"p-{i}", 6) for i in range(6000))
    assert set(spread) == set(range(6)) and min(spread.values()) > 850


def test_receipts_name_their_partition() -> None:
    layout = Layout("q", 4)
    r = PartitionReceipt("1-0", 1, "w", "q#3")
    assert layout.index(r) == 3 and isinstance(r, Receipt)
    with pytest.raises(InvalidInput):
        layout.index(Receipt("1-0", 1, "w"))  # ambiguous with 4 partitions
    assert Layout("q", 1).index(Receipt("1-0", 1, "w")) == 0
    with pytest.raises(ValueError):
        PartitionReceipt("1-0", 1, "w", "{bad}")


def test_split_config_divides_the_logical_bounds_exactly() -> None:
    cfg = QueueConfig(max_executing_samples=1000, max_retained_groups=10, max_completed_groups=7, batch_groups=None)
    shares = split_config(cfg, 3)
    # floor(bound / P), the remainder spread over the first partitions: the shares sum to the bound
    # (ceil gave 334 x 3 = 1002 samples and 4 x 3 = 12 retained groups for logical bounds of 1000 and 10).
    assert [(c.max_executing_samples, c.max_retained_groups, c.max_completed_groups, c.batch_groups)
            for c in shares] == [(334, 4, 3, None), (333, 3, 2, None), (333, 3, 2, None)]
    assert logical_config(shares) == cfg and largest_group(shares) == 333
    assert split_config(cfg, 1) == (cfg,)
    for bound in range(4, 40):  # every split of every bound sums to it, no share 0
        for count in range(1, min(bound, 9) + 1):
            got = split_config(QueueConfig(max_completed_groups=bound, batch_groups=bound), count)
            assert sum(c.max_completed_groups for c in got) == bound == sum(c.batch_groups for c in got)
            assert min(c.max_completed_groups for c in got) == bound // count


def test_a_bound_below_the_partition_count_is_refused_with_what_to_raise() -> None:
    with pytest.raises(InvalidInput, match=r"max_completed_groups=3, batch_groups=2 is below partitions=4.*"
                                           r"Raise max_completed_groups and batch_groups to >= 4 or use fewer"):
        split_config(QueueConfig(max_completed_groups=3, batch_groups=2), 4)
    assert len(split_config(QueueConfig(max_completed_groups=4, batch_groups=4), 4)) == 4


def test_a_group_larger_than_the_smallest_share_is_refused_with_the_fix() -> None:
    shares = split_config(QueueConfig(max_executing_samples=30), 4)  # 8, 8, 7, 7
    assert largest_group(shares) == 7
    check_group_sizes([SourceGroup("s", "p", 7)], 7, 4, 30)
    with pytest.raises(GroupTooLarge) as exc:
        check_group_sizes([SourceGroup("ok", "p", 1), SourceGroup("big", "p", 8)], 7, 4, 30)
    assert (exc.value.source_id, exc.value.n, exc.value.limit, exc.value.partitions) == ("big", 8, 7, 4)
    assert "max_executing_samples to >= 32" in str(exc.value) and "fewer partitions" in str(exc.value)
    assert isinstance(exc.value, MalformedReservation)
    with pytest.raises(GroupTooLarge, match="raise max_executing_samples to >= 5 or submit smaller groups"):
        check_group_sizes([SourceGroup("big", "p", 5)], 4)


def test_selector_prefers_the_fullest_and_rotates_among_equals() -> None:
    sel = Selector(4, seed=1)
    for i, n in enumerate([100, 120, 5, 0]):
        sel.set_estimate(i, n)
    firsts = [sel.order(0.0)[0] for _ in range(4)]
    assert set(firsts) == {0, 1}  # 100 and 120 share a log2 bucket: they take turns
    assert all(o[-2:] == [2, 3] for o in (sel.order(0.0) for _ in range(4)))
    sel.took(0, 3, 10)  # fewer than asked: empty for now
    assert sel.estimate[0] == 0
    sel.took(1, 10, 10)
    assert sel.estimate[1] == 110
    sel.took(2, 0, 4, drained=False)  # refused by a hold or a bound: the work is still there
    assert sel.estimate[2] == 5
    sel.woke(0)  # its wake stream moved: unknown again, ranked with the fullest
    assert sel.estimate[0] is None and sel.order(0.0)[0] == 0


def test_selector_backs_off_an_unreachable_partition() -> None:
    sel = Selector(3, seed=0, down_s=1.0, max_down_s=4.0)
    sel.mark_down(1, 10.0)
    assert 1 not in sel.order(10.5) and 1 in sel.order(11.0)
    sel.mark_down(1, 11.0)
    sel.mark_down(1, 11.0)
    assert sel.down_until[1] == 15.0  # 1, 2, 4 (capped)
    sel.mark_up(1)
    assert 1 in sel.order(11.0)
    for i in range(3):
        sel.mark_down(i, 0.0)
    assert sorted(sel.order(0.0)) == [0, 1, 2]  # all down: try them all rather than nothing


def stats(**values: Any) -> QueueStats:
    base = dict(backlog=0, ready=0, executing_groups=0, executing_samples=0, completed=0, leased=0, retained=0,
                committed=0, filtered=0, dead=0, version=0, version_published=True, submitted=0, kept=0,
                workers_alive=0, workers_silent=0, active_leases=0, active_holds=0, staleness_max=None,
                staleness_mean=None, evictions={}, terminals={}, filtered_by_reason={},
                counters={"max_completed_groups": 10})
    return QueueStats(**{**base, **values})


def test_sum_stats() -> None:
    total = sum_stats([stats(backlog=3, version=5, completed=2, staleness_mean=1.0, staleness_max=2,
                             evictions={"stale": 1}),
                       stats(backlog=4, version=4, completed=6, staleness_mean=3.0, staleness_max=4,
                             version_published=False, evictions={"stale": 2}),
                       stats(backlog=1)], unreachable=1)
    assert (total.backlog, total.version, total.completed, total.staleness_max) == (8, 0, 8, 4)
    assert total.staleness_mean == pytest.approx((1 * 2 + 3 * 6) / 8)
    assert total.version_published is False and total.evictions == {"stale": 3}
    # Bounds are reported logical: the shares summed (of the partitions that answered), or the
    # logical config's when the caller has it (it still knows the unreachable partition's share).
    assert total.counters == {"max_completed_groups": 30, "partitions": 4, "partitions_unreachable": 1}
    parts = [stats(backlog=1), stats(backlog=2)]
    assert sum_stats(parts, 1, QueueConfig(max_completed_groups=41)).counters["max_completed_groups"] == 41


def test_routing_key_is_the_first_queue_key() -> None:
    assert routing_key(("XREAD", "BLOCK", 10, "COUNT", 1, "STREAMS", "rollout:{q#1}:wake:work", "0-0")) \
        == "rollout:{q#1}:wake:work"
    assert routing_key(("SCAN", 0, "MATCH", "rollout:{q}:*")) == "rollout:{q}:*"
    assert routing_key(("MEMORY", "USAGE", b"rollout:{q}:src")) == b"rollout:{q}:src"
    assert routing_key(("TIME",)) is None


def test_a_keyless_command_goes_to_the_node_its_route_names() -> None:
    """The views read the queue clock's TIME on the queue's own node (each cluster node has its own)."""
    from rollout_queue.core.keys import QueueKeys
    from rollout_queue.core.protocol import Command
    from rollout_queue.drivers.transport import _routing
    from rollout_queue.ops.views import server_ms

    assert _routing(Command(("TIME",))) is None
    keys = QueueKeys("q#4")
    assert _routing(Command(("TIME",), route=keys["clock"])) == keys["clock"]
    assert _routing(next(server_ms(keys))) == keys["clock"]


# -- the fleet's weighted share -------------------------------------------------------------------


def test_weighted_share_serves_in_proportion() -> None:
    share = WeightedShare([3, 1])
    picks = []
    for _ in range(400):
        (k, _), = share.plan(1, [0, 1])
        share.charge(k, 1, 8)
        picks.append(k)
    assert Counter(picks) == {0: 300, 1: 100}
    assert all(Counter(picks[i:i + 4]) == {0: 3, 1: 1} for i in range(4, 400, 4))  # smooth, not bursty


def test_an_idle_queue_banks_no_credit() -> None:
    share = WeightedShare([1, 1])
    for _ in range(50):  # queue 1 has no work: queue 0 is served alone
        share.mark_idle(1)
        share.charge(0, 1, 1)
    picks = []
    for _ in range(20):
        (k, _), = share.plan(1, [0, 1])
        share.charge(k, 1, 1)
        picks.append(k)
    assert Counter(picks) == {0: 10, 1: 10}  # back at an even split, no burst of 50 for queue 1


def test_quantum_keeps_a_worker_on_its_model() -> None:
    share = WeightedShare([1, 1], quantum_samples=64)
    picks = []
    for _ in range(64):
        (k, _), = share.plan(1, [0, 1])
        share.charge(k, 1, 8)
        picks.append(k)
    switches = sum(a != b for a, b in zip(picks, picks[1:]))
    assert Counter(picks) == {0: 32, 1: 32} and switches <= 8  # runs of 8-9 groups, not alternation


def reservation(i: int, n: int = 2) -> Reservation:
    return Reservation(Receipt(f"{i}-0", 1, "w"), SourceGroup(f"s{i}", "p", n), 0)


def drive(plan: Any, answer: Any) -> tuple[list[Any], list[tuple[int, int, int, int]]]:
    asks, got = [], None
    while True:
        try:
            ask = plan.send(got)
        except StopIteration as stop:
            return stop.value, asks
        asks.append(ask)
        got = answer(*ask)


def test_plan_reserve_skips_an_empty_queue_and_fills_from_the_others() -> None:
    share = WeightedShare([1, 1])
    out, asks = drive(plan_reserve(share, 6, 0, 0, lambda: 0.0),
                      lambda k, groups, samples, block: [] if k == 1 else [reservation(i) for i in range(groups)])
    assert [k for k, _ in out] == [0] * 6
    assert [(k, g) for k, g, _, _ in asks] == [(0, 3), (1, 3), (0, 3)]


def test_plan_reserve_respects_the_sample_budget_and_blocks_in_slices() -> None:
    share = WeightedShare([1, 1])
    out, asks = drive(plan_reserve(share, 10, 4, 0, lambda: 0.0),
                      lambda k, groups, samples, block: [reservation(i, 2) for i in range(min(groups, samples // 2))])
    assert sum(r.group.n for _, r in out) == 4
    now = [0.0]

    def nothing(k: int, groups: int, samples: int, block: int) -> list[Any]:
        now[0] += block / 1000
        return []

    out, asks = drive(plan_reserve(WeightedShare([1, 1]), 1, 0, 1000, lambda: now[0]), nothing)
    assert out == [] and now[0] >= 0.99
    assert max(block for *_, block in asks) == BLOCK_SLICE_MS and len(asks) >= 2 + 1000 // BLOCK_SLICE_MS
