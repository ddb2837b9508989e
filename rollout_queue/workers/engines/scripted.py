"""``ScriptedEngine``: the *test engine*, the ``Engine`` interface with no model behind it.

It exists so that the worker runtime, the submission scheduler, benchmarks and chaos tests can be
exercised quickly and deterministically: tokens are a hash of (weights, prompt, request id or seed),
latencies follow a configurable distribution (fixed, jitter, a long tail, or any function), and
failures are injected on purpose (``RequestFailed`` for chosen prompts, a fatal ``EngineError``
after k calls or on a weight load, requests that hang until aborted, a ``time.sleep`` that blocks
the event loop). It counts what a test wants to assert: requests running now, the peak, starts,
finishes, aborts, weight loads.

It keeps base.py's rules like a real engine: one sample per call; aborts are data
(``finish_reason="abort"`` with the tokens "so far"); cancelling the caller aborts the request;
at most ``max_concurrency`` requests run, the rest wait in arrival order; after a fatal error every
waiting and future call raises ``EngineError``. It never imports torch, except with ``push=True``:
then it takes part in weights pushes like the torch and vLLM engines (it receives and stages every
round's tensors, and a version recorded with the pushed URI is loaded from what was staged, which
``pushed_loads`` counts; there is no model to put them in), for chaos runs and drills of pushes.

Vocabulary: 0 ``<pad>``, 1 ``<s>``, 2 ``</s>``, then byte ``b`` is token ``b + 3``; ``encode``
prepends ``<s>``, so any text round-trips through ``decode``.
"""

from __future__ import annotations

import asyncio
import hashlib
import importlib
import math
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from rollout_queue.core.errors import WeightsError
from rollout_queue.core.models import PushTicket
from rollout_queue.workers.engines._push import PushStage
from rollout_queue.workers.engines.base import EngineError, FinishReason, RequestFailed, SampleOutput, SamplingConfig

BOS, EOS, OFFSET = 1, 2, 3


@dataclass
class _Request:
    request_id: str
    prompt_text: str
    params: SamplingConfig
    future: asyncio.Future[SampleOutput]
    tokens: tuple[int, ...] = ()
    started_at: float | None = None
    latency: float = 0.0
    timer: asyncio.TimerHandle | None = None
    extra: dict[str, float] = field(default_factory=dict)


