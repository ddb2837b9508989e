"""The producer: a dataset -> source groups in the queue, exactly once, under a backlog bound.

What it owns:
1. Reading records: JSONL (read lazily by line offset), Parquet (``pyarrow``, optional) and a Hugging
   Face ``datasets`` folder written by ``save_to_disk`` (``datasets``, optional).
2. The plan: which record is enqueued at each position. Position ``k`` is record
   ``order(epoch)[k % N]`` of epoch ``k // N``, where ``order`` is the identity or a shuffle seeded
   by ``(seed, epoch)``; so the same plan always lists the same groups in the same order, and a
   restarted producer needs only its cursor to know what comes next. A source_id names the record
   and the epoch (``<name>:<epoch>:<record index>`` or ``<id field>:<epoch>``), never the position.
3. The loop: batches of positions go through ``produce.lua`` (groups + cursor in one atomic step,
   see core/flows/producer.py); while the backlog is at its bound the script refuses and the loop waits.
4. On a partitioned queue (P > 1) one script call cannot span partitions, so each partition keeps
   its own cursor: the number of the plan's groups it holds, in plan order. A batch of positions is
   split by the partition of each source_id and each partition gets one produce call with the
   groups it does not hold yet, compare-and-set on its own cursor; the producer's position is the
   first one some partition lacks (docs/DESIGN.md, "The producer on a partitioned queue").

It must not decide anything across round trips (the script checks the cursor and the bound), and it
never imports the optional readers until a file of their kind is opened.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping, Protocol, Sequence

import orjson

from rollout_queue.api.queue import RolloutQueue
from rollout_queue.core.errors import InvalidInput
from rollout_queue.core.flows.queue import SUBMIT_BATCH
from rollout_queue.core.models import SourceGroup, check_group_sizes
from rollout_queue.core.flows.producer import Produced, check_producer_name, produce, read_cursor

__all__ = ["DatasetRecords", "JsonlRecords", "ProducePlan", "ProduceReport", "load_records", "run_producer"]


class DatasetRecords(Protocol):
    """Random access to a dataset's records (dicts): all the producer needs of a source."""

    def __len__(self) -> int: ...

    def __getitem__(self, index: int) -> Mapping[str, Any]: ...


