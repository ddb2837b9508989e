"""miles ``Sample`` groups <-> the queue's groups, with no I/O.

Read at radixark/miles@31f1ca961a94cb860cec3b2dea34ec332bfa8f76 (``miles/utils/types.py``: Sample,
``to_dict``/``from_dict``, ``Status``; ``miles/rollout/fully_async_data_buffer.py``: a finished
group is ``list[Sample]``). Rules:

1. A prompt's fields (``prompt``, ``label``, the dataset's ``metadata``, ...) travel once, in the
   source group's metadata (``"miles"``); a generated sample stores only what generation added.
2. Every per-token list rides in the queue's columns, never in JSON: ``tokens`` (prompt + response)
   are the sample's ``token_ids``, the prompt part an observation turn (never trained), the
   response's ``loss_mask`` its model (1) and observation (0) turns; ``rollout_log_probs`` the
   logprobs of the response tokens (0.0 on the prompt's). So a sample of 32k tokens costs its
   columns, and its JSON record stays under the queue's MAX_SAMPLE_METADATA.
3. What cannot round-trip is refused (``InvalidInput`` naming the field), never stored half:
   per-token arrays the queue has no column for (routed experts, teacher logprobs, multimodal
   training inputs), a LoRA adapter binding, logprobs that do not match the response.
4. The response text is kept when the record fits; otherwise it is dropped and rebuilt on the way
   out with the tokenizer when one is given (``response_dropped`` says so).

The receipt of the attempt rides in each prompt sample's ``metadata["rollout_queue"]``, so the
buffer's ``put`` knows which reservation a finished group settles.
"""

from __future__ import annotations

from typing import Any, Sequence

import orjson

from rollout_queue.core.errors import InvalidInput
from rollout_queue.core.models import (
    MAX_SAMPLE_METADATA,
    MODEL,
    OBSERVATION,
    CompletedGroup,
    Receipt,
    Reservation,
    Sample,
    Turn,
)

__all__ = ["RECEIPT_KEY", "prompt_fields", "prompt_group", "receipt_of", "to_miles_group", "to_queue_samples"]

#: Where a prompt sample carries the receipt of its reservation.
RECEIPT_KEY = "rollout_queue"
#: Per-token fields that live in the queue's columns (rule 2), never in the JSON record.
_COLUMNS = ("tokens", "loss_mask", "rollout_log_probs")
#: Fields the queue cannot carry (rule 3): they must be empty for a group to be stored.
_UNSUPPORTED = ("multimodal_inputs", "multimodal_train_inputs", "rollout_routed_experts", "rollout_indexer_topk",
                "teacher_log_probs", "opd_reverse_kl", "adapter", "reward_spec")
_FINISH = {"completed": "stop", "truncated": "length", "aborted": "abort", "failed": "failed", "pending": "pending"}


def _unsupported(fields: dict[str, Any], where: str) -> None:
    for name in _UNSUPPORTED:
        if fields.get(name) not in (None, {}, []):
            raise InvalidInput(f"{where}: miles field {name!r} is set; the queue-backed buffer carries text prompts "
                               "and token-level fields only (no multimodal inputs, routing replay, OPD teacher "
                               "logprobs or LoRA adapters): turn that feature off or use miles' own buffer")


def _record(fields: dict[str, Any], where: str) -> dict[str, Any]:
    """``fields`` as plain JSON (a miles Sample's ``to_dict()`` minus its columns)."""
    _unsupported(fields, where)
    out = {k: v for k, v in fields.items() if k not in _COLUMNS and k not in _UNSUPPORTED}
    if isinstance(out.get("metadata"), dict) and RECEIPT_KEY in out["metadata"]:
        out["metadata"] = {k: v for k, v in out["metadata"].items() if k != RECEIPT_KEY}  # the lease names the entry
    try:
        return dict(orjson.loads(orjson.dumps(out, option=orjson.OPT_NON_STR_KEYS)))
    except TypeError as exc:
        raise InvalidInput(f"{where}: a field is not JSON ({exc}); the queue stores JSON records only") from exc


def prompt_fields(prompt_sample: Any) -> dict[str, Any]:
    """The JSON record of a dataset prompt (miles' ``Sample`` from its ``Dataset``): what the source
    group keeps so any host can rebuild the prompt group. Raises InvalidInput (rule 3)."""
    fields = prompt_sample.to_dict()
    for name in ("group_index", "index", "status", "response", "response_length", "reward", "weight_versions"):
        fields.pop(name, None)
    return _record(fields, "prompt")


def prompt_group(reservation: Reservation, sample_cls: Any, *, first_group: int, first_index: int) -> list[Any]:
    """The ``n`` prompt samples miles' generate function gets for one reservation, each carrying the
    receipt (``metadata[RECEIPT_KEY]``) and miles' running ``group_index`` / ``index``."""
    group = reservation.group
    fields = dict(group.metadata.get("miles") or {"prompt": group.prompt})
    receipt = reservation.receipt
    tag = {"entry_id": receipt.entry_id, "attempt": receipt.attempt, "worker_id": receipt.worker_id,
           "source_id": group.source_id, "version": reservation.version}
    out = []
    for i in range(group.n):
        sample = sample_cls.from_dict({**fields, "status": "pending", "group_index": first_group,
                                       "index": first_index + i})
        sample.metadata = {**dict(sample.metadata or {}), RECEIPT_KEY: tag}
        out.append(sample)
    return out


