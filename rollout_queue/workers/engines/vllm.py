"""``VLLMEngine``: the ``Engine`` interface on vLLM's asynchronous engine (``AsyncLLM``).

The same code runs on vLLM's CPU build (tests, this project's CI) and on a GPU host with plain
``vllm``; only the defaults below differ by platform. What it owns, and what it must not do:

1. One vLLM request per ``generate`` call (``n=1``), prompt given as token ids. vLLM batches
   concurrent requests itself (continuous batching, prefix caching).
2. Logprobs are vLLM's defaults: the raw model distribution (``logprobs_mode="raw_logprobs"``), one
   per sampled token, the quantity ``TorchEngine`` reports too.
3. A weight push is pause -> reload -> reset prefix cache -> resume. The reset is not optional:
   prefix caching would otherwise serve KV blocks computed by the old weights to new requests
   whose prompt shares a cached prefix (any prompt longer than one block), silently mixing
   policies. Requests in flight are kept (``mode="keep"``) and recomputed on the new weights.
4. Process model. ``AsyncLLM`` always runs its scheduler in a separate ``EngineCore`` process,
   started with the ``spawn`` method: the program that builds this engine needs an
   ``if __name__ == "__main__":`` guard. ``multiprocessing=True`` (vLLM's default) also puts the
   model in its own worker process; ``multiprocessing=False`` (``VLLM_ENABLE_V1_MULTIPROCESSING=0``)
   runs it inside EngineCore, which starts about twice as fast and is what the tests use.
5. On vLLM's CPU build no prefill is ever split across steps: chunked prefill is off unless given,
   and a setting that would split one is refused when the engine is built. vLLM 0.32 discards
   the sample of a partial prefill and rewinds the request's own ``torch.Generator`` (seeded
   requests: ``set_offset(get_offset() - 4)`` in ``GPUModelRunner._bookkeeping_sync``), which a
   CPU generator cannot do ("CPU Generator does not use offset"): the EngineCore dies. Rule 3's
   recompute makes that likely (every running request prefills again, prompt plus generated
   tokens, in one burst), but any batch of prompts over ``max_num_batched_tokens`` triggers it.
   Unsplit, a prefill waits for a step with room for all of it; vLLM then needs
   ``max_num_batched_tokens >= max_model_len`` (its default when not given). GPU generators
   rewind, so a GPU engine keeps vLLM's defaults.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import importlib
import os
from collections import Counter
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from vllm import SamplingParams, TokensPrompt
from vllm.engine.arg_utils import AsyncEngineArgs
from vllm.exceptions import VLLMValidationError
from vllm.lora.request import LoRARequest
from vllm.platforms import current_platform
from vllm.sampling_params import RequestOutputKind
from vllm.v1.engine.async_llm import AsyncLLM
from vllm.v1.engine.exceptions import EngineDeadError, EngineGenerateError

from rollout_queue.core.errors import WeightsError
from rollout_queue.core.models import PushTicket
from rollout_queue.weights.fetch import resolve
from rollout_queue.weights.lora import adapter_config, is_adapter, scaling
from rollout_queue.workers.engines._push import PushStage
from rollout_queue.workers.engines.base import EngineError, FinishReason, RequestFailed, SampleOutput, SamplingConfig

# On CPU vLLM sizes the KV cache from NUMA node 0 only unless told; an explicit budget is both
# safer and predictable. On a GPU the default (gpu_memory_utilization) is the right knob.
DEFAULT_CPU_KV_CACHE_BYTES = 512 * 2**20

_RELOAD_EXTENSION = "rollout_queue.workers.engines.vllm_weights.ChainReload"
#: How often a push being received in vLLM's worker process is polled.
PUSH_POLL_S = 0.05

# vLLM's finish reasons -> ours. "repetition" is vLLM's optional repetition detector ending the
# sample, a stop condition like any other; "error" is handled separately (request-level failure).
_FINISH_REASONS: dict[str, FinishReason] = {
    "stop": "stop",
    "length": "length",
    "abort": "abort",
    "repetition": "stop",
}


class ResidentAdapters:
    """The LoRA versions loaded into vLLM: the current one (what new requests start on), the older
    ones still resident, and how many requests in flight use each (``users``, by adapter id)."""

    def __init__(self) -> None:
        self.current: LoRARequest | None = None
        self.resident: list[LoRARequest] = []
        self.users: Counter[int] = Counter()
        self._ids = 0

    def next(self, folder: Path) -> LoRARequest:
        self._ids += 1
        return LoRARequest(lora_name=f"{folder.name}#{self._ids}", lora_int_id=self._ids, lora_path=os.fspath(folder))

    def adopt(self, request: LoRARequest) -> None:
        self.current = request
        self.resident.append(request)

    def evictable(self, keep: int) -> list[LoRARequest]:
        """Oldest first, the adapters past the newest ``keep`` that no request in flight uses."""
        idle = [r for r in self.resident[:-1] if self.users[r.lora_int_id] == 0]
        return idle[:max(0, len(self.resident) - max(1, keep))]

    def forget(self, request: LoRARequest) -> None:
        self.resident.remove(request)
        self.users.pop(request.lora_int_id, None)


class VLLMEngine:
    """An ``AsyncLLM`` with one request per sample; see the module docstring for the rules."""

    def __init__(
        self,
        model: str,
        *,
        multiprocessing: bool = True,
        dtype: str | None = None,
        max_model_len: int | None = None,
        max_num_seqs: int | None = None,
        kv_cache_memory_bytes: int | None = None,
        seed: int = 0,
        enable_prefix_caching: bool = True,
        engine_args: Mapping[str, Any] | None = None,
        kv_on_update: str = "recompute",
        progress_every_tokens: int = 32,
    ) -> None:
        """``dtype`` defaults to float32 on CPU (the CPU kernels' exact path, and what the torch
        cross-check needs) and to the checkpoint's dtype on a GPU. ``engine_args`` passes any other
        ``AsyncEngineArgs`` field through (tensor_parallel_size, gpu_memory_utilization, ...).
        ``kv_on_update``: what a weight update does to requests in flight: ``recompute`` their KV
        on the new weights (rule 3), or ``keep`` it (PipelineRL's choice: no recompute, so the
        update costs only the reload; each such sample's tokens after the update are generated by
        the new weights over a KV prefix of the old ones, and its ``versions`` say both). With
        ``keep`` each request's prefix-cache key is salted with the weights it starts on, so a new
        request never reuses blocks computed by older weights, and no cache reset is needed.
        On vLLM's CPU build chunked prefill is off unless given, and ``ValueError`` refuses
        ``enable_chunked_prefill=True`` or a ``long_prefill_token_threshold`` (rule 5).
        ``progress_every_tokens``: vLLM hands a request's new tokens over every this many
        (``RequestOutputKind.DELTA`` with a ``stream_interval``), so ``partial`` knows what a request
        in flight has so far and a worker's periodic progress save keeps it (a worker killed
        mid-request loses at most that interval); 0: only the final output is handed over
        (``FINAL_ONLY``) and ``partial`` is always None."""
        if isinstance(progress_every_tokens, bool) or not isinstance(progress_every_tokens, int) \
                or progress_every_tokens < 0:
            raise ValueError(f"progress_every_tokens must be an integer >= 0, got {progress_every_tokens!r}")
        self._progress_every = progress_every_tokens
        # request id -> (tokens, behaviour logprobs) handed over so far (progress_every_tokens > 0)
        self._so_far: dict[str, tuple[list[int], list[float]]] = {}
        if kv_on_update not in ("recompute", "keep"):
            raise ValueError(f"kv_on_update must be 'recompute' or 'keep', got {kv_on_update!r}")
        self._keep_kv = kv_on_update == "keep"
        self._loads = 0  # weight loads so far: the prefix-cache salt of new requests in keep mode
        self._push: PushStage[bool] = PushStage()  # a pushed version staged in vLLM's worker (receive_push)
        self._lora = ResidentAdapters()  # LoRA versions: the newest serves new requests
        on_cpu = current_platform.is_cpu()
        if kv_cache_memory_bytes is None and on_cpu and "VLLM_CPU_KVCACHE_SPACE" not in os.environ:
            kv_cache_memory_bytes = DEFAULT_CPU_KV_CACHE_BYTES
        settings: dict[str, Any] = {
            "model": model,
            "dtype": dtype or ("float32" if on_cpu else "auto"),
            # CPU: no graph capture to gain, and eager start-up is seconds faster.
            "enforce_eager": on_cpu,
            "max_model_len": max_model_len,
            "max_num_seqs": max_num_seqs,
            "kv_cache_memory_bytes": kv_cache_memory_bytes,
            "seed": seed,
            "enable_prefix_caching": enable_prefix_caching,
            # rq_reload_chain: full and delta versions (rollout_queue.weights) reload in place.
            "worker_extension_cls": _RELOAD_EXTENSION,
        }
        settings.update(engine_args or {})
        _check_extension(settings["worker_extension_cls"])
        if on_cpu:
            _never_split_prefills(settings)
        self._args = AsyncEngineArgs(**settings)
        self._multiprocessing = multiprocessing
        self._engine: AsyncLLM | None = None
        self._tokenizer: Any = None
        self._in_flight: set[str] = set()
        # Ids whose abort arrived while the request was still being rendered (unknown to vLLM).
        self._abort_requested: set[str] = set()
        self._closed = False

    @property
    def max_concurrency(self) -> int:
        """vLLM's ``max_num_seqs``: the most sequences it schedules in one step.

        Known only once started when not given explicitly (vLLM picks it per platform).
        """
        if self._engine is not None:
            return int(self._engine.vllm_config.scheduler_config.max_num_seqs)
        if self._args.max_num_seqs is not None:
            return int(self._args.max_num_seqs)
        raise EngineError(
            "max_concurrency is known once the engine is started (or pass max_num_seqs)"
        )

    @property
    def vocab_size(self) -> int:
        """The model's vocabulary (``ModelConfig.get_vocab_size()``: its embedding rows)."""
        return int(self._require_engine().vllm_config.model_config.get_vocab_size())

    async def start(self) -> None:
        """Start vLLM: spawns EngineCore, loads the model, allocates the KV cache.

        This blocks the event loop for the whole start-up (seconds to minutes): vLLM builds its
        IPC sockets on the running loop, so it cannot be moved to a thread. Start the engine before
        anything latency-sensitive runs on the loop (the heartbeat is a thread, per DESIGN).
        """
        if self._engine is not None:
            return
        if self._closed:
            raise EngineError("the engine is closed")
        try:
            with _multiprocessing_env(self._multiprocessing):
                self._engine = AsyncLLM.from_engine_args(self._args)
            self._tokenizer = self._engine.get_tokenizer()
        except Exception as exc:  # whatever stops vLLM from starting, there is no engine
            raise EngineError(f"vLLM failed to start for {self._args.model!r}: {exc}") from exc

    def encode(self, prompt: str) -> list[int]:
        ids: list[int] = self._require_tokenizer().encode(prompt)
        return ids

    def encode_continuation(self, text: str) -> list[int]:
        ids: list[int] = self._require_tokenizer().encode(text, add_special_tokens=False)
        return ids

    def decode(self, token_ids: Sequence[int]) -> str:
        text: str = self._require_tokenizer().decode(list(token_ids), skip_special_tokens=True)
        return text

    async def generate(
        self, request_id: str, prompt_token_ids: Sequence[int], params: SamplingConfig
    ) -> SampleOutput:
        engine = self._require_engine()
        if request_id in self._in_flight:
            # vLLM would accept it (it makes internal ids unique), but abort() by id would then
            # hit both requests.
            raise RequestFailed(f"request id {request_id!r} is already in flight")
        self._in_flight.add(request_id)
        try:
            prompt = await self._render(engine, [int(t) for t in prompt_token_ids])
            if request_id in self._abort_requested:
                return SampleOutput(token_ids=(), logprobs=(), finish_reason="abort")
            final = None
            lora = self._lora.current  # the adapter this request starts on, kept resident until it ends
            self._lora.users[lora.lora_int_id if lora else 0] += 1
            so_far: tuple[list[int], list[float]] = ([], [])
            if self._progress_every:
                self._so_far[request_id] = so_far
            try:
                sampling = _sampling_params(params, self._progress_every)
                async for output in engine.generate(prompt, sampling, request_id, lora_request=lora):
                    final = output
                    if self._progress_every and output.outputs:
                        _take_delta(request_id, output.outputs[0], so_far)
            finally:
                self._lora.users[lora.lora_int_id if lora else 0] -= 1
                self._so_far.pop(request_id, None)
        except (VLLMValidationError, EngineGenerateError) as exc:
            raise RequestFailed(f"vLLM refused request {request_id!r}: {exc}") from exc
        except EngineDeadError as exc:
            raise EngineError(f"vLLM engine died: {exc}") from exc
        finally:
            self._in_flight.discard(request_id)
            self._abort_requested.discard(request_id)
        if final is None or not final.outputs:
            raise EngineError(f"vLLM ended request {request_id!r} without an output")
        return _sample_output(request_id, final.outputs[0], so_far if self._progress_every else None)

    def partial(self, request_id: str) -> SampleOutput | None:
        """The tokens and behaviour logprobs vLLM has handed over for a request in flight (every
        ``progress_every_tokens``, and its first at once), ``finish_reason="abort"``; None for an
        unknown or finished request, or with ``progress_every_tokens=0`` (then vLLM hands over
        nothing before the end: streaming every step would wake each request's coroutine per token)."""
        so_far = self._so_far.get(request_id)
        if so_far is None or not so_far[0]:
            return None
        return SampleOutput(tuple(so_far[0]), tuple(so_far[1]), "abort")

    async def abort(self, request_id: str) -> None:
        """Abort a request; vLLM answers its ``generate`` at once with the tokens so far.

        Best effort, like any abort racing completion: inside vLLM's own admission (between our
        submission and vLLM registering the id) an abort is not seen, and that request returns its
        normal result. Only compute is wasted; the caller gets a valid sample either way.
        """
        if self._engine is None or request_id not in self._in_flight:
            return  # unknown or finished: aborting is idempotent
        self._abort_requested.add(request_id)
        await self._engine.abort(request_id)

    async def load_weights(self, uri: str) -> bool:
        """Reload weights from the version folder ``uri`` (full, or a delta with its chain; see
        ``rollout_queue.weights``) into every vLLM worker, or load a LoRA adapter version.

        Returns whether requests in flight now run on the new weights: True for a reload (rule 3),
        False for an adapter (each request keeps the adapter it started on). Raises
        ``WeightsError`` when the version is refused before vLLM is touched (the engine keeps
        serving its weights), ``EngineError`` when the reload itself failed: the workers may then
        hold a mix of old and new tensors, so the engine must not keep generating.
        """
        engine = self._require_engine()
        staged = bool(await self._push.take(uri))
        args: tuple[Any, ...]  # the collective RPC's arguments
        if staged:  # received by push: the tensors wait beside the model
            rpc, args = "rq_push_apply", (uri,)
        else:
            try:
                # Fetched (a remote version) and checked, every recorded digest included, in a thread:
                # generation goes on. Checked here so that a wrong path never reaches the workers (a
                # failed reload there can leave some tensors replaced); the engine is untouched.
                checked = await asyncio.to_thread(resolve, uri)
                if is_adapter(checked[-1]):
                    return await self._load_adapter(engine, checked[-1])
                chain = [str(f) for f in checked]
            except WeightsError as exc:
                raise WeightsError(f"could not load weights from {uri!r}: {exc}") from exc
            rpc, args = "rq_reload_chain", (chain,)
        if self._lora.current is not None:
            raise WeightsError(f"{uri!r} is a full version, but this engine serves LoRA adapters over its base "
                               "model: a run publishes one kind")
        try:
            # keep: in-flight requests stay queued, nothing is scheduled until resume, so no step
            # ever runs new weights against KV blocks cached by the old ones.
            await engine.pause_generation(mode="keep", clear_cache=False)
            try:
                loaded = await engine.collective_rpc(rpc, args=args)
                if staged and any(n < 0 for n in loaded):
                    raise EngineError(f"the push of {uri!r} was not staged in every vLLM worker")
                self._loads += 1  # keep mode: requests from now on start on a fresh cache salt
                # recompute: blocks held by in-flight requests hold old-weight KV too; they are
                # preempted and recomputed on the new weights.
                if not self._keep_kv and not await engine.reset_prefix_cache(reset_running_requests=True):
                    raise EngineError("vLLM could not reset its prefix cache after the reload")
            finally:
                await engine.resume_generation()
        except EngineError:
            raise
        except Exception as exc:  # any failure leaves the workers' weights unknown
            raise EngineError(f"vLLM could not load weights from {uri!r}: {exc}") from exc
        return True

    async def _load_adapter(self, engine: AsyncLLM, folder: Path) -> bool:
        """A LoRA version: new requests start on it; requests in flight finish on theirs (so False:
        they did not move). Adapters no request uses are removed beyond vLLM's ``max_loras``."""
        uri = os.fspath(folder)
        if not self._args.enable_lora:
            raise WeightsError(f"{uri!r} is a LoRA adapter: start the worker with --engine-arg enable_lora=true "
                               "(and max_lora_rank >= its rank, max_loras = max_staleness + 1)")
        scaling(adapter_config(folder), folder)  # refuses what is not plain LoRA, before vLLM sees it
        request = self._lora.next(folder)
        try:
            if not await engine.add_lora(request):
                raise WeightsError(f"vLLM refused the LoRA adapter {uri!r}")
        except WeightsError:
            raise
        except Exception as exc:  # a rank above max_lora_rank, unsupported target modules: nothing applied
            raise WeightsError(f"vLLM could not load the LoRA adapter {uri!r}: {exc}") from exc
        self._lora.adopt(request)
        for stale in self._lora.evictable(self._args.max_loras):
            await engine.remove_lora(stale.lora_int_id)
            self._lora.forget(stale)
        return False

    async def check_weights(self, uri: str) -> None:
        if not self._push.holds(uri):
            await asyncio.to_thread(resolve, uri)

    @property
    def supports_push(self) -> bool:
        return True

    @property
    def prefills_per_step(self) -> bool:
        return False  # each request prefills when it starts (or hits the prefix cache), grouped or not

    async def receive_push(self, ticket: PushTicket) -> None:
        """Receive a push round in vLLM's worker process (a thread beside the model: the engine keeps
        stepping) and stage it there. One vLLM worker process takes the ticket's rank, so a
        tensor-parallel engine (several worker processes) loads its versions from folders."""
        engine = self._require_engine()

        async def receiving() -> bool:
            started = await engine.collective_rpc("rq_push_begin", args=(dataclasses.asdict(ticket),))
            if started != ["pending"]:
                raise WeightsError(f"push round {ticket.epoch}: {started} (a push reaches one vLLM worker "
                                   "process: a tensor-parallel engine loads its versions from their folders)")
            while True:
                status = (await engine.collective_rpc("rq_push_status"))[0]
                if status == "ok":
                    return True
                if status != "pending":
                    raise WeightsError(f"push round {ticket.epoch}: {status}")
                await asyncio.sleep(PUSH_POLL_S)

        await self._push.receive(ticket.uri, receiving())

    async def close(self) -> None:
        """Abort what is in flight (each ``generate`` returns "abort") and shut vLLM down."""
        if self._closed:
            return
        self._closed = True
        engine, self._engine = self._engine, None
        if engine is None:
            return
        if self._in_flight:
            await engine.abort(list(self._in_flight))
        engine.shutdown()

    async def _render(self, engine: AsyncLLM, prompt_token_ids: list[int]) -> Any:
        prompt = (TokensPrompt(prompt_token_ids=prompt_token_ids, cache_salt=f"w{self._loads}") if self._keep_kv
                  else TokensPrompt(prompt_token_ids=prompt_token_ids))
        # vLLM 0.32 deprecates handing raw prompts to generate(); its renderer turns token ids
        # into the engine input that generate() will require. Older versions have no renderer.
        renderer = getattr(engine, "renderer", None)
        if renderer is None:
            return prompt
        (engine_input,) = await renderer.render_cmpl_async([prompt])
        return engine_input

    def _require_engine(self) -> AsyncLLM:
        if self._closed:
            raise EngineError("the engine is closed")
        if self._engine is None:
            raise EngineError("the engine is not started; await engine.start() first")
        if self._engine.errored:
            raise EngineError(f"vLLM engine died: {self._engine.dead_error}")
        return self._engine

    def _require_tokenizer(self) -> Any:
        if self._tokenizer is None:
            raise EngineError("the engine is not started; await engine.start() first")
        return self._tokenizer


