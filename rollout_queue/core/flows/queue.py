"""The queue's own operations: open, submit, policy versions, checkpoints and restores, stats and
dead letters (the producer's cursor-guarded enqueue is in producer.py).
"""

from __future__ import annotations

from typing import Sequence

from rollout_queue.core import protocol as p
from rollout_queue.core.checks import check_flag, check_instance, check_int, check_items, check_string
from rollout_queue.core.codec import SCHEMA_VERSION, encode_group
from rollout_queue.core.config import QueueConfig
from rollout_queue.core.errors import PayloadTooLarge, QueueNotFound
from rollout_queue.core.keys import QueueKeys
from rollout_queue.core.models import DeadLetter, QueueStats, SourceGroup, check_entry_id, check_group_sizes
from rollout_queue.core.scripts import LIBRARY_VERSION
from rollout_queue.core.flows.base import BATCH, Flow, MAX_URI, MAX_VERSION


def open_queue(keys: QueueKeys, config: QueueConfig | None, default: QueueConfig | None = None,
               create: bool = True) -> Flow[QueueConfig]:
    """Create the queue or check ``config`` (None: adopt the stored one) and the library version.
    ``default``: what a new queue opened with config=None stores (a partition's share of the
    logical defaults); QueueConfig() when not given. ``create=False``: raise QueueNotFound instead
    of creating a missing queue (a worker, producer or reaper started with a mistyped name)."""
    check_instance(config, (QueueConfig, type(None)), "config")
    check_flag(create, "create")
    if not create and not (yield p.Command(("EXISTS", keys["meta"]))):
        raise QueueNotFound(keys.queue)
    chosen = config or default or QueueConfig()
    flat = [x for kv in chosen.to_meta().items() for x in kv]
    reply = yield p.build(keys, "open", library=LIBRARY_VERSION, mode="check" if config else "adopt", config=flat)
    _, meta = p.parse_open(reply, keys.queue)
    return QueueConfig.from_meta(meta)


def derive_admission(keys: QueueKeys, batch_groups: int) -> Flow[int | None]:
    """Set admission control to ``batch_groups`` if the queue's config left it to the trainer
    (stored -1, QueueConfig's DERIVED); a number or None stored is kept. Returns the batch_groups
    in force after the call (None: admission control off). One script: two trainers racing both
    get the first one's value."""
    batch_groups = check_int(batch_groups, "batch_groups", 1)
    reply = yield p.build(keys, "derive_admission", library=LIBRARY_VERSION, batch_groups=batch_groups)
    stored, _ = p.parse_derive_admission(reply, keys.queue)
    return stored if stored > 0 else None


#: Groups (and their bytes) per submit script call: a script adds ~5 µs per group, so a submit of any
#: size holds Redis for about a millisecond per call (issue 12 item 8), not seconds for 150k groups.
SUBMIT_BATCH = 256
SUBMIT_BATCH_BYTES = 1 << 20


def encode_source(g: SourceGroup, max_payload_bytes: int) -> tuple[list[p.Arg], int]:
    """One group's 5 ARGV values as submit and produce take them (add_groups.lua), and its size.
    PayloadTooLarge for a group over the queue's limit (raised before anything is sent)."""
    parents, body = encode_group(g)
    size = len(g.source_id) + len(parents) + len(body)
    if size > max_payload_bytes:
        raise PayloadTooLarge(f"source group {g.source_id!r}", size, max_payload_bytes)
    return [g.source_id, g.n, parents, body, SCHEMA_VERSION], size


