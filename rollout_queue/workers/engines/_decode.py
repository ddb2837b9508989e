"""The torch engine's compute core: one batch of sequences decoded step by step with a KV cache.

Rules:
1. Synchronous and single-threaded. Everything here runs on the engine's one compute thread; it
   knows nothing about asyncio or futures. ``TorchEngine`` owns concurrency and hands this module
   plain lists.
2. Continuous batching by cache surgery, not by recompute. Sequences live as rows of one
   left-padded batch: the KV cache is ``[rows, heads, T, head_dim]`` per layer with an attention
   mask ``[rows, T]`` marking real positions. New requests are prefilled unpadded, once per
   distinct prompt, and concatenated in after left-padding whichever side is shorter (zeros, never
   attended to); finished rows are cut out with an index select. Leading columns that no row uses
   any more are trimmed, so one long sequence leaving shrinks the batch. Between those events the
   model's own cache object is reused as is (no copy per step).
3. Same numbers as vLLM's defaults. Positions count real tokens only (padding does not shift
   RoPE), and the reported logprob is the log-softmax of the raw logits (vLLM's
   ``logprobs_mode="raw_logprobs"``), independent of temperature and top-p. Stop checks follow
   vLLM's order: EOS, then the length caps, then stop strings (which win over "length").
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from transformers import DynamicCache

from rollout_queue.workers.engines.base import FinishReason, SamplingConfig

KVTensors = list[tuple[torch.Tensor, torch.Tensor]]


@dataclass(eq=False)
class DecodeRequest:
    """One sample being generated. Mutated only on the compute thread while it is in a batch."""

    request_id: str
    prompt: list[int]
    params: SamplingConfig
    generator: torch.Generator | None = None
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    finish_reason: FinishReason | None = None


@dataclass
class _Rows:
    """Batch state that moves together when rows are added or removed."""

    requests: list[DecodeRequest]
    cache: Any  # transformers DynamicCache holding [rows, heads, T, head_dim] per layer
    mask: torch.Tensor  # [rows, T] long: 1 where the cache holds a real token
    positions: torch.Tensor  # [rows] position of each row's pending (not yet cached) token
    pending: torch.Tensor  # [rows] last sampled token, to be fed at the next decode step


class DecodeBatch:
    """The active rows of the torch engine and the one operation on them: ``step``."""

    def __init__(
        self,
        model: Any,
        *,
        decode_text: Callable[[Sequence[int]], str],
        eos_ids: frozenset[int],
        max_model_len: int,
        device: torch.device,
        default_generator: torch.Generator,
    ) -> None:
        self._model = model
        self._decode_text = decode_text
        self._eos_ids = eos_ids
        self._max_model_len = max_model_len
        self._device = device
        self._default_generator = default_generator
        self._rows: _Rows | None = None

    @property
    def requests(self) -> list[DecodeRequest]:
        return list(self._rows.requests) if self._rows else []

    def step(
        self, admit: Sequence[DecodeRequest], drop: Collection[DecodeRequest]
    ) -> list[DecodeRequest]:
        """Drop ``drop`` (finish_reason "abort"), decode one token for every remaining row, prefill
        ``admit`` (which samples their first token) and merge them in. Returns the requests that
        finished during this step, each with ``finish_reason`` set."""
        finished: list[DecodeRequest] = list(drop)
        with torch.inference_mode():
            if drop:
                for request in drop:
                    request.finish_reason = "abort"
                self._rows = self._keep(self._rows, lambda r: r not in drop)
            if self._rows is not None:
                self._rows, done = self._decode(self._rows)
                finished.extend(done)
            if admit:
                cohort, done = self._prefill(admit)
                finished.extend(done)
                self._rows = self._merge(self._rows, cohort)
        return finished

    def clear(self) -> list[DecodeRequest]:
        """Forget every row (marked "abort") and free the cache; used on close."""
        requests = self.requests
        for request in requests:
            request.finish_reason = request.finish_reason or "abort"
        self._rows = None
        return requests

    def _decode(self, rows: _Rows) -> tuple[_Rows | None, list[DecodeRequest]]:
        ones = torch.ones((len(rows.requests), 1), dtype=rows.mask.dtype, device=self._device)
        mask = torch.cat([rows.mask, ones], dim=1)
        logits = self._forward(rows.pending[:, None], mask, rows.positions[:, None], rows.cache)
        return self._advance(
            _Rows(rows.requests, rows.cache, mask, rows.positions + 1, rows.pending), logits
        )

    def _prefill(self, admit: Sequence[DecodeRequest]) -> tuple[_Rows | None, list[DecodeRequest]]:
        """Prefill each distinct prompt once, unpadded, and give every request its own row.

        Unpadded: a padded prefill would give padding queries nothing to attend to, and some
        attention kernels answer a fully masked row with NaN, which then poisons the real rows
        through the cache. Once per distinct prompt: the ``n`` samples of a group share their
        prompt, so its KV is computed once and copied into ``n`` rows.
        """
        groups: dict[tuple[int, ...], list[DecodeRequest]] = {}
        for request in admit:
            groups.setdefault(tuple(request.prompt), []).append(request)
        rows: _Rows | None = None
        finished: list[DecodeRequest] = []
        for prompt, requests in groups.items():
            count, length = len(requests), len(prompt)
            ids = torch.tensor([prompt], dtype=torch.long, device=self._device)
            mask = torch.ones_like(ids)
            cache = self._new_cache([])
            logits = self._forward(
                ids, mask, torch.arange(length, device=self._device)[None], cache
            )
            if count > 1:
                kv = [
                    (k.repeat(count, 1, 1, 1), v.repeat(count, 1, 1, 1))
                    for k, v in _kv_tensors(cache)
                ]
                cache, logits, mask = (
                    self._new_cache(kv),
                    logits.repeat(count, 1),
                    mask.repeat(count, 1),
                )
            lengths = torch.full((count,), length, dtype=torch.long, device=self._device)
            cohort, done = self._advance(_Rows(requests, cache, mask, lengths, lengths), logits)
            finished.extend(done)
            rows = self._merge(rows, cohort)
        return rows, finished

    def _forward(
        self, ids: torch.Tensor, mask: torch.Tensor, positions: torch.Tensor, cache: Any
    ) -> torch.Tensor:
        """Run the model over ``ids``, growing ``cache`` in place; the last position's logits."""
        out = self._model(
            input_ids=ids,
            attention_mask=mask,
            position_ids=positions,
            past_key_values=cache,
            use_cache=True,
            logits_to_keep=1,
        )
        logits: torch.Tensor = out.logits[:, -1, :].float()
        return logits

    def _advance(
        self, rows: _Rows, logits: torch.Tensor
    ) -> tuple[_Rows | None, list[DecodeRequest]]:
        """Sample the next token of every row, record it, and cut out the rows that finished."""
        tokens, logprobs = sample_tokens(logits, rows.requests, self._default_generator)
        finished: list[DecodeRequest] = []
        for request, token, logprob in zip(rows.requests, tokens, logprobs, strict=True):
            request.token_ids.append(token)
            request.logprobs.append(logprob)
            request.finish_reason = self._finish_reason(request, token)
            if request.finish_reason is not None:
                finished.append(request)
        rows.pending = torch.tensor(tokens, dtype=torch.long, device=self._device)
        if finished:
            return self._keep(rows, lambda r: r.finish_reason is None), finished
        return rows, finished

    def _finish_reason(self, request: DecodeRequest, token: int) -> FinishReason | None:
        params = request.params
        if token in self._eos_ids:
            return "stop"
        if params.stop and self._hits_stop_string(request):
            return "stop"
        if len(request.token_ids) >= params.max_tokens:
            return "length"
        if len(request.prompt) + len(request.token_ids) >= self._max_model_len:
            return "length"
        return None

    def _hits_stop_string(self, request: DecodeRequest) -> bool:
        # Decode only a tail window: a stop string of L characters spans at most 4L byte-level
        # tokens, and one that ended earlier would have stopped the request then. One extra token
        # keeps a multi-byte character at the window's edge from hiding a match.
        window = 4 * max(len(s) for s in request.params.stop) + 1
        tail = self._decode_text(request.token_ids[-window:])
        return any(stop in tail for stop in request.params.stop)

    def _keep(self, rows: _Rows | None, predicate: Callable[[DecodeRequest], bool]) -> _Rows | None:
        """The rows for which ``predicate`` holds (None when none do), trimmed of unused columns."""
        if rows is None:
            return None
        keep = [i for i, r in enumerate(rows.requests) if predicate(r)]
        if not keep:
            return None
        index = torch.tensor(keep, device=self._device)
        mask = rows.mask.index_select(0, index)
        # Trim leading columns no remaining row uses: the cost of every later step is linear in T.
        start = int(mask.any(dim=0).nonzero()[0])
        kv = [
            (k.index_select(0, index)[:, :, start:], v.index_select(0, index)[:, :, start:])
            for k, v in _kv_tensors(rows.cache)
        ]
        return _Rows(
            [rows.requests[i] for i in keep],
            self._new_cache(kv),
            mask[:, start:],
            rows.positions.index_select(0, index),
            rows.pending.index_select(0, index),
        )

    def _merge(self, a: _Rows | None, b: _Rows | None) -> _Rows | None:
        """One batch holding the rows of ``a`` then ``b``, left-padded to the longer of the two."""
        if a is None or b is None:
            return a if b is None else b
        width = max(a.mask.shape[1], b.mask.shape[1])
        kv = [
            (_cat_left_padded(ka, kb, width), _cat_left_padded(va, vb, width))
            for (ka, va), (kb, vb) in zip(_kv_tensors(a.cache), _kv_tensors(b.cache), strict=True)
        ]
        return _Rows(
            a.requests + b.requests,
            self._new_cache(kv),
            _cat_left_padded(a.mask, b.mask, width),
            torch.cat([a.positions, b.positions]),
            torch.cat([a.pending, b.pending]),
        )

    def _new_cache(self, kv: KVTensors) -> Any:
        # config: the model's layer types decide the cache layer classes (transformers >= 4.56).
        cache = DynamicCache(config=self._model.config)
        for layer, (keys, values) in enumerate(kv):
            cache.update(keys, values, layer)
        return cache


