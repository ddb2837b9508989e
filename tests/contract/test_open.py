"""Contract of open.lua: create a queue, or check a client's config and library version against it.

Header outcomes: {'ok', created, stored config...} and {'config_mismatch', field, stored, given}.
DESIGN: `ConfigMismatch` when a client's config or script library version differs from the stored
one; `config=None` adopts the stored config.
"""

from __future__ import annotations

import pytest
import redis

from rollout_queue import ConfigMismatch, QueueConfig
from rollout_queue.core import protocol as p
from rollout_queue.core.scripts import LIBRARY_VERSION
from tests.contract.conftest import snapshot
from tests.contract.worker_support import keys, meta, send

CFG = QueueConfig(max_executing_samples=16, max_retained_groups=8, max_completed_groups=4, max_staleness=1,
                  batch_groups=2, buffer_order="lifo", worker_timeout_s=0.2, max_attempts=2)


def test_open_creates_the_queue_with_its_config(open_queue, raw: redis.Redis, queue_name: str) -> None:
    q = open_queue(CFG)
    assert q.config == CFG
    stored = meta(raw, queue_name)
    assert stored["library"] == LIBRARY_VERSION
    assert {k: stored[k] for k in CFG.to_meta()} == CFG.to_meta()
    groups = raw.xinfo_groups(keys(queue_name)["src"])
    assert [g["name"] for g in groups] == [b"rollout"]


def test_open_reply_says_whether_it_created_and_returns_the_stored_config(open_queue, queue_name: str) -> None:
    q = open_queue(CFG)
    flat = [x for kv in CFG.to_meta().items() for x in kv]
    other = keys(queue_name + "#0")  # a partition name: the queue_name fixture deletes its keys too
    built = p.build(other, "open", library=LIBRARY_VERSION, mode="check", config=flat)
    first, second = send(q, built), send(q, built)
    assert (p.s(first[0]), first[1]) == ("ok", 1)
    assert (p.s(second[0]), second[1]) == ("ok", 0)
    stored = {k: p.s(v) for k, v in p.pairs(first[2:]).items()}
    assert stored == {"library": LIBRARY_VERSION, **CFG.to_meta()}


def test_reopen_with_the_same_config_changes_nothing(open_queue, raw: redis.Redis, queue_name: str) -> None:
    open_queue(CFG).submit([])
    before = snapshot(raw, queue_name)
    q = open_queue(CFG)
    assert q.config == CFG
    assert snapshot(raw, queue_name) == before


@pytest.mark.parametrize("change", [{"max_attempts": 5}, {"max_staleness": None}, {"buffer_order": "fifo"},
                                    {"batch_groups": None}, {"worker_timeout_s": 0.3}])
def test_a_different_config_raises_config_mismatch(open_queue, raw: redis.Redis, queue_name: str,
                                                   change: dict) -> None:
    open_queue(CFG)
    before = snapshot(raw, queue_name)
    other = CFG.replace(**change)
    with pytest.raises(ConfigMismatch) as info:
        open_queue(other)
    (name, _), = [(k, v) for k, v in other.to_meta().items() if CFG.to_meta()[k] != v]
    assert (info.value.field, info.value.stored, info.value.given) == (name, CFG.to_meta()[name],
                                                                       other.to_meta()[name])
    assert info.value.queue == queue_name
    assert snapshot(raw, queue_name) == before


def test_config_none_adopts_the_stored_config(open_queue, raw: redis.Redis, queue_name: str) -> None:
    open_queue(CFG)
    before = snapshot(raw, queue_name)
    q = open_queue(None)
    assert q.config == CFG
    assert snapshot(raw, queue_name) == before


def test_config_none_on_a_new_queue_stores_the_defaults(open_queue) -> None:
    assert open_queue(None).config == QueueConfig()


@pytest.mark.parametrize("config", [CFG, None], ids=["check", "adopt"])
def test_a_different_library_version_raises_config_mismatch(open_queue, raw: redis.Redis, queue_name: str,
                                                            config: QueueConfig | None) -> None:
    open_queue(CFG)
    raw.hset(keys(queue_name)["meta"], "library", "0.another-build")
    before = snapshot(raw, queue_name)
    with pytest.raises(ConfigMismatch) as info:
        open_queue(config)
    assert (info.value.field, info.value.stored, info.value.given) == ("library", "0.another-build",
                                                                       LIBRARY_VERSION)
    assert snapshot(raw, queue_name) == before