def submit(keys: QueueKeys, groups: Sequence[SourceGroup], max_payload_bytes: int,
           max_group_samples: int = 0) -> Flow[list[str]]:
    """Backlog the groups; a source_id already submitted returns its existing entry ID.

    ``max_group_samples``: the largest n the queue can execute (its max_executing_samples; 0: the
    caller checked already). Every group is checked and encoded before anything is sent
    (GroupTooLarge, PayloadTooLarge: nothing written); then they go in calls of SUBMIT_BATCH groups
    or SUBMIT_BATCH_BYTES, in order. Each call is idempotent by source_id, so a submit cut short
    (OutcomeUnknown) is finished by repeating it."""
    groups = check_items(groups, SourceGroup, "groups")
    if max_group_samples:
        check_group_sizes(groups, max_group_samples)
    encoded = [encode_source(g, max_payload_bytes) for g in groups]
    out: list[str] = []
    flat: list[p.Arg] = []
    chunk_bytes = 0
    for i, (args, size) in enumerate(encoded):
        flat += args
        chunk_bytes += size
        last = i == len(encoded) - 1
        if last or len(flat) >= 5 * SUBMIT_BATCH or chunk_bytes + encoded[i + 1][1] > SUBMIT_BATCH_BYTES:
            out += p.parse_submit((yield p.build(keys, "submit", groups=flat)))
            flat, chunk_bytes = [], 0
    return out


def publish_version(keys: QueueKeys, version: int, weights_uri: str | None, hold_id: str = "") -> Flow[bool]:
    """Record a new policy version; True if it was new, False for a replay of the current one."""
    version = check_int(version, "version", 0, MAX_VERSION)
    uri = check_string("" if weights_uri is None else weights_uri, "weights_uri", MAX_URI, allow_empty=True)
    reply = yield p.build(keys, "publish_version", version=version, weights_uri=uri, hold_id=hold_id)
    return p.parse_publish_version(reply, version, hold_id)


def version(keys: QueueKeys) -> Flow[int]:
    return p.parse_count((yield p.Command(("HGET", keys["meta"], "version"))), "HGET meta version")


def checkpoint(keys: QueueKeys, step: int) -> Flow[int]:
    """Drop the kept payloads committed at or before ``step``. Returns how many were dropped.
    The first call records the checkpoint (restore refuses to go below it from then on); repeating
    it finishes an interrupted one. CheckpointRegression below the last checkpoint, LeasesOpen while
    groups are leased, RestoreInProgress while a restore is unfinished (nothing written)."""
    step = check_int(step, "step")
    total = 0
    while True:
        reply = yield p.build(keys, "checkpoint", step=int(step), count=BATCH)
        n, done = p.parse_checkpoint(reply, step)
        total += n
        if done:
            return total


def restore(keys: QueueKeys, step: int) -> Flow[int]:
    """Requeue every group committed after ``step``. Returns how many were restored. Interrupted, it
    leaves a fence (commits and checkpoints are refused) until restore(step) is called again or the
    reaper finishes it; RestoreInProgress if a restore of another step is unfinished."""
    step = check_int(step, "step")
    total = 0
    while True:
        reply = yield p.build(keys, "restore", step=int(step), count=BATCH)
        n, done = p.parse_restore(reply, step)
        total += n
        if done:
            return total


def stats(keys: QueueKeys) -> Flow[QueueStats]:
    return p.parse_stats((yield p.build(keys, "stats")))


def dead_letters(keys: QueueKeys, count: int = 100, start: str = "-") -> Flow[list[DeadLetter]]:
    """The oldest ``count`` dead letters from ``start`` (a dlq stream ID), decoded where possible."""
    count, start = check_int(count, "count", 1), start if start == "-" else check_entry_id(start)
    return p.parse_dead_letters((yield p.Command(("XRANGE", keys["dlq"], start, "+", "COUNT", count))))


def requeue_dead_letter(keys: QueueKeys, dlq_id: str) -> Flow[str]:
    """Submit a dead letter's pristine group again (after a fix). Returns its new entry ID."""
    check_entry_id(dlq_id)
    reply = yield p.build(keys, "dlq_requeue", idempotent=False, dlq_id=dlq_id)
    return p.parse_dlq_requeue(reply, dlq_id)