class JsonlRecords:
    """A JSONL file read lazily: one pass records line offsets, each access reads one line."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self._offsets: list[int] = []
        with self.path.open("rb") as f:
            offset = 0
            for line in f:
                if line.strip():
                    self._offsets.append(offset)
                offset += len(line)
        self._file = self.path.open("rb")
        self._lock = threading.Lock()  # one file position, shared by every reader of this source

    def __len__(self) -> int:
        return len(self._offsets)

    def __getitem__(self, index: int) -> Mapping[str, Any]:
        with self._lock:
            self._file.seek(self._offsets[index])
            line = self._file.readline()
        try:
            record = orjson.loads(line)
        except orjson.JSONDecodeError as exc:
            raise InvalidInput(f"{self.path}: record {index} is not JSON: {exc}") from exc
        if not isinstance(record, dict):
            raise InvalidInput(f"{self.path}: record {index} is not a JSON object")
        return record

    def close(self) -> None:
        self._file.close()


class _ArrowRecords:
    """A pyarrow Table (Parquet) with row access."""

    def __init__(self, table: Any) -> None:
        self.table = table

    def __len__(self) -> int:
        return int(self.table.num_rows)

    def __getitem__(self, index: int) -> Mapping[str, Any]:
        row: Mapping[str, Any] = self.table.slice(index, 1).to_pylist()[0]
        return row


def load_records(path: str | os.PathLike[str], split: str = "train") -> DatasetRecords:
    """Open a dataset by its path: ``*.jsonl`` / ``*.json`` / ``*.ndjson``, ``*.parquet``, or a folder
    saved with ``datasets``' ``save_to_disk`` (a DatasetDict's ``split`` is used).

    Raises InvalidInput for an unknown kind, ImportError (with the package to install) for a reader
    that is not installed.
    """
    p = Path(path)
    if p.is_dir():
        return _load_hf_folder(p, split)
    suffix = p.suffix.lower()
    if suffix in (".jsonl", ".json", ".ndjson"):
        return JsonlRecords(p)
    if suffix == ".parquet":
        try:
            import pyarrow.parquet as pq
        except ImportError as exc:
            raise ImportError(f"reading {p.name} needs pyarrow: pip install pyarrow") from exc
        return _ArrowRecords(pq.read_table(p))
    raise InvalidInput(f"{p}: unknown dataset kind; use .jsonl, .parquet or a datasets save_to_disk folder")


def _load_hf_folder(path: Path, split: str) -> DatasetRecords:
    try:
        import datasets
    except ImportError as exc:
        raise ImportError(f"reading the datasets folder {path} needs the datasets package: "
                          "pip install datasets") from exc
    loaded = datasets.load_from_disk(str(path))
    if isinstance(loaded, datasets.DatasetDict):
        if split not in loaded:
            raise InvalidInput(f"{path} has splits {sorted(loaded)}, not {split!r}: pass --split")
        loaded = loaded[split]
    records: DatasetRecords = loaded
    return records


@dataclass(frozen=True)
class ProducePlan:
    """How records become source groups: the prompt, ``n``, epochs and order. Part of the plan's
    digest, so a producer name cannot resume with different settings."""

    name: str
    n: int
    prompt_field: str | None = "prompt"
    template: str | None = None
    epochs: int = 1
    shuffle: bool = False
    seed: int = 0
    id_field: str | None = None
    metadata_fields: tuple[str, ...] | None = None

    def __post_init__(self) -> None:
        check_producer_name(self.name)
        if (self.prompt_field is None) == (self.template is None):
            raise InvalidInput("give exactly one of a prompt field and a prompt template")
        if not isinstance(self.n, int) or self.n < 1 or self.epochs < 1:
            raise InvalidInput(f"n and epochs must be >= 1, got n={self.n} epochs={self.epochs}")

    def digest(self, records: DatasetRecords) -> str:
        """A short digest of the plan and of the dataset's identity (size, first and last record)."""
        size = len(records)
        ends = [records[0], records[size - 1]] if size else []
        spec = {**self.__dict__, "records": size, "ends": ends}
        blob = json.dumps(spec, sort_keys=True, default=str).encode()
        return hashlib.sha1(blob).hexdigest()[:16]


class GroupBuilder:
    """Position -> SourceGroup for one plan over one dataset (the producer's only notion of order)."""

    def __init__(self, plan: ProducePlan, records: DatasetRecords,
                 tokenize: Callable[[str], Sequence[int]] | None = None) -> None:
        self.plan, self.records, self.tokenize = plan, records, tokenize
        self.size = len(records)
        self.total = self.size * plan.epochs
        self._orders: dict[int, list[int]] = {}

    def order(self, epoch: int) -> list[int]:
        if epoch not in self._orders:
            indices = list(range(self.size))
            if self.plan.shuffle:
                random.Random(f"{self.plan.seed}:{epoch}").shuffle(indices)
            self._orders = {epoch: indices}  # one epoch at a time: positions are read in order
        return self._orders[epoch]

    def group(self, position: int) -> SourceGroup:
        epoch, offset = divmod(position, self.size)
        index = self.order(epoch)[offset]
        record = self.records[index]
        plan = self.plan
        if plan.template is not None:
            try:
                prompt = plan.template.format_map(record)
            except (KeyError, IndexError, ValueError) as exc:
                raise InvalidInput(f"record {index}: template {plan.template!r} failed: {exc!r}") from exc
            used: set[str] = set()
        else:
            assert plan.prompt_field is not None
            if plan.prompt_field not in record:
                raise InvalidInput(f"record {index} has no field {plan.prompt_field!r} (fields: {sorted(record)})")
            prompt, used = str(record[plan.prompt_field]), {plan.prompt_field}
        keep = plan.metadata_fields if plan.metadata_fields is not None else [k for k in record if k not in used]
        metadata = {k: record[k] for k in keep if k in record}
        metadata.update({"epoch": epoch, "record": index})
        ids = tuple(self.tokenize(prompt)) if self.tokenize is not None else None
        return SourceGroup(self._source_id(epoch, index, record), prompt, plan.n, metadata, ids)

    def source_id(self, position: int) -> str:
        """The source_id of the group at ``position``: it names the record and the epoch."""
        epoch, offset = divmod(position, self.size)
        index = self.order(epoch)[offset]
        return self._source_id(epoch, index, self.records[index] if self.plan.id_field else {})

    def _source_id(self, epoch: int, index: int, record: Mapping[str, Any]) -> str:
        if self.plan.id_field is not None:
            return f"{record[self.plan.id_field]}:{epoch}"
        return f"{self.plan.name}:{epoch}:{index}"


