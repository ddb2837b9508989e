"""Contract of derive_admission.lua (and open.lua's part in it): a trainer sizes the admission control
its queue's config left to it, once; what a creator or operator set is never changed.

Header outcomes: {'ok', stored batch_groups, set 0|1} and {'config_mismatch', 'library', stored, given}.
DESIGN, "Capacity": ``batch_groups`` DERIVED (QueueConfig's default, stored -1) is off until a trainer
derives it; None (0) is an explicit opt-out; a number is a bound. Opening with it left DERIVED adopts
the stored value, so a resumed trainer whose config does not name it never meets ConfigMismatch.
"""

from __future__ import annotations

import pytest
import redis

from rollout_queue import ConfigMismatch, InvalidInput, QueueConfig, ScriptError, SourceGroup
from rollout_queue.core.config import DERIVED
from tests.contract.conftest import snapshot
from tests.contract.lifecycle import check_header, meta
from tests.contract.worker_support import call

CFG = QueueConfig(max_staleness=1, max_executing_samples=64)


def test_header_matches_builder() -> None:
    check_header("derive_admission", ["meta", "counters"], ["library", "batch_groups"])


def test_a_config_that_leaves_it_unset_stores_minus_one_and_admits_without_bound(open_queue, raw: redis.Redis,
                                                                                 queue_name: str) -> None:
    q = open_queue(CFG)
    assert CFG.batch_groups is DERIVED and q.config.batch_groups is DERIVED
    assert meta(raw, queue_name)["batch_groups"] == "-1"
    q.submit([SourceGroup(f"g{i}", "p", 1) for i in range(10)])
    assert len(q.worker("w").reserve(max_groups=10, max_samples=10)) == 10  # no admission control yet


def test_derive_sets_it_once_and_admission_follows(open_queue, raw: redis.Redis, queue_name: str) -> None:
    q = open_queue(CFG)
    changes = int(meta(raw, queue_name).get("config_changes", 0))
    assert q.derive_admission(2) == 2
    assert q.config.batch_groups == 2 and meta(raw, queue_name)["batch_groups"] == "2"
    assert int(meta(raw, queue_name)["config_changes"]) == changes + 1
    before = snapshot(raw, queue_name)
    assert q.derive_admission(7) == 2  # a second trainer (or a resumed one) adopts the first value
    assert snapshot(raw, queue_name) == before
    q.submit([SourceGroup(f"g{i}", "p", 1) for i in range(10)])
    # (version 0 + max_staleness 1 + 1) * 2: four groups admitted, no more
    assert len(q.worker("w").reserve(max_groups=10, max_samples=10)) == 4


@pytest.mark.parametrize("given", [None, 3], ids=["off", "set"])
def test_a_value_the_creator_set_is_never_changed(open_queue, raw: redis.Redis, queue_name: str,
                                                  given: int | None) -> None:
    q = open_queue(CFG.replace(batch_groups=given))
    before = snapshot(raw, queue_name)
    assert q.derive_admission(5) == given
    assert q.config.batch_groups == given
    assert snapshot(raw, queue_name) == before


def test_reopening_with_it_unset_adopts_what_was_derived(open_queue, raw: redis.Redis, queue_name: str) -> None:
    """The resumed trainer: its config leaves batch_groups unset, the queue's was derived since."""
    open_queue(CFG).derive_admission(4)
    before = snapshot(raw, queue_name)
    again = open_queue(CFG)
    assert again.config.batch_groups == 4 and again.config == CFG.replace(batch_groups=4)
    assert snapshot(raw, queue_name) == before
    for other in (None, 5):  # a value given explicitly is still compared
        with pytest.raises(ConfigMismatch) as info:
            open_queue(CFG.replace(batch_groups=other))
        assert (info.value.field, info.value.stored) == ("batch_groups", "4")
    with pytest.raises(ConfigMismatch):  # and the other fields still are
        open_queue(CFG.replace(max_staleness=2))
    assert snapshot(raw, queue_name) == before


def test_an_unset_config_opening_a_queue_with_it_off_keeps_it_off(open_queue, raw: redis.Redis,
                                                                  queue_name: str) -> None:
    open_queue(CFG.replace(batch_groups=None))
    q = open_queue(CFG)  # no ConfigMismatch, and the opt-out stands
    assert q.config.batch_groups is None and q.derive_admission(3) is None


def test_another_library_version_is_refused_and_nothing_written(open_queue, raw: redis.Redis,
                                                                queue_name: str) -> None:
    q = open_queue(CFG)
    before = snapshot(raw, queue_name)
    reply = call(q, "derive_admission", library="0.another-build", batch_groups=2)
    assert reply[0] == "config_mismatch" and [v.decode() for v in reply[1:3]] == ["library", meta(raw, queue_name)["library"]]
    assert snapshot(raw, queue_name) == before


def test_bad_values_are_refused_before_anything_is_written(open_queue, raw: redis.Redis, queue_name: str) -> None:
    q = open_queue(CFG)
    before = snapshot(raw, queue_name)
    for bad in (0, -1, 1.5, True, "2"):
        with pytest.raises(InvalidInput):
            q.derive_admission(bad)
    from rollout_queue.core.scripts import LIBRARY_VERSION

    for bad in (0, -1, 1.5, "x", 2**53):  # ... and the script refuses them too, for a raw call
        with pytest.raises(ScriptError, match="ROLLOUTQ bad batch_groups"):
            call(q, "derive_admission", library=LIBRARY_VERSION, batch_groups=bad)
    assert snapshot(raw, queue_name) == before and meta(raw, queue_name)["batch_groups"] == "-1"


def test_a_partitioned_queue_derives_each_share(open_queue, raw: redis.Redis, queue_name: str) -> None:
    q = open_queue(CFG, partitions=3)
    assert q.config.batch_groups is DERIVED
    assert q.derive_admission(8) == 8
    assert [c.batch_groups for c in q.configs] == [3, 3, 2]
    assert [meta(raw, name)["batch_groups"] for name in q.layout.names] == ["3", "3", "2"]
    assert open_queue(CFG, partitions=3).config.batch_groups == 8  # the resumed trainer adopts the sum
    assert q.stats().counters["batch_groups"] == 8
    small = open_queue(CFG, name=queue_name + "#s", partitions=3)  # under the fixture's cleanup pattern
    assert small.derive_admission(1) == 3  # a share of 0 would admit nothing: one per partition at least
