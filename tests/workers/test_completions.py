"""workers/completions.py: concurrent completes of one worker coalesce into complete_many calls, and
every attempt still gets exactly its own outcome or its own refusal."""

from __future__ import annotations

import asyncio
from typing import Any

from rollout_queue import AsyncRolloutQueue, QueueConfig, Receipt, Sample, SourceGroup, StaleReceipt
from rollout_queue.workers.completions import BatchingWorker


def _samples(n: int) -> list[Sample]:
    return [Sample(slot=i, token_ids=(i,)) for i in range(n)]


async def _setup(url: str, name: str, groups: int) -> tuple[AsyncRolloutQueue, BatchingWorker, list[Any], list[str]]:
    q = await AsyncRolloutQueue.from_url(url, name, QueueConfig(max_executing_samples=64))
    await q.submit([SourceGroup(f"s{i}", "p", 2) for i in range(groups)])
    w = BatchingWorker(q.worker("w1"))
    got = await w.reserve(groups)
    calls: list[str] = []
    real = w.complete_many

    async def counted(items: Any) -> Any:
        calls.append(",".join(r.entry_id for r, _ in items))
        return await real(items)

    w.complete_many = counted  # type: ignore[method-assign]
    return q, w, got, calls


def test_concurrent_completes_share_calls_and_keep_their_own_outcomes(redis_url: str, queue_name: str) -> None:
    async def go() -> None:
        q, w, got, calls = await _setup(redis_url, queue_name, 6)
        stale = Receipt(got[5].entry_id, 2, "w1")  # attempt 2 was never granted
        outcomes = await asyncio.gather(*(w.complete(x.receipt, _samples(2)) for x in got[:5]),
                                        w.complete(stale, _samples(2)), return_exceptions=True)
        assert outcomes[:5] == ["buffered"] * 5
        assert isinstance(outcomes[5], StaleReceipt) and outcomes[5].entry_id == got[5].entry_id
        # The sender task starts on the loop's next turn: all six completes are waiting by then.
        assert calls == [",".join(x.entry_id for x in got)]
        assert await w.complete(got[5].receipt, _samples(2)) == "buffered"
        assert (await q.stats()).completed == 6
        await q.close()

    asyncio.run(go())


def test_a_caller_cancelled_before_its_batch_leaves_is_not_sent(redis_url: str, queue_name: str) -> None:
    async def go() -> None:
        q, w, got, calls = await _setup(redis_url, queue_name, 3)
        first = asyncio.create_task(w.complete(got[0].receipt, _samples(2)))
        await asyncio.sleep(0)  # the first call is on its way
        second = asyncio.create_task(w.complete(got[1].receipt, _samples(2)))
        third = asyncio.create_task(w.complete(got[2].receipt, _samples(2)))
        await asyncio.sleep(0)
        second.cancel()
        assert await first == "buffered" and await third == "buffered"
        assert second.cancelled()
        assert calls == [got[0].entry_id, got[2].entry_id]
        stats = await q.stats()
        assert (stats.completed, stats.executing_groups) == (2, 1)  # close() would requeue the second
        await q.close()

    asyncio.run(go())