class ScriptedEngine:
    """The test engine (see the module docstring). All options are keyword arguments, so the
    command line can pass them with ``--engine-arg key=value``. ``latency_fn`` and ``text_fn`` take
    ``(prompt_text, request_id)`` and return seconds / the completion text."""

    def __init__(
        self,
        model: str = "",
        *,
        max_concurrency: int = 64,
        tokens: int = 8,
        latency_s: float = 0.0,
        jitter_s: float = 0.0,
        tail_p: float = 0.0,
        tail_s: float = 0.0,
        latency_fn: Callable[[str, str], float] | None = None,
        text_fn: Callable[[str, str], str] | None = None,
        fail_prompt: str | None = None,
        hang: bool = False,
        hang_prompt: str | None = None,
        fatal_after: int | None = None,
        fatal_on_load: bool = False,
        refuse_load: str | None = None,
        load_latency_s: float = 0.0,
        block_loop_s: float = 0.0,
        block_loop_calls: int | None = None,
        seed: int = 0,
        push: bool = False,
        abort_share: float | None = None,
    ) -> None:
        if max_concurrency < 1 or tokens < 0:
            raise ValueError("max_concurrency must be >= 1 and tokens >= 0")
        self.model = model
        self._max_concurrency = max_concurrency
        self.tokens, self.seed = tokens, seed
        self.latency_s, self.jitter_s, self.tail_p, self.tail_s = latency_s, jitter_s, tail_p, tail_s
        self.latency_fn, self.text_fn = latency_fn, text_fn
        self.fail_prompt, self.hang, self.hang_prompt = fail_prompt, hang, hang_prompt
        self.fatal_after, self.fatal_on_load, self.load_latency_s = fatal_after, fatal_on_load, load_latency_s
        self.refuse_load = refuse_load  # URIs containing it are refused before anything is applied
        self.block_loop_s, self.block_loop_calls = block_loop_s, block_loop_calls
        self.weights_uri = model
        self.push = push
        # An aborted request keeps this share of its tokens whatever the time it ran (None: the share
        # of its latency that elapsed): "mid-generation" made deterministic, for partial-rollout tests
        # whose requests hang until aborted.
        if abort_share is not None and not 0 <= abort_share <= 1:
            raise ValueError("abort_share must be in [0, 1]")
        self.abort_share = abort_share
        self._push: PushStage[Any] = PushStage()
        self.pushed_loads = 0  # versions loaded from a push staged for their URI
        self.loads: list[str] = []
        self.calls = self.finished = self.aborted = self.failed = 0
        self.running = self.peak_running = 0
        self.running_ids: set[str] = set()
        self._live: dict[str, _Request] = {}
        self._waiting: deque[_Request] = deque()
        self._failure: EngineError | None = None
        self._started = self._closed = False

    # -- the Engine protocol ---------------------------------------------------------------------

    @property
    def max_concurrency(self) -> int:
        return self._max_concurrency

    @property
    def vocab_size(self) -> int:
        return OFFSET + 256  # <pad>, <s>, </s>, then one token per byte

    async def start(self) -> None:
        if self._closed:
            raise EngineError("the engine is closed")
        if self.push:  # now, not inside the first round, whose deadline must not pay for the import
            await asyncio.to_thread(importlib.import_module, "torch.distributed")
        self._started = True

    def encode(self, prompt: str) -> list[int]:
        return [BOS, *(b + OFFSET for b in prompt.encode())]

    def encode_continuation(self, text: str) -> list[int]:
        return [b + OFFSET for b in text.encode()]

    def decode(self, token_ids: Sequence[int]) -> str:
        return bytes(t - OFFSET for t in token_ids if OFFSET <= t < OFFSET + 256).decode(errors="replace")

    async def generate(self, request_id: str, prompt_token_ids: Sequence[int],
                       params: SamplingConfig) -> SampleOutput:
        self._check_usable()
        self.calls += 1
        if self.fatal_after is not None and self.calls >= self.fatal_after:
            self._die(EngineError(f"scripted fatal error at call {self.calls} (fatal_after={self.fatal_after})"))
            raise self._failure  # type: ignore[misc]  # set by _die
        request = self._new_request(request_id, prompt_token_ids, params)
        if self.block_loop_s and (self.block_loop_calls is None or self.calls <= self.block_loop_calls):
            time.sleep(self.block_loop_s)  # on purpose: a stalled event loop (liveness tests)
        self._live[request_id] = request
        self._waiting.append(request)
        self._admit()
        try:
            # shield: cancelling the caller would otherwise cancel the future itself, and abort()
            # skips a done future, so the request would keep its running slot for ever (at
            # max_concurrency such leaks, every later request waits until its caller's deadline).
            return await asyncio.shield(request.future)
        except asyncio.CancelledError:
            await self.abort(request_id)
            raise
        finally:
            self._live.pop(request_id, None)

    def partial(self, request_id: str) -> SampleOutput | None:
        """The tokens "so far" of a request that is running (the share an abort would keep now)."""
        request = self._live.get(request_id)
        if request is None or request.started_at is None or request.future.done():
            return None  # unknown, finished, or still waiting for a running slot: nothing so far
        tokens = self._so_far(request)
        return SampleOutput(tokens, _logprobs(tokens), "abort")

    async def abort(self, request_id: str) -> None:
        request = self._live.get(request_id)
        if request is not None and not request.future.done():
            self._resolve(request, "abort")

    @property
    def supports_push(self) -> bool:
        return self.push  # without push=True its workers load every version by URI

    @property
    def prefills_per_step(self) -> bool:
        return False  # no prefill to share: a sample's cost does not depend on who starts with it

    async def receive_push(self, ticket: PushTicket) -> None:
        if not self.push:
            raise WeightsError("the scripted engine takes part in pushes only with push=True")
        from rollout_queue.weights.push import receive

        await self._push.receive(ticket.uri, asyncio.to_thread(receive, ticket))

    async def check_weights(self, uri: str) -> None:
        self._check_usable()
        if self.refuse_load is not None and self.refuse_load in uri:
            raise WeightsError(f"scripted refusal of {uri!r}: nothing applied")

    async def load_weights(self, uri: str) -> bool:
        self._check_usable()
        if self.fatal_on_load:
            self._die(EngineError(f"scripted fatal error loading weights from {uri!r}"))
            raise self._failure  # type: ignore[misc]
        await self.check_weights(uri)
        if self.load_latency_s:
            await asyncio.sleep(self.load_latency_s)
        if await self._push.take(uri) is not None:
            self.pushed_loads += 1
        self.weights_uri = uri
        self.loads.append(uri)
        return True

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        for request in list(self._live.values()):
            if not request.future.done():
                self._resolve(request, "abort")

    # -- test controls (call on the engine's event loop) -----------------------------------------

    def finish_hanging(self) -> int:
        """End every hanging request normally, as if its generation had just completed."""
        hanging = [r for r in self._live.values()
                   if r.started_at is not None and not math.isfinite(r.latency) and not r.future.done()]
        for request in hanging:
            self._resolve(request, None)
        return len(hanging)

    # -- helpers ----------------------------------------------------------------------------------

    def tokens_for(self, request_id: str, prompt_text: str, params: SamplingConfig) -> tuple[int, ...]:
        """The sample this engine produces for a request under the current weights."""
        if self.text_fn is not None:
            return tuple(self.encode(self.text_fn(prompt_text, request_id))[1:][: params.max_tokens])
        salt = request_id if params.seed is None else str(params.seed)
        digest = hashlib.sha256(f"{self.weights_uri}|{prompt_text}|{salt}".encode()).digest()
        count = min(self.tokens, params.max_tokens)
        return tuple(OFFSET + 0x30 + digest[i % len(digest)] % 10 for i in range(count))  # digits

    def latency_for(self, request_id: str, prompt_text: str) -> float:
        if self.hang or (self.hang_prompt is not None and self.hang_prompt in prompt_text):
            return math.inf
        if self.latency_fn is not None:
            return float(self.latency_fn(prompt_text, request_id))
        digest = hashlib.sha256(f"{self.seed}|{request_id}".encode()).digest()
        u, v = digest[0] / 255, digest[1] / 255
        return self.latency_s + self.jitter_s * u + (self.tail_s if v < self.tail_p else 0.0)

    def _new_request(self, request_id: str, prompt_token_ids: Sequence[int], params: SamplingConfig) -> _Request:
        if request_id in self._live:
            raise RequestFailed(f"request id {request_id!r} is already in flight")
        if not prompt_token_ids:
            raise RequestFailed("the prompt is empty")
        text = self.decode(prompt_token_ids)
        if self.fail_prompt is not None and self.fail_prompt in text:
            self.failed += 1
            raise RequestFailed(f"scripted failure: the prompt contains {self.fail_prompt!r}")
        future: asyncio.Future[SampleOutput] = asyncio.get_running_loop().create_future()
        return _Request(request_id, text, params, future, self.tokens_for(request_id, text, params))

    def _admit(self) -> None:
        loop = asyncio.get_running_loop()
        while self._waiting and self.running < self._max_concurrency:
            request = self._waiting.popleft()
            if request.future.done():
                continue
            request.started_at = loop.time()
            request.latency = self.latency_for(request.request_id, request.prompt_text)
            self.running += 1
            self.running_ids.add(request.request_id)
            self.peak_running = max(self.peak_running, self.running)
            if math.isfinite(request.latency):
                request.timer = loop.call_later(max(0.0, request.latency), self._resolve, request, None)

    def _resolve(self, request: _Request, reason: FinishReason | None) -> None:
        """End a request: normally (``reason=None``) or aborted with the share of tokens 'so far'."""
        if request.future.done():
            return
        if request.timer is not None:
            request.timer.cancel()
        tokens = request.tokens
        if reason == "abort":
            self.aborted += 1
            tokens = self._so_far(request)
        else:
            self.finished += 1
            reason = "length" if len(tokens) >= request.params.max_tokens else "stop"
        self._release(request)
        request.future.set_result(SampleOutput(tokens, _logprobs(tokens), reason))
        self._admit()

    def _so_far(self, request: _Request) -> tuple[int, ...]:
        """The tokens a request not finished has "generated": the share of its latency that elapsed
        (or ``abort_share``)."""
        elapsed = 0.0 if request.started_at is None else asyncio.get_running_loop().time() - request.started_at
        share = elapsed / request.latency if math.isfinite(request.latency) and request.latency > 0 else 0.0
        share = share if self.abort_share is None else self.abort_share
        return request.tokens[: int(len(request.tokens) * min(1.0, share))]

    def _release(self, request: _Request) -> None:
        if request.request_id in self.running_ids:
            self.running_ids.discard(request.request_id)
            self.running -= 1
        elif request in self._waiting:
            self._waiting.remove(request)

    def _die(self, error: EngineError) -> None:
        self._failure = error
        for request in list(self._live.values()):
            if not request.future.done():
                if request.timer is not None:
                    request.timer.cancel()
                self._release(request)
                request.future.set_exception(error)

    def _check_usable(self) -> None:
        if self._failure is not None:
            raise self._failure
        if self._closed:
            raise EngineError("the engine is closed")
        if not self._started:
            raise EngineError("the engine is not started; await engine.start() first")


def _logprobs(tokens: tuple[int, ...]) -> tuple[float, ...]:
    """One made-up behaviour logprob per token, a function of the token alone, so that a sample's
    prefix reads the same whether it was taken mid-request, at an abort or at the end."""
    return tuple(-0.1 - (t % 7) / 10 for t in tokens)