def test_open_recreates_a_deleted_stream_and_its_consumer_group(open_queue, raw: redis.Redis,
                                                               queue_name: str) -> None:
    q = open_queue(CFG)
    raw.delete(keys(queue_name)["src"])
    open_queue(CFG)
    assert [g["name"] for g in raw.xinfo_groups(keys(queue_name)["src"])] == [b"rollout"]
    assert q.submit([]) == []


# -- data layout 3 -> 4: the counters left meta (issue 29 item 7) ----------------------------------


def _as_layout_3(raw: redis.Redis, queue_name: str) -> dict[bytes, bytes]:
    """Turn a live queue back into what layout 3 kept: every counter in meta, no counters hash, a
    layout-3 library. Returns the counters it moved."""
    k = keys(queue_name)
    counters = raw.hgetall(k["counters"])
    raw.hset(k["meta"], mapping={**counters, b"library": b"3.oldbuild00000"})
    raw.delete(k["counters"])
    return counters


def _busy(q) -> None:
    from tests.contract.worker_support import group, samples
    q.submit([group(f"s{i}") for i in range(4)])
    w = q.worker("w")
    got = w.reserve(3)
    w.complete(got[0].receipt, samples(2))
    w.fail(got[1].receipt, "oom")
    w.filter(got[2].receipt, "all rewards equal")


def test_a_layout_3_queue_is_migrated_whole_by_the_first_open_that_may_write_meta(
        open_queue, raw: redis.Redis, queue_name: str) -> None:
    """A user upgrading mid-run keeps the run: the first open of the new version that may write meta
    (trainer, reaper, admin) moves every counter out of meta into counters, in one script, and the
    queue goes on from the same numbers."""
    q = open_queue(CFG)
    _busy(q)
    before = q.stats()
    moved = _as_layout_3(raw, queue_name)
    assert b"executing_groups" in moved and b"filtered_reason:all_rewards_equal" in moved
    q2 = open_queue(None)
    k = keys(queue_name)
    assert raw.hgetall(k["counters"]) == moved
    assert not set(raw.hkeys(k["meta"])) & set(moved), "a counter stayed in meta"
    assert raw.hget(k["meta"], "library").decode() == LIBRARY_VERSION
    after = q2.stats()
    assert (after.counters, after.filtered_by_reason, after.executing_groups, after.retained) == (
        before.counters, before.filtered_by_reason, before.executing_groups, before.retained)
    snap = snapshot(raw, queue_name)
    open_queue(CFG)  # a second open is a plain check: nothing moves again
    assert snapshot(raw, queue_name) == snap
    assert q2.worker("w2").reserve(1)  # and the queue works on


def test_a_layout_3_queue_with_a_corrupt_counter_is_refused_untouched(open_queue, raw: redis.Redis,
                                                                      queue_name: str) -> None:
    from rollout_queue import ScriptError
    q = open_queue(CFG)
    _busy(q)
    _as_layout_3(raw, queue_name)
    raw.hset(keys(queue_name)["meta"], "retained", "x")
    before = snapshot(raw, queue_name)
    with pytest.raises(ScriptError, match="corrupt counter in meta: retained"):
        open_queue(None)
    assert snapshot(raw, queue_name) == before


def test_a_library_of_another_layout_is_still_a_mismatch(open_queue, raw: redis.Redis, queue_name: str) -> None:
    open_queue(CFG)
    raw.hset(keys(queue_name)["meta"], "library", "2.ancient")
    before = snapshot(raw, queue_name)
    with pytest.raises(ConfigMismatch) as info:
        open_queue(None)
    assert info.value.stored == "2.ancient" and snapshot(raw, queue_name) == before


def test_open_lua_migrates_from_the_previous_layout_to_this_one() -> None:
    """open.lua spells the layouts; they must follow DATA_LAYOUT when it is bumped again."""
    import re

    from rollout_queue.core.scripts import DATA_LAYOUT, SCRIPTS
    m = re.search(r"local FROM_LAYOUT, TO_LAYOUT = '(\d+)', '(\d+)'", SCRIPTS["open"].source)
    assert m and (int(m.group(1)), int(m.group(2))) == (DATA_LAYOUT - 1, DATA_LAYOUT)
