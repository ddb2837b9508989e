"""The adapters that import without their framework open the queue the project's environment names
(REDIS_URL / ROLLOUT_QUEUE) when their own configuration leaves it out, against a private Redis.
verl's adapters import verl at module level: tests/integrations/test_verl_*.py check theirs in
verl's side environment (scripts/test_frameworks.sh verl)."""

from __future__ import annotations

import pytest

from rollout_queue import RolloutQueue
from rollout_queue.core.errors import IntegrationConfigError, QueueNotFound
from rollout_queue.integrations.nemo_rl.sampler import QueueSampler


def test_the_nemo_rl_sampler_opens_the_queue_the_environment_names(private_redis_url: str, fresh_name: str,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    RolloutQueue.from_url(private_redis_url, fresh_name).close()
    monkeypatch.setenv("REDIS_URL", private_redis_url)
    monkeypatch.setenv("ROLLOUT_QUEUE", fresh_name)
    sampler = QueueSampler(None)
    assert sampler.stream.queue.name == fresh_name
    sampler.close()
    # the sampler's own keys win: the queue it names does not exist, the environment's does
    with pytest.raises(QueueNotFound, match=f"{fresh_name}-cfg"):
        QueueSampler(None, queue=f"{fresh_name}-cfg")
    monkeypatch.delenv("REDIS_URL")
    with pytest.raises(IntegrationConfigError, match=r"async_rl\.sampler\.url or REDIS_URL"):
        QueueSampler(None)
    sampler = QueueSampler(None, url=private_redis_url)
    assert sampler.stream.queue.name == fresh_name
    sampler.close()