def _check_extension(name: str) -> None:
    """A ``worker_extension_cls`` given in ``engine_args`` must keep ``rq_reload_chain`` (subclass
    ChainReload), or no published version could ever load: refuse it now, not at the first update."""
    from rollout_queue.workers.engines.vllm_weights import ChainReload

    if name == _RELOAD_EXTENSION:
        return
    module, _, cls = name.rpartition(".")
    try:
        found = getattr(importlib.import_module(module), cls)
    except (ImportError, AttributeError, ValueError) as exc:
        raise ValueError(f"worker_extension_cls {name!r} cannot be imported: {exc}") from exc
    if not (isinstance(found, type) and issubclass(found, ChainReload)):
        raise ValueError(f"worker_extension_cls {name!r} must subclass {_RELOAD_EXTENSION}, "
                         "which loads the published weight versions")


def _never_split_prefills(settings: dict[str, Any]) -> None:
    """Rule 5 (CPU build): turn chunked prefill off unless given, and refuse what splits a prefill
    anyway, so that no seeded request's prefill, first or recomputed after an update, kills the
    EngineCore. Refused here, when the worker starts, not at the first update."""
    why = ("on vLLM's CPU build a seeded request whose prefill is split across steps kills the EngineCore "
           "(vLLM rewinds its torch.Generator, which a CPU generator cannot do)")
    if settings.get("enable_chunked_prefill") is None:
        settings["enable_chunked_prefill"] = False
    elif settings["enable_chunked_prefill"]:
        raise ValueError(f"enable_chunked_prefill=True: {why}; leave enable_chunked_prefill unset (off on CPU)")
    if settings.get("long_prefill_token_threshold"):
        raise ValueError(f"long_prefill_token_threshold={settings['long_prefill_token_threshold']!r} splits long "
                         f"prefills: {why}; leave long_prefill_token_threshold unset (0)")


