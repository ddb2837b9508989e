"""core/flows/ is one module per role, and reads as the one module it was (issue 13 item 2)."""

from __future__ import annotations

import inspect

import pytest

from rollout_queue.core import flows

#: Every name the single flows.py module offered (and tests, scripts, processes use).
OLD_NAMES = """BATCH COMPLETE_BATCH COMPLETE_BATCH_BYTES MAX_BLOCK_CHUNK_MS MAX_NAME MAX_REAP_BUDGET MAX_URI MAX_VERSION
PRUNE_CALLS_PER_PASS REINDEX_BATCH SUBMIT_BATCH SUBMIT_BATCH_BYTES Clock Flow T abort checkpoint close_worker commit
complete complete_many dead_letters encode_source extend fail filter_group finish_interrupted heartbeat hold_open
hold_release hold_wait lease new_id open_queue prune publish_version reap reject requeue_dead_letter reserve restore
rollback stats submit version _wait _completion_args _complete_chunk _hand_back _batches _reap_worker""".split()


@pytest.mark.parametrize("name", OLD_NAMES)
def test_every_name_of_the_old_module_is_still_there(name: str) -> None:
    assert getattr(flows, name) is not None
    assert name in flows.__all__ or name.startswith("_")


def test_each_public_name_is_the_role_modules_own_object() -> None:
    for name in flows.__all__:
        value = getattr(flows, name)
        homes = [m for m in flows.ROLES if vars(m).get(name) is value]
        assert homes, name
        if inspect.isfunction(value):
            assert value.__module__.startswith("rollout_queue.core.flows."), name


def test_lease_and_reap_are_the_flows_not_modules() -> None:
    assert inspect.isgeneratorfunction(flows.lease) and inspect.isgeneratorfunction(flows.reap)
    from rollout_queue.core.flows import lease, reap  # noqa: F401  (the functions, as before)
    assert lease is flows.trainer.lease and reap is flows.reaper.reap


def test_a_bound_set_on_the_package_reaches_every_role_module(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(flows, "BATCH", 2)
    assert [m.BATCH for m in flows.ROLES if "BATCH" in vars(m)] == [2] * sum("BATCH" in vars(m) for m in flows.ROLES)
    assert flows.trainer.BATCH == flows.reaper.BATCH == flows.worker.BATCH == flows.queue.BATCH == 2
    monkeypatch.undo()
    assert flows.trainer.BATCH == flows.base.BATCH == 32


def test_a_bound_set_by_assignment_is_what_the_flow_sends() -> None:
    from rollout_queue.core.keys import QueueKeys

    saved, flows.BATCH = flows.BATCH, 1
    try:
        call = next(flows.rollback(QueueKeys("q"), "L", "t"))
    finally:
        flows.BATCH = saved
    assert call.args[-1] == 1