def _kv_tensors(cache: Any) -> KVTensors:
    # Iterating a DynamicCache yields (keys, values, ...) per layer in transformers 5 and
    # (keys, values) in 4.x; only the first two matter here.
    return [(item[0], item[1]) for item in cache]


def _cat_left_padded(a: torch.Tensor, b: torch.Tensor, width: int) -> torch.Tensor:
    """Concatenate along the batch dim after left-padding the sequence dim of each to ``width``.

    The sequence dim is dim 1 for a mask ``[rows, T]`` and dim 2 for KV ``[rows, heads, T, d]``.
    Zeros are safe padding: the mask excludes those positions from attention.
    """
    seq_dim = 1 if a.dim() == 2 else 2

    def pad(t: torch.Tensor) -> torch.Tensor:
        missing = width - t.shape[seq_dim]
        if missing == 0:
            return t
        shape = list(t.shape)
        shape[seq_dim] = missing
        return torch.cat([t.new_zeros(shape), t], dim=seq_dim)

    return torch.cat([pad(a), pad(b)], dim=0)


def sample_tokens(
    logits: torch.Tensor, requests: Sequence[DecodeRequest], default_generator: torch.Generator
) -> tuple[list[int], list[float]]:
    """Pick each row's next token and its raw-distribution logprob.

    Greedy rows take the argmax. The others sample from softmax(logits / T) restricted to the top-p
    nucleus: rows with a seed draw from their own generator (reproducible whatever else is in the
    batch, up to float rounding of the logits), the rest share one draw from the engine's generator.
    """
    raw_logprobs = torch.log_softmax(logits, dim=-1)
    chosen = logits.argmax(dim=-1)
    sampled = [i for i, r in enumerate(requests) if not r.params.is_greedy]
    if sampled:
        rows = torch.tensor(sampled, device=logits.device)
        temperature = torch.tensor(
            [requests[i].params.temperature for i in sampled], device=logits.device
        )
        probs = torch.softmax(logits.index_select(0, rows) / temperature[:, None], dim=-1)
        top_p = [requests[i].params.top_p for i in sampled]
        if min(top_p) < 1.0:
            probs = _top_p(probs, torch.tensor(top_p, device=logits.device))
        shared = [j for j, i in enumerate(sampled) if requests[i].generator is None]
        if shared:
            draws = torch.multinomial(probs[shared], 1, generator=default_generator)[:, 0]
            chosen[rows[shared]] = draws
        for j, i in enumerate(sampled):
            generator = requests[i].generator
            if generator is not None:
                chosen[i] = torch.multinomial(probs[j], 1, generator=generator)[0]
    picked = raw_logprobs.gather(1, chosen[:, None])[:, 0]
    return chosen.tolist(), picked.tolist()


def _top_p(probs: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    """Zero every token outside each row's smallest set whose mass reaches its ``top_p``.

    The most likely token always survives (the mass before it is 0 < top_p).
    """
    sorted_probs, order = probs.sort(dim=-1, descending=True)
    mass_before = sorted_probs.cumsum(dim=-1) - sorted_probs
    sorted_probs = sorted_probs.masked_fill(mass_before >= top_p[:, None], 0.0)
    return torch.zeros_like(probs).scatter_(-1, order, sorted_probs)