def _sampling_params(params: SamplingConfig, progress_every: int = 0) -> SamplingParams:
    """vLLM's parameters for one sample: FINAL_ONLY, or DELTA every ``progress_every`` tokens."""
    return SamplingParams(
        n=1,
        max_tokens=params.max_tokens,
        temperature=params.temperature,
        top_p=params.top_p,
        stop=list(params.stop) or None,
        seed=params.seed,
        logprobs=1,
        output_kind=RequestOutputKind.DELTA if progress_every else RequestOutputKind.FINAL_ONLY,
        stream_interval=progress_every or None,
    )


def _sampled_logprobs(request_id: str, token_ids: Sequence[int], positions: Any) -> list[float]:
    """The sampled token's logprob at each position (each position's dict holds the top-k tokens plus
    the sampled one). A length mismatch is an EngineError."""
    # strict=False: a length mismatch is reported below as an EngineError, not a ValueError.
    logprobs = [p[token].logprob for token, p in zip(token_ids, positions or [], strict=False)]
    if len(logprobs) != len(token_ids):
        raise EngineError(f"vLLM returned {len(token_ids)} tokens but {len(logprobs)} logprobs for {request_id!r}")
    return logprobs


def _take_delta(request_id: str, completion: Any, so_far: tuple[list[int], list[float]]) -> None:
    """Append one DELTA output's new tokens and their logprobs to what the request has so far."""
    token_ids = list(completion.token_ids)
    so_far[1].extend(_sampled_logprobs(request_id, token_ids, completion.logprobs))
    so_far[0].extend(token_ids)