def receipt_of(samples: Sequence[Any]) -> Receipt | None:
    """The receipt a group's samples carry (None: not a queue reservation's)."""
    for sample in samples:
        items = sample if isinstance(sample, list) else [sample]
        for s in items:
            tag = (getattr(s, "metadata", None) or {}).get(RECEIPT_KEY)
            if tag:
                return Receipt(str(tag["entry_id"]), int(tag["attempt"]), str(tag["worker_id"]))
    return None


def _version(weight_versions: Sequence[Any]) -> int:
    """The oldest numeric weight version, as miles' ``Sample.oldest_weight_version`` reads it (0: none)."""
    numeric = [int(v) for v in weight_versions if str(v).isdigit()]
    return min(numeric) if numeric else 0


def _turns(prompt_len: int, mask: Sequence[int], version: int) -> tuple[Turn, ...]:
    """The prompt as an observation, then the response's loss mask as model / observation runs."""
    turns: list[Turn] = [Turn(OBSERVATION, prompt_len)] if prompt_len else []
    run_bit, run = None, 0
    for bit in mask:
        b = 1 if bit else 0
        if b != run_bit and run:
            turns.append(Turn(MODEL, run, version) if run_bit else Turn(OBSERVATION, run))
            run = 0
        run_bit, run = b, run + 1
    if run:
        turns.append(Turn(MODEL, run, version) if run_bit else Turn(OBSERVATION, run))
    if not any(t.trained for t in turns):
        turns.append(Turn(MODEL, 0, version))  # a trajectory needs a model turn; an empty one trains nothing
    return tuple(turns)


def to_queue_samples(group: Sequence[Any], source: dict[str, Any]) -> list[Sample]:
    """A finished miles group (flat ``list[Sample]``) as the queue's samples, slot = position.
    ``source``: the prompt's record (fields equal to it are not stored again). Raises InvalidInput."""
    out = []
    for slot, s in enumerate(group):
        if isinstance(s, list):
            raise InvalidInput("a group of multi-sample trajectories (list[list[Sample]]) is not supported by "
                               "the queue-backed buffer: one Sample per trajectory")
        where = f"sample {slot}"
        tokens, rl = list(s.tokens or []), int(s.response_length or 0)
        if rl > len(tokens) and tokens:
            raise InvalidInput(f"{where}: response_length {rl} exceeds its {len(tokens)} tokens")
        prompt_len = len(tokens) - rl if tokens else 0
        lps = s.rollout_log_probs
        if lps is not None and tokens and len(lps) != rl:
            raise InvalidInput(f"{where}: {len(lps)} rollout_log_probs for a response of {rl} tokens")
        mask = s.loss_mask if s.loss_mask is not None else [1] * (len(tokens) - prompt_len)
        if tokens and len(mask) != rl:
            raise InvalidInput(f"{where}: a loss_mask of {len(mask)} for a response of {rl} tokens")
        version = _version(s.weight_versions or [])
        gen = _record(s.to_dict(), where)
        gen = {k: v for k, v in gen.items() if k not in source or source[k] != v}
        gen.update(has_loss_mask=s.loss_mask is not None, has_log_probs=lps is not None, prompt_len=prompt_len)
        reward = s.reward
        if reward is not None and not isinstance(reward, (int, float)):
            reward = None  # a dict of rewards stays in the record (``reward`` above)
        else:
            gen.pop("reward", None)
        if len(orjson.dumps(gen)) > MAX_SAMPLE_METADATA and "response" in gen:
            gen.pop("response")
            gen["response_dropped"] = True
        logprobs = ([0.0] * prompt_len + [float(x) for x in lps]) if lps is not None and tokens else []
        out.append(Sample(slot=slot, token_ids=tuple(tokens), logprobs=tuple(logprobs),
                          reward=None if reward is None else float(reward), version=version,
                          finish_reason=_FINISH.get(str(gen.get("status", "completed")), "stop"),
                          turns=_turns(prompt_len, mask, version) if tokens else (), metadata={"miles": gen}))
    return out


def to_miles_group(completed: CompletedGroup, sample_cls: Any, tokenizer: Any = None) -> tuple[list[Any], list[Any]]:
    """(prompt group, finished group) of miles ``Sample``s for one leased group: the inverse of
    ``prompt_group`` + ``to_queue_samples``."""
    source = dict(completed.group.metadata.get("miles") or {"prompt": completed.group.prompt})
    group = []
    for q in completed.samples:
        gen = dict((q.metadata or {}).get("miles") or {})
        prompt_len = int(gen.pop("prompt_len", 0))
        has_mask, has_lps = gen.pop("has_loss_mask", False), gen.pop("has_log_probs", False)
        dropped = gen.pop("response_dropped", False)
        fields = {**source, "status": "completed", **gen}
        if "reward" not in gen:
            fields["reward"] = q.reward
        sample = sample_cls.from_dict(fields)
        sample.tokens = list(q.token_ids)
        if q.token_ids:
            sample.loss_mask = list(q.loss_mask[prompt_len:]) if has_mask else None
            sample.rollout_log_probs = list(q.logprobs[prompt_len:]) if has_lps else None
        if dropped and tokenizer is not None and sample.response_length:
            sample.response = tokenizer.decode(sample.tokens[-sample.response_length:])
        group.append(sample)
    first = group[0] if group else None
    prompts = [sample_cls.from_dict({**source, "status": "pending",
                                     "group_index": getattr(first, "group_index", None),
                                     "index": getattr(s, "index", None)}) for s in group]
    return prompts, group
