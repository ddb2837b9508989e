"""Where a framework adapter finds its queue: the project's one environment convention.

Every process of this project (the CLI, the workers, the examples) reads the Redis URL from
``REDIS_URL`` and the queue name from ``ROLLOUT_QUEUE`` (README "Conventions"). The adapters run
inside another framework's processes (verl's Ray workers, a slime / miles job, NeMo-RL's
controller), so an operator sets those two variables once in the job's environment and every
process, ours or the framework's, finds the same queue. This module owns the two names and the
order they are read in (explicit configuration first, then the environment); no adapter spells
them. It opens nothing: the caller opens the queue.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from rollout_queue.core.errors import IntegrationConfigError

__all__ = ["QUEUE_ENV", "URL_ENV", "queue_address"]

#: The Redis URL of the queue, as every process of the project reads it.
URL_ENV = "REDIS_URL"
#: The queue's name, as every process of the project reads it.
QUEUE_ENV = "ROLLOUT_QUEUE"


def queue_address(url: Any = None, queue: Any = None, *, needs: str, keys: tuple[str, str] | None = None,
                  environ: Mapping[str, str] | None = None) -> tuple[str, str]:
    """The ``(url, queue)`` an adapter opens: each from its explicit setting when given (non-empty),
    else from ``REDIS_URL`` / ``ROLLOUT_QUEUE``.

    ``needs`` names the adapter in the error ("the queue sampler"); ``keys`` are the adapter's own
    configuration keys for the two, when it has any (verl's ``sampler_kwargs.url``), so the message
    offers both ways. Raises IntegrationConfigError naming each missing one and how to set it.
    """
    env = os.environ if environ is None else environ
    found = (str(url or env.get(URL_ENV) or ""), str(queue or env.get(QUEUE_ENV) or ""))
    if all(found):
        return found
    names = (f"{keys[0]} or {URL_ENV}", f"{keys[1]} or {QUEUE_ENV}") if keys else (URL_ENV, QUEUE_ENV)
    missing = " and ".join(f"{what} ({name})" for what, name, value in
                           zip(("the Redis URL", "the queue name"), names, found, strict=True) if not value)
    how = "the configuration key, or the environment variable" if keys else "the environment variable"
    raise IntegrationConfigError(
        f"{needs} has no {missing}: set {how} in every process that opens the queue (a Ray job: "
        f"--runtime-env-json '{{\"env_vars\": {{\"{URL_ENV}\": ..., \"{QUEUE_ENV}\": ...}}}}')")
