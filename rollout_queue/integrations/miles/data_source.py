"""miles' data source, backed by the queue's reservations: each prompt miles' engines run is owned.

``--data-source-path rollout_queue.integrations.miles.QueueDataSource``. Read at
radixark/miles@31f1ca961a94cb860cec3b2dea34ec332bfa8f76 (``miles/rollout/data_source.py``: the
``DataSource`` ABC, ``get_samples(n) -> list[list[Sample]]``, ``add_samples``, ``save(rollout_id)``,
``load(rollout_id=None)``, ``get_buffer_length``; ``RolloutManager`` builds it as ``cls(args)``,
calls ``save(k)`` after the model of rollout ``k`` is saved and ``load(start_rollout_id - 1)`` at
start, and ``close()`` at dispose).

- Prompts: with ``--prompt-data`` (and ``--rollout-global-dataset``), miles' own ``Dataset`` is
  loaded exactly as ``RolloutDataSource`` loads it and fed into the queue by the exactly-once
  producer in a background thread (its cursor lives in Redis, so a restarted job neither repeats
  nor skips a prompt; ``ROLLOUT_MILES_PRODUCER`` names it, default ``miles``). Without it, prompts
  come from any other producer (``rollout-queue produce``).
- ``get_samples(n)`` reserves ``n`` groups: each prompt group carries its attempt's receipt
  (``metadata["rollout_queue"]``), which ``QueueDataBuffer.put`` settles. It runs on miles' rollout
  event loop and waits there only while nothing is queued (the feed keeps ``2 * rollout_batch_size``
  ahead); after ``ROLLOUT_MILES_WAIT_S`` (default 600) it raises ``StreamStarved`` naming what is
  missing (no producer, no data left), never waiting forever.
- ``add_samples``: miles recycles aborted and stale prompts here; the queue has already requeued
  them (a new attempt of the same entry), so they are not added twice.
- ``save`` / ``load``: ledger.py, rules 3 and 4.
"""

from __future__ import annotations

import logging
import math
import os
import time
from typing import Any

from rollout_queue.core.errors import IntegrationConfigError, StreamStarved
from rollout_queue.integrations.convert import framework_class
from rollout_queue.integrations.feed import DatasetFeed
from rollout_queue.integrations.miles.codec import prompt_fields, prompt_group
from rollout_queue.integrations.miles.ledger import MilesLedger, ledger_for
from rollout_queue.rl.producer import ProducePlan

log = logging.getLogger("rollout_queue.integrations.miles")

__all__ = ["MilesRecords", "QueueDataSource"]

_Base: Any = framework_class("DataSource", "miles.rollout.data_source") or object


class MilesRecords:
    """miles' ``Dataset`` as the producer's records: the prompt (messages as JSON text) and its record."""

    def __init__(self, dataset: Any) -> None:
        self.samples = dataset.samples

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, index: int) -> dict[str, Any]:
        sample = self.samples[index]
        prompt = sample.prompt if isinstance(sample.prompt, str) else _json_text(sample.prompt)
        return {"prompt": prompt, "miles": prompt_fields(sample)}


def _json_text(value: Any) -> str:
    import orjson

    return orjson.dumps(value).decode()


class QueueDataSource(_Base):
    """miles' data source, its prompts reserved from the queue (module docstring)."""

    def __init__(self, args: Any, *, ledger: MilesLedger | None = None) -> None:
        self.args = args
        self._ledger = ledger or ledger_for(args)
        self._sample_cls = framework_class("Sample", "miles.utils.types")
        if self._sample_cls is None:
            raise IntegrationConfigError("QueueDataSource runs inside miles: miles.utils.types does not import here")
        self.wait_s = float(os.environ.get("ROLLOUT_MILES_WAIT_S") or 600.0)
        self.sample_group_index = self.sample_index = 0
        self.metadata: dict[str, Any] = {}
        self.dataset: Any = None
        self._feed: DatasetFeed | None = None
        if getattr(args, "rollout_global_dataset", False) and getattr(args, "prompt_data", None):
            self._start_feed()

    def _start_feed(self) -> None:
        from miles.rollout.data_source import RolloutDataSource

        args = self.args
        self.dataset = RolloutDataSource(args).dataset  # miles' own loading: template, filters, keys
        records = MilesRecords(self.dataset)
        epochs = getattr(args, "num_epoch", None) or max(1, math.ceil(
            (getattr(args, "num_rollout", None) or 1) * args.rollout_batch_size / max(1, len(records))))
        plan = ProducePlan(os.environ.get("ROLLOUT_MILES_PRODUCER") or "miles", n=args.n_samples_per_prompt,
                           prompt_field="prompt", metadata_fields=("miles",), epochs=int(epochs),
                           shuffle=bool(getattr(args, "rollout_shuffle", False)),
                           seed=int(getattr(args, "rollout_seed", 0) or 0))
        self._feed = DatasetFeed(self._ledger.queue, records, plan, max_backlog=2 * args.rollout_batch_size).start()

    def get_samples(self, num_samples: int) -> list[list[Any]]:
        """``num_samples`` prompt groups, each an owned reservation (its receipt in the metadata)."""
        out: list[list[Any]] = []
        started = time.monotonic()
        while len(out) < num_samples:
            got = self._ledger.worker.reserve(max_groups=num_samples - len(out), block_ms=200)
            for reservation in got:
                self._ledger.sources[reservation.entry_id] = dict(reservation.group.metadata.get("miles") or {})
                out.append(prompt_group(reservation, self._sample_cls, first_group=self.sample_group_index,
                                        first_index=self.sample_index))
                self.sample_group_index += 1
                self.sample_index += reservation.group.n
            if not got:
                self._check_starved(num_samples - len(out), time.monotonic() - started)
        return out

    def _check_starved(self, want: int, waited: float) -> None:
        if self._feed is not None:
            self._feed.check()  # the producer thread's error, raised here
        exhausted = self._feed is not None and self._feed.exhausted()
        if waited >= self.wait_s or exhausted:
            stats = self._ledger.queue.stats()
            if waited >= self.wait_s or not (stats.backlog or stats.ready):
                raise StreamStarved(self._ledger.queue.name, want, waited, stats,
                                    exhausted=exhausted and not (stats.backlog or stats.ready))

    def add_samples(self, samples: list[list[Any]]) -> None:
        """miles recycling an aborted or stale prompt group: the queue requeued it already."""
        log.debug("recycled prompt groups are requeued by the queue, not added again",
                  extra={"groups": len(samples)})

    def save(self, rollout_id: int) -> None:
        self._ledger.save(rollout_id)

    def load(self, rollout_id: int | None = None) -> None:
        requeued = self._ledger.load(rollout_id)
        log.info("queue restored", extra={"rollout_id": rollout_id, "requeued": requeued})

    def get_buffer_length(self) -> int | None:
        stats = self._ledger.queue.stats()
        return int(stats.backlog + stats.ready)

    def close(self) -> None:
        """miles' ``RolloutManager.dispose``: stop the feed, hand back what this process reserved."""
        if self._feed is not None:
            self._feed.stop()
        self._ledger.close()