@dataclass
class ProduceReport:
    """Where the producer stands (passed to ``on_progress`` after every call, returned at the end)."""

    total: int
    cursor: int = 0
    started_at: int = 0
    new: int = 0
    backlog: int = 0
    waiting: bool = False
    done: bool = False


def run_producer(queue: RolloutQueue, records: DatasetRecords, plan: ProducePlan, *, max_backlog: int = 0,
                 batch_size: int = 64, stop: threading.Event | None = None, poll_s: float = 0.25,
                 tokenize: Callable[[str], Sequence[int]] | None = None,
                 on_progress: Callable[[ProduceReport], None] | None = None) -> ProduceReport:
    """Enqueue every position of ``plan`` from the producer's cursor on; returns when all are in
    the queue or ``stop`` is set. ``max_backlog`` (0: none) bounds the never-reserved groups.

    Killed at any instant, it restarts where Redis says it stopped: no group twice, none missing.
    Raises ProducerConflict (another instance, or another plan under this name), and GroupTooLarge
    before enqueueing anything if the plan's ``n`` exceeds the queue's max_executing_samples.
    """
    batch_size = min(batch_size, SUBMIT_BATCH)  # one produce call is bounded (flows.producer.produce)
    if max_backlog and batch_size > max_backlog:
        batch_size = max_backlog  # a batch larger than the bound could never be admitted
    stop = stop or threading.Event()
    builder = GroupBuilder(plan, records, tokenize)
    if builder.total:  # every group has the plan's n: one check covers the run
        count = queue.layout.count
        check_group_sizes([builder.group(0)], min(c.max_executing_samples for c in queue.configs), count,
                          queue.config.max_executing_samples if count > 1 else None)
    digest = plan.digest(records)
    if queue.layout.count > 1:
        return _run_partitioned(queue, builder, plan.name, digest, max_backlog, batch_size, stop, poll_s, on_progress)
    cursor, _ = queue.run(read_cursor(queue.keys, plan.name))
    report = ProduceReport(total=builder.total, cursor=min(cursor, builder.total), started_at=cursor)
    if on_progress:
        on_progress(report)
    size = batch_size
    while report.cursor < builder.total and not stop.is_set():
        count = min(size, builder.total - report.cursor)
        groups = [builder.group(k) for k in range(report.cursor, report.cursor + count)]
        got: Produced = queue.run(produce(queue.keys, plan.name, digest, report.cursor, groups, max_backlog,
                                          queue.config.max_payload_bytes))
        report.backlog, report.waiting = got.backlog, got.status == "backlog_full"
        if got.status != "backlog_full":
            report.cursor, report.new, size = got.cursor, report.new + got.new, batch_size
        elif max_backlog > got.backlog:
            size = min(batch_size, max_backlog - got.backlog)  # what fits now: the next call is admitted
        else:
            stop.wait(poll_s)  # workers reserve from the backlog; poll until there is room
        if on_progress:
            on_progress(report)
    report.done = report.cursor >= builder.total
    if on_progress:
        on_progress(report)
    return report


