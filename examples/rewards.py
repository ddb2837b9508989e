"""Rewards and a filter for ``rollout-queue worker --reward`` / ``--filter`` (docs/USAGE.md shows this file).

A worker imports ``module:function`` from its Python path: this file is ``examples.rewards`` from the
repository root; put your own module on PYTHONPATH, or in a package installed beside rollout-queue:

    PYTHONPATH=. rollout-queue worker --engine vllm --model ./policy \
        --reward examples.rewards:exact_answer --filter examples.rewards:some_right

Every reward gets the pristine group (its prompt and the metadata the producer stored with it, such
as the expected answer) and what the engine generated, and returns a finite number: an int or a
float. Anything else (None, True, NaN, a string), a wrong count of values or an exception fails the
attempt with that message; it counts toward max_attempts, so a prompt that always breaks the reward
ends in the dead letters, where ``rollout-queue dlq show`` names the reason.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Sequence

from rollout_queue import Sample, SourceGroup
from rollout_queue.workers.rewards import Generated, group_reward

_INTEGER = re.compile(r"-?\d+")


def exact_answer(group: SourceGroup, output: Generated) -> float:
    """Per sample (the default): called once per sample, on the worker's reward thread, one call at a
    time, so plain blocking code is fine and need not be thread-safe. 1.0 when the last integer of the
    completion is ``metadata["answer"]`` (the producer's ``--metadata-field answer``), else 0.0.
    ``output`` also has ``slot``, ``token_ids``, ``logprobs``, ``finish_reason`` and, for a
    trajectory, ``turns``."""
    found = _INTEGER.findall(output.text)
    return 1.0 if found and int(found[-1]) == int(group.metadata["answer"]) else 0.0


@group_reward
def shortest_right(group: SourceGroup, outputs: Sequence[Generated]) -> list[float]:
    """Per group (``@group_reward``): one call with all of a group's outputs, returning one reward
    per output in the order given. For rewards that compare samples, or score them in one batch:
    here a right answer earns 1.0 when it is the shortest right one, 0.5 when longer."""
    right = [exact_answer(group, o) == 1.0 for o in outputs]
    shortest = min((len(o.token_ids) for o, ok in zip(outputs, right) if ok), default=0)
    return [(1.0 if len(o.token_ids) == shortest else 0.5) if ok else 0.0 for o, ok in zip(outputs, right)]


async def judged(group: SourceGroup, output: Generated) -> float:
    """``async def`` (per sample or with ``@group_reward``): awaited on the worker's event loop, a
    group's samples at once, so calls to a remote grader overlap. It must never block (no
    ``time.sleep``, no blocking client): the loop also runs generation and the heartbeat."""
    await asyncio.sleep(0)  # stands in for `await grader.post(...)`
    return exact_answer(group, output)


def some_right(group: SourceGroup, samples: Sequence[Sample]) -> str | None:
    """A filter: it sees the scored samples (``sample.reward``) and returns None (or False) to keep the
    group, or a reason (True: the function's name) to settle it ``filtered``: consumed, never
    trained. Here: a group with no right sample teaches GRPO nothing."""
    return None if any(s.reward for s in samples) else "no sample right"
