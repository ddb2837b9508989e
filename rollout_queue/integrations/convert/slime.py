"""slime / miles: a leased group -> a list of ``Sample`` (one prompt group of a rollout), and the
queue as the rollout source behind ``--rollout-function-path`` with its data source's save/load.

Read at THUDM/slime 624b824a898ab0ec1fcb4d373004c7f3852bf515 (``slime/utils/types.py``,
``slime/rollout/data_source.py``, ``slime/rollout/base_types.py``) and radixark/miles
31f1ca961a94cb860cec3b2dea34ec332bfa8f76 (``miles/utils/types.py``; the fields used here exist in
both): ``tokens`` = prompt + response, ``response_length``, ``loss_mask`` and ``rollout_log_probs``
over the response only, ``weight_versions`` a list of strings (one per generate call: here one per
policy version the response's tokens were generated under, oldest first; each token's own version
rides in ``metadata["token_versions"]``), ``status`` ``Sample.Status`` (COMPLETED, TRUNCATED for a ``length`` finish, ABORTED for ``abort``). A custom
``generate_rollout(args, rollout_id, data_source, evaluation=False)`` returns ``list[list[Sample]]``
(prompt groups of n samples); ``DataSource.save(rollout_id)`` / ``load(rollout_id)`` run at
checkpoint and resume.
"""

from __future__ import annotations

from typing import Any

from rollout_queue.api.lease import Lease
from rollout_queue.api.queue import RolloutQueue
from rollout_queue.core.errors import IntegrationConfigError
from rollout_queue.core.models import CompletedGroup
from rollout_queue.integrations.convert import flat, framework_class
from rollout_queue.integrations.environment import queue_address
from rollout_queue.integrations.stream import TrainingStream

__all__ = ["QueueDataSource", "QueueRollout", "generate_rollout", "to_samples"]

_STATUS = {"length": "TRUNCATED", "abort": "ABORTED"}


def to_samples(group: CompletedGroup, tokenizer: Any = None, *, group_index: int = 0, first_index: int = 0,
               as_dicts: bool = False) -> list[Any]:
    """slime (or miles) ``Sample``s of one group (dicts of their fields when neither is installed or
    ``as_dicts``; ``status`` is then the status's name). ``response`` is decoded when ``tokenizer``
    is given."""
    rows = []
    for i, s in enumerate(flat(group, tokenizer)):
        m = len(s.response_ids)
        rows.append({
            "group_index": group_index, "index": first_index + i, "prompt": group.group.prompt,
            "tokens": s.prompt_ids + s.response_ids, "response_length": m,
            "response": tokenizer.decode(s.response_ids) if tokenizer is not None else "",
            "reward": s.reward, "loss_mask": s.loss_mask, "rollout_log_probs": s.logprobs,
            "weight_versions": [str(v) for v in dict.fromkeys(v for v in s.token_versions if v >= 0)]
                               or [str(s.version)],
            "status": _STATUS.get(s.finish_reason, "COMPLETED"),
            "metadata": {**dict(group.group.metadata), "queue_entry": s.entry_id, "source_id": s.source_id,
                         "token_versions": s.token_versions},
        })
    cls = None if as_dicts else framework_class("Sample", "slime.utils.types", "miles.utils.types")
    if cls is None:
        return rows
    return [cls(**{**row, "status": cls.Status[row["status"]]}) for row in rows]


class QueueRollout:
    """The queue behind slime's rollout function and data-source checkpoints.

    ``generate_rollout`` leases ``groups`` completed groups per rollout (default
    ``args.rollout_batch_size``) and commits the lease at once, before slime trains it, as queue step
    ``rollout_id + 1`` (slime's rollout ids start at 0 and it resumes with ``load(start_rollout_id -
    1)``, -1 on a fresh start; the queue's steps start at 0, "nothing trained"). Why at hand-out, not once the rollout is known trained: slime saves its model
    (``actor_model.save_model(k)``) before it calls ``DataSource.save(k)``, with nothing between, so
    a commit deferred to ``save(k)`` leaves a window (a kill between the two) in which rollouts
    trained into checkpoint ``k`` are still leased, come back at their deadline and are trained
    twice. A commit at hand-out is exactly-once relative to checkpoints either way: a checkpoint at
    ``k >= rollout_id`` covers it, and the resume from an earlier one (``load(c)``, ``c < rollout_id``)
    requeues it. A kill between the lease and its commit leaves the lease to its deadline (nothing
    was trained). ``save(k)`` lets the queue drop the data checkpoint ``k`` covers (queue step
    ``k + 1``); ``load(k)`` restores the queue to it.
    """

    def __init__(self, queue: RolloutQueue, *, groups: int | None = None, tokenizer: Any = None,
                 wait_s: float = 600.0, lease_timeout_s: float | None = None) -> None:
        self.queue, self.groups, self.tokenizer = queue, groups, tokenizer
        self.stream = TrainingStream(queue, groups_per_step=groups or 1, wait_s=wait_s,
                                     lease_timeout_s=lease_timeout_s)

    def generate_rollout(self, args: Any, rollout_id: int, data_source: Any = None,
                         evaluation: bool = False) -> list[list[Any]]:
        """slime's custom rollout function (``--rollout-function-path module.obj.generate_rollout``)."""
        if evaluation:
            raise IntegrationConfigError("evaluation rollouts are not served from the training queue: set "
                                         f"--eval-function-path {SLIME_EVAL_FUNCTION} (slime's own, on its engines)")
        want = self.groups or int(getattr(args, "rollout_batch_size"))
        lease = self.stream.take(want)  # committed here, not by the stream's ack()
        assert lease is not None  # take() returns None only when a stop event is set
        out = []
        n = 0
        for gi, group in enumerate(lease.groups):
            out.append(to_samples(group, self.tokenizer, group_index=gi, first_index=n))
            n += len(out[-1])
        lease.commit(step=rollout_id + 1)
        return out

    def save(self, rollout_id: int) -> None:
        """``DataSource.save``: the model of rollout ``rollout_id`` is saved; the queue drops what it covers."""
        self.stream.checkpoint(rollout_id + 1)

    def load(self, rollout_id: int | None = None) -> None:
        """``DataSource.load``: resumed from ``rollout_id`` (slime passes ``start_rollout_id - 1``, so
        -1 on a fresh start: every group an earlier, crashed run committed is requeued; None: nothing
        to restore)."""
        if rollout_id is not None:
            self.stream.restore(rollout_id + 1)