def backlog_shares(max_backlog: int, partitions: int) -> list[int]:
    """Each partition's share of the producer's backlog bound (0: no bound); the shares sum to it.
    Raises InvalidInput for a bound below the partition count (a share of 0 would never admit)."""
    if not max_backlog:
        return [0] * partitions
    if max_backlog < partitions:
        raise InvalidInput(f"max_backlog {max_backlog} is below the queue's {partitions} partitions: each partition "
                           "needs a share of at least 1 (raise it, or pass 0 for no bound)")
    return [max_backlog // partitions + (1 if i < max_backlog % partitions else 0) for i in range(partitions)]


def _run_partitioned(queue: RolloutQueue, builder: GroupBuilder, name: str, digest: str, max_backlog: int,
                     batch_size: int, stop: threading.Event, poll_s: float,
                     on_progress: Callable[[ProduceReport], None] | None) -> ProduceReport:
    """run_producer on P > 1 partitions (module docstring, item 4).

    ``held[i]``: partition i's cursor, the number of the plan's groups it holds (those of its
    positions in plan order, by ``produce.lua``'s compare-and-set, so never one twice). The position
    ``cursor`` is the first one whose group its partition does not hold; ``ranks[i]`` counts
    partition i's positions before it. A window of positions from ``cursor`` goes out as one
    produce call per partition, carrying only the groups that partition lacks; a partition whose
    backlog share is full is retried after ``poll_s`` while the others go on.
    """
    layout, count = queue.layout, queue.layout.count
    shares = backlog_shares(max_backlog, count)
    held = [queue.run(read_cursor(layout.keys[i], name))[0] for i in range(count)]
    ranks = [0] * count
    cursor = 0
    while cursor < builder.total:  # the first position some partition lacks (an O(cursor) scan, once)
        i = layout.of_source(builder.source_id(cursor))
        if ranks[i] >= held[i]:
            break
        ranks[i] += 1
        cursor += 1
    report = ProduceReport(total=builder.total, cursor=cursor, started_at=cursor)
    if on_progress:
        on_progress(report)
    backlogs = [0] * count
    while report.cursor < builder.total and not stop.is_set():
        end = min(builder.total, report.cursor + batch_size)
        lacking: dict[int, list[int]] = {}
        rank = list(ranks)
        for k in range(report.cursor, end):
            i = layout.of_source(builder.source_id(k))
            if rank[i] >= held[i]:
                lacking.setdefault(i, []).append(k)
            rank[i] += 1
        full = False
        for i, positions in lacking.items():
            # What fits the partition's share as last seen (at least one group: a refusal then
            # reports the backlog afresh, and nothing is written).
            room = shares[i] - backlogs[i] if shares[i] else len(positions)
            take = positions[:max(1, min(room, len(positions)))]
            got: Produced = queue.run(produce(layout.keys[i], name, digest, held[i],
                                              [builder.group(k) for k in take], shares[i],
                                              queue.configs[i].max_payload_bytes))
            backlogs[i] = got.backlog
            if got.status == "backlog_full":
                full = True
                continue
            held[i], report.new = got.cursor, report.new + got.new
        # Advance over the positions every partition now holds.
        rank = list(ranks)
        k = report.cursor
        while k < end:
            i = layout.of_source(builder.source_id(k))
            if rank[i] >= held[i]:
                break
            rank[i] += 1
            k += 1
        report.cursor, ranks = k, rank
        report.backlog, report.waiting = sum(backlogs), full
        if full and report.cursor < end:
            stop.wait(poll_s)  # workers reserve from the backlog; poll until there is room
        if on_progress:
            on_progress(report)
    report.done = report.cursor >= builder.total
    if on_progress:
        on_progress(report)
    return report