def _sample_output(request_id: str, completion: Any,
                   so_far: tuple[list[int], list[float]] | None = None) -> SampleOutput:
    """The sample of a finished request: its final output (FINAL_ONLY), or every DELTA handed over
    (``so_far``: the final output's own tokens were appended already)."""
    reason = str(completion.finish_reason)
    if reason == "error":
        raise RequestFailed(f"vLLM reported a request-level error for {request_id!r}")
    if reason not in _FINISH_REASONS:
        raise EngineError(f"vLLM finished {request_id!r} with unknown reason {reason!r}")
    if so_far is None:
        token_ids = list(completion.token_ids)
        so_far = (token_ids, _sampled_logprobs(request_id, token_ids, completion.logprobs))
    return SampleOutput(token_ids=tuple(so_far[0]), logprobs=tuple(so_far[1]), finish_reason=_FINISH_REASONS[reason])


@contextlib.contextmanager
def _multiprocessing_env(enabled: bool) -> Iterator[None]:
    """Set ``VLLM_ENABLE_V1_MULTIPROCESSING`` while EngineCore is spawned, then restore it.

    The spawned process copies the environment at start, so the setting sticks to this engine
    and does not leak into later engines of the same process.
    """
    name = "VLLM_ENABLE_V1_MULTIPROCESSING"
    previous = os.environ.get(name)
    os.environ[name] = "1" if enabled else "0"
    try:
        yield
    finally:
        if previous is None:
            del os.environ[name]
        else:
            os.environ[name] = previous