# -- by configuration: slime's --data-source-path and --rollout-function-path ------------------------

#: slime's own evaluation rollout (``slime/rollout/sglang_rollout.py`` at 624b824a), on slime's engines
SLIME_EVAL_FUNCTION = "slime.rollout.sglang_rollout.generate_rollout"
THIS_ROLLOUT_FUNCTION = f"{__name__}.generate_rollout"
_SourceBase: Any = framework_class("DataSource", "slime.rollout.data_source") or object


class QueueDataSource(_SourceBase):
    """slime's data source (``--data-source-path rollout_queue.integrations.convert.slime.QueueDataSource``)
    holding the ``QueueRollout`` that ``generate_rollout`` below serves rollouts from.

    Read at THUDM/slime@624b824a (``slime/rollout/data_source.py``: the ``DataSource`` ABC,
    ``get_samples``, ``add_samples``, ``save``, ``load``, ``__len__``; ``slime/ray/rollout.py``
    builds it as ``cls(args)`` and hands it to the rollout function). The queue comes from
    ``REDIS_URL`` / ``ROLLOUT_QUEUE``; ``ROLLOUT_SLIME_LEASE_TIMEOUT_S`` tunes ``QueueRollout``.
    Refused at start rather than at the first evaluation or resume: evaluation rollouts, which are
    not served from the training queue (with ``--eval-interval`` set, ``--eval-function-path`` must
    name another function: slime's own, ``slime.rollout.sglang_rollout.generate_rollout``, evaluates
    on slime's engines); and ``--disable-rollout-global-dataset``, because slime then calls neither
    ``save`` nor ``load`` (``train.py``, ``slime/ray/placement_group.py``), so a resumed run would
    train again what its checkpoint covers and skip what the lost steps trained.
    """

    def __init__(self, args: Any, *, queue: RolloutQueue | None = None) -> None:
        import os

        eval_path = getattr(args, "eval_function_path", None) or getattr(args, "rollout_function_path", None)
        if getattr(args, "eval_interval", None) is not None and eval_path == THIS_ROLLOUT_FUNCTION:
            raise IntegrationConfigError(
                "evaluation rollouts are not served from the training queue (they would consume training groups): "
                f"add --eval-function-path {SLIME_EVAL_FUNCTION} (slime's own, on its engines) or drop --eval-interval")
        if getattr(args, "rollout_global_dataset", True) is False:
            raise IntegrationConfigError(
                "--disable-rollout-global-dataset is set: slime then never calls the data source's save/load, so "
                "the queue could not be restored to the checkpoint a resumed run starts from: drop that flag")
        if queue is None:
            queue = RolloutQueue.from_url(*queue_address(needs="QueueDataSource"), create=False)
        timeout = os.environ.get("ROLLOUT_SLIME_LEASE_TIMEOUT_S")
        self.args = args
        self.rollout = QueueRollout(queue, lease_timeout_s=float(timeout) if timeout else None)

    def get_samples(self, num_samples: int) -> list[list[Any]]:
        raise IntegrationConfigError("the queue's workers generate the samples: set --rollout-function-path "
                                     f"{THIS_ROLLOUT_FUNCTION}, which leases completed groups instead")

    def add_samples(self, samples: list[list[Any]]) -> None:
        raise IntegrationConfigError("groups go back to the queue by rollback, not through the data source: "
                                     "a custom buffer filter cannot be combined with QueueDataSource")

    def save(self, rollout_id: int) -> None:
        self.rollout.save(rollout_id)

    def load(self, rollout_id: int | None = None) -> None:
        self.rollout.load(rollout_id)

    def __len__(self) -> int:
        stats = self.rollout.queue.stats()
        return int(stats.backlog + stats.ready + stats.executing_groups + stats.completed)


def generate_rollout(args: Any, rollout_id: int, data_source: Any, evaluation: bool = False) -> list[list[Any]]:
    """slime's rollout function (``--rollout-function-path rollout_queue.integrations.convert.slime.generate_rollout``),
    served by the ``QueueDataSource`` slime was configured with."""
    if not isinstance(data_source, QueueDataSource):
        raise IntegrationConfigError("generate_rollout needs --data-source-path "
                                     "rollout_queue.integrations.convert.slime.QueueDataSource, got "
                                     f"{type(data_source).__name__}")
    return data_source.rollout.generate_rollout(args, rollout_id, data_source, evaluation)
