"""``TorchEngine``: the ``Engine`` interface on a plain transformers causal LM.

It exists for machines without vLLM (CPU tests, the demo) and as an independent reference that
vLLM's outputs are checked against. What it owns, and what it must not do:

1. One compute thread. The model, the KV cache and every torch call live on a single-thread
   executor, so the event loop never blocks on compute and torch state (grad mode is thread-local)
   is only ever touched from one thread. ``load_weights`` goes through the same executor, so it
   lands between two decode steps, never inside one.
2. Continuous batching. Requests that arrive while a batch is running join it at the next step
   boundary (prefilled once per distinct prompt, then merged; see ``_decode``), up to
   ``max_batch_size`` rows; the rest wait in arrival order. Finished and aborted rows leave at the
   step that ends them.
3. Aborts are answered at the next step boundary with the tokens so far (``finish_reason="abort"``).
   Cancelling the task awaiting ``generate`` aborts the same way.
4. A failure of the compute thread is fatal: every waiting ``generate`` raises ``EngineError`` and
   the engine refuses new work (the runtime requeues and exits, DESIGN's failure handling).
5. After ``load_weights`` returns, every new request runs on the new weights. Requests already in
   flight continue on the new weights over a KV cache computed by the old ones; a runtime that
   needs single-version samples aborts them at the weight boundary (DESIGN's worker option).
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, TypeVar

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from rollout_queue.core.errors import WeightsError
from rollout_queue.core.models import PushTicket
from rollout_queue.weights.fetch import resolve
from rollout_queue.weights.lora import is_adapter, merged_weights, read_adapter
from rollout_queue.weights.push import Staged, receive
from rollout_queue.weights.store import chain_key, read_chain_state
from rollout_queue.workers.engines._push import PushStage
from rollout_queue.workers.engines._decode import DecodeBatch, DecodeRequest
from rollout_queue.workers.engines.base import EngineError, RequestFailed, SampleOutput, SamplingConfig

T = TypeVar("T")

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
#: The chain of folders applied last and its files' identities (``store.chain_key``).
AppliedChain = tuple[tuple[Path, ...], tuple[tuple[object, ...], ...]]


class TorchEngine:
    """Batched sampling on a transformers model: fp32 on CPU by default, or ``device="cuda"``."""

    def __init__(
        self,
        model: str,
        *,
        device: str = "cpu",
        dtype: str = "float32",
        max_batch_size: int = 32,
        max_model_len: int | None = None,
        seed: int = 0,
    ) -> None:
        if dtype not in _DTYPES:
            raise ValueError(f"dtype must be one of {sorted(_DTYPES)}, got {dtype!r}")
        if max_batch_size < 1:
            raise ValueError(f"max_batch_size must be >= 1, got {max_batch_size}")
        self._model_path = model
        self._device = torch.device(device)
        self._dtype = _DTYPES[dtype]
        self._max_batch_size = max_batch_size
        self._max_model_len_option = max_model_len
        self._seed = seed
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="torch-engine")
        self._model: Any = None
        self._tokenizer: Any = None
        self._batch: DecodeBatch | None = None
        self._max_model_len = 0
        self._vocab_size = 0
        # request_id -> request, for every request from submission until its future resolves.
        self._requests: dict[str, DecodeRequest] = {}
        self._futures: dict[str, asyncio.Future[SampleOutput]] = {}
        self._waiting: deque[DecodeRequest] = deque()
        self._aborting: set[str] = set()
        self._wakeup = asyncio.Event()
        self._scheduler: asyncio.Task[None] | None = None
        self._failure: EngineError | None = None
        self._closed = False
        self._push: PushStage[Staged] = PushStage()  # a pushed version not applied yet (receive_push)
        # LoRA versions: the base value of every weight an adapter targeted (lora.py)
        self._lora_base: dict[str, torch.Tensor] = {}
        # The version chain the model's weights were last loaded from (None: the start-up model).
        self._chain: AppliedChain | None = None  # the folders applied last, and their files' identities

    @property
    def max_concurrency(self) -> int:
        return self._max_batch_size

    @property
    def vocab_size(self) -> int:
        """The model's embedding rows (``config.vocab_size``); prompts are held to the tokenizer's
        share of them as well."""
        if self._model is None:
            raise EngineError("the engine is not started; await engine.start() first")
        return int(self._model.config.vocab_size)

    async def start(self) -> None:
        """Load tokenizer and model on the compute thread, then start the scheduling loop."""
        if self._scheduler is not None:
            return
        if self._closed:
            raise EngineError("the engine is closed")
        try:
            await self._on_compute_thread(self._load)
        except Exception as exc:  # any load failure means there is no engine to run
            raise EngineError(f"could not load {self._model_path!r}: {exc}") from exc
        self._scheduler = asyncio.create_task(self._schedule(), name="torch-engine-scheduler")

    def encode(self, prompt: str) -> list[int]:
        ids: list[int] = self._require_tokenizer()(prompt)["input_ids"]
        return ids

    def encode_continuation(self, text: str) -> list[int]:
        ids: list[int] = self._require_tokenizer()(text, add_special_tokens=False)["input_ids"]
        return ids

    def decode(self, token_ids: Sequence[int]) -> str:
        text: str = self._require_tokenizer().decode(list(token_ids), skip_special_tokens=True)
        return text

    def tokens_generated(self, request_id: str) -> int | None:
        """Tokens an in-flight request has so far (None when unknown); for metrics and tests."""
        request = self._requests.get(request_id)
        return None if request is None else len(request.token_ids)

    def partial(self, request_id: str) -> SampleOutput | None:
        """The tokens so far of a request in flight, read between steps without stopping it."""
        request = self._requests.get(request_id)
        if request is None:
            return None
        # The compute thread appends a token, then its logprob: copy both lists (one atomic copy each
        # under the GIL) and keep the pairs both hold, never a token without its logprob.
        token_ids, logprobs = list(request.token_ids), list(request.logprobs)
        count = min(len(token_ids), len(logprobs))
        return SampleOutput(tuple(token_ids[:count]), tuple(logprobs[:count]), "abort")

    async def generate(
        self, request_id: str, prompt_token_ids: Sequence[int], params: SamplingConfig
    ) -> SampleOutput:
        self._check_usable()
        request = self._new_request(request_id, prompt_token_ids, params)
        future: asyncio.Future[SampleOutput] = asyncio.get_running_loop().create_future()
        self._requests[request_id] = request
        self._futures[request_id] = future
        self._waiting.append(request)
        self._wakeup.set()
        try:
            # shield: a cancelled caller must not cancel the future the scheduler resolves.
            return await asyncio.shield(future)
        except asyncio.CancelledError:
            await self.abort(request_id)
            raise

    async def abort(self, request_id: str) -> None:
        request = self._requests.get(request_id)
        if request is None:
            return  # unknown or already finished: aborting is idempotent
        if request in self._waiting:
            # Never reached the compute thread, so it can be answered right here.
            self._waiting.remove(request)
            request.finish_reason = "abort"
            self._resolve(request)
            return
        self._aborting.add(request_id)
        self._wakeup.set()

    async def load_weights(self, uri: str) -> bool:
        """Copy the tensors of the version folder ``uri`` into the model, between two steps.

        ``uri`` may be a full folder or a delta (``rollout_queue.weights``): a delta on the chain
        loaded last copies only its changed tensors, any other rebuilds from the chain's full
        folder. The chain and every tensor are checked (name and shape) before the first copy, so a wrong folder leaves
        the old weights in place and raises ``WeightsError`` (the engine keeps serving, on the
        weights it had). Raises ``EngineError`` when a copy failed: the weights are then mixed.
        """
        self._check_usable()
        staged = await self._push.take(uri)
        try:
            if staged is not None:  # pushed already: nothing to read
                await self._on_compute_thread(self._apply, staged.tensors, f"the push of {uri}")
                return True
            # Fetched (a remote version) and checked, every recorded digest included, off the compute
            # thread: generation goes on meanwhile.
            chain = await asyncio.to_thread(resolve, uri)
            await self._on_compute_thread(self._load_weights, chain)
            return True  # requests in flight go on under the new weights (point 5)
        except WeightsError:
            raise  # refused before the first copy: the old weights are intact
        except Exception as exc:  # the runtime cannot know which weights generate next
            raise EngineError(f"could not load weights from {uri!r}: {exc}") from exc

    async def check_weights(self, uri: str) -> None:
        if not self._push.holds(uri):
            await asyncio.to_thread(resolve, uri)

    @property
    def supports_push(self) -> bool:
        return True

    @property
    def prefills_per_step(self) -> bool:
        return True  # rule 2: a prompt is prefilled once per step for every row that joins with it

    async def receive_push(self, ticket: PushTicket) -> None:
        """Receive a push round's tensors on a thread of their own (generation goes on) and stage them."""
        self._check_usable()
        await self._push.receive(ticket.uri, asyncio.to_thread(receive, ticket, device=self._device))

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._scheduler is not None:
            self._scheduler.cancel()
            # The scheduler only ends by this cancellation or by a failure it already recorded.
            await asyncio.gather(self._scheduler, return_exceptions=True)
        if self._batch is not None:
            # Queued behind a step the cancellation could not interrupt, so the rows are not
            # cleared under its feet.
            await self._on_compute_thread(self._batch.clear)
        # Everything still unanswered (waiting, in the batch, or finished in a step whose result
        # the cancellation discarded) is answered now, with what it has.
        for request in list(self._requests.values()):
            self._resolve(request)
        self._waiting.clear()
        self._executor.shutdown(wait=True)
        self._model = self._batch = None

    # ---- scheduling (event loop side) ----

    async def _schedule(self) -> None:
        """Run steps while there is work; sleep on ``_wakeup`` when there is none."""
        assert self._batch is not None
        batch = self._batch
        while True:
            if not self._waiting and not batch.requests:
                self._wakeup.clear()
                await self._wakeup.wait()
                continue
            drop = [r for r in batch.requests if r.request_id in self._aborting]
            self._aborting.clear()
            room = self._max_batch_size - len(batch.requests) + len(drop)
            admit = [self._waiting.popleft() for _ in range(min(room, len(self._waiting)))]
            try:
                finished = await self._on_compute_thread(batch.step, admit, drop)
            except Exception as exc:  # compute failed: no request can be trusted to finish
                self._fail(EngineError(f"torch engine step failed: {exc!r}"), exc)
                return
            for request in finished:
                self._resolve(request)

    def _resolve(self, request: DecodeRequest) -> None:
        self._requests.pop(request.request_id, None)
        self._aborting.discard(request.request_id)
        future = self._futures.pop(request.request_id, None)
        if future is None or future.done():
            return
        future.set_result(
            SampleOutput(
                token_ids=tuple(request.token_ids),
                logprobs=tuple(request.logprobs),
                finish_reason=request.finish_reason or "abort",
            )
        )

    def _fail(self, error: EngineError, cause: Exception) -> None:
        error.__cause__ = cause
        self._failure = error
        for future in self._futures.values():
            if not future.done():
                future.set_exception(error)
        self._futures.clear()
        self._requests.clear()
        self._waiting.clear()

    def _check_usable(self) -> None:
        if self._failure is not None:
            raise self._failure
        if self._closed:
            raise EngineError("the engine is closed")
        if self._scheduler is None:
            raise EngineError("the engine is not started; await engine.start() first")

    def _new_request(
        self, request_id: str, prompt: Sequence[int], params: SamplingConfig
    ) -> DecodeRequest:
        if request_id in self._requests:
            raise RequestFailed(f"request id {request_id!r} is already in flight")
        ids = [int(t) for t in prompt]
        if not ids:
            raise RequestFailed("the prompt is empty")
        if len(ids) >= self._max_model_len:
            raise RequestFailed(
                f"the prompt has {len(ids)} tokens; max_model_len is {self._max_model_len}"
            )
        if any(not 0 <= t < self._vocab_size for t in ids):
            raise RequestFailed(
                f"a prompt token id is outside the vocabulary [0, {self._vocab_size})"
            )
        generator = None
        if params.seed is not None and not params.is_greedy:
            generator = torch.Generator(device=self._device).manual_seed(params.seed)
        return DecodeRequest(request_id, ids, params, generator)

    def _require_tokenizer(self) -> Any:
        if self._tokenizer is None:
            raise EngineError("the engine is not started; await engine.start() first")
        return self._tokenizer

    async def _on_compute_thread(self, fn: Callable[..., T], *args: Any) -> T:
        return await asyncio.get_running_loop().run_in_executor(self._executor, fn, *args)

    # ---- compute thread side ----

    def _load(self) -> None:
        tokenizer = AutoTokenizer.from_pretrained(self._model_path)
        model: Any = AutoModelForCausalLM.from_pretrained(self._model_path, dtype=self._dtype)
        model.to(self._device).eval()
        config = model.config
        limit = getattr(config, "max_position_embeddings", None) or self._max_model_len_option
        if limit is None:
            raise EngineError("the model config has no max_position_embeddings; pass max_model_len")
        self._max_model_len = min(limit, self._max_model_len_option or limit)
        self._vocab_size = min(len(tokenizer), config.vocab_size)
        self._model, self._tokenizer = model, tokenizer
        # A fast tokenizer used from two threads at once can fail with "Already borrowed"; the
        # compute thread gets its own copy for stop-string checks.
        compute_tokenizer = AutoTokenizer.from_pretrained(self._model_path)

        def decode_text(token_ids: Sequence[int]) -> str:
            return str(compute_tokenizer.decode(list(token_ids), skip_special_tokens=True))

        self._batch = DecodeBatch(
            model,
            decode_text=decode_text,
            eos_ids=_eos_ids(model, tokenizer),
            max_model_len=self._max_model_len,
            device=self._device,
            default_generator=torch.Generator(device=self._device).manual_seed(self._seed),
        )

    def _load_weights(self, chain: tuple[Path, ...]) -> None:
        """Apply the checked ``chain`` (``fetch.resolve``), its folder last: a full or delta version, or an adapter."""
        folder = chain[-1]
        if is_adapter(folder):
            return self._load_adapter(folder)
        self._lora_base = {}  # a full or delta version is the new base of any later adapter
        # A delta on the chain already applied (the same folders with the same files, not folders
        # rewritten under the same names since): read and copy only the folders after it.
        applied = self._chain
        incremental = (applied is not None and chain[:len(applied[0])] == applied[0]
                       and chain_key(chain[:len(applied[0])]) == applied[1])
        key = chain_key(chain)
        try:
            state = read_chain_state(chain, since=applied[0] if applied is not None and incremental else None)
        except Exception as exc:  # unreadable file, bad safetensors header: nothing copied yet
            raise WeightsError(f"could not load weights from {folder}: {exc}") from exc
        self._apply(state, str(folder), incremental=incremental, chain=(chain, key))

    def _load_adapter(self, folder: Path) -> None:
        """A LoRA version, merged: each weight it targets becomes base + scaling * B @ A, and a weight
        an earlier adapter targeted but this one does not goes back to its base."""
        target = self._model.state_dict()
        pairs = read_adapter(folder)
        base = {**{n: target[n].detach().clone() for n in pairs if n in target and n not in self._lora_base},
                **self._lora_base}
        merged = merged_weights(folder, base)  # refuses an adapter that does not fit, nothing copied yet
        restore = {n: w for n, w in base.items() if n not in merged}
        self._apply({**restore, **merged}, str(folder), incremental=True, chain=None)
        self._lora_base = base

    def _apply(self, state: dict[str, torch.Tensor], source: str, *, incremental: bool = False,
               chain: AppliedChain | None = None) -> None:
        """Copy ``state`` into the model once every name and shape is checked (``incremental``: a
        delta over the chain loaded last, so only its tensors are expected). ``chain``: the folders
        it rebuilds and their key (None: not from folders, e.g. a push; the next delta then reads its
        whole chain)."""
        folder = source
        target = self._model.state_dict()
        # Tied parameters (e.g. lm_head = embed_tokens) share storage: loading one loads both.
        storages: dict[int, set[str]] = {}
        for name, tensor in target.items():
            storages.setdefault(tensor.data_ptr(), set()).add(name)
        unexpected = sorted(set(state) - set(target))
        missing = [] if incremental else sorted(
            name
            for name in set(target) - set(state)
            if not storages[target[name].data_ptr()] & set(state)
        )
        wrong_shape = sorted(n for n in state if n in target and state[n].shape != target[n].shape)
        if unexpected or missing or wrong_shape:
            raise WeightsError(
                f"could not load weights from {folder}: they do not match the model: missing={missing[:5]} "
                f"unexpected={unexpected[:5]} wrong_shape={wrong_shape[:5]}"
            )
        self._chain = None  # unknown until every copy is done
        with torch.inference_mode():
            for name, tensor in state.items():
                target[name].copy_(tensor)
        self._chain = chain


def _eos_ids(model: Any, tokenizer: Any) -> frozenset[int]:
    """Token ids that end a sample: the tokenizer's EOS plus the generation config's, as in vLLM."""
    ids: set[int] = set()
    configured = getattr(model.generation_config, "eos_token_id", None)
    if isinstance(configured, int):
        ids.add(configured)
    elif configured:
        ids.update(int(i) for i in configured)
    if tokenizer.eos_token_id is not None:
        ids.add(int(tokenizer.eos_token_id))
    return frozenset(ids)
