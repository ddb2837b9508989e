"""Builds the tiny local Llama model that tests and the demo run on, and writes weight folders.

Everything here works offline: the tokenizer is trained on built-in text and the weights are a
seeded random init, so nothing is ever fetched from a model hub. The folder it writes is a normal
``save_pretrained`` folder (safetensors weights + config + tokenizer) that both transformers and
vLLM load, which is what lets the tests cross-check the two engines token for token.

Weight folders are published atomically (written next to the destination, then renamed): a worker
told to load ``uri`` must never see a half-written folder.

Run ``python -m rollout_queue.workers.tiny_model PATH`` to build one.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import tempfile
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # torch is imported lazily so `import workers.tiny_model` stays cheap.
    import torch

MARKER = "tiny_model.json"
# Bump when the build recipe changes, so a cached folder from an older recipe is rebuilt.
RECIPE_VERSION = 1
# Head sizes the vLLM CPU attention backend accepts; others start and then fail at the first step.
SUPPORTED_HEAD_DIMS = (32, 64, 80, 96, 112, 128, 192, 256)
SPECIAL_TOKENS = ("<s>", "</s>", "<pad>")
VOCAB_SIZE = 480

DEFAULT_TEXT = (
    "The quick brown fox jumps over the lazy dog while the cat sleeps in the sun.",
    "A worker reserves a group of prompts, generates samples, and hands back a completion.",
    "The trainer leases a batch of completed groups, runs one optimizer step, then commits it.",
    "Every reservation is trained exactly once or sent to the dead letter stream with a reason.",
    "Redis keeps the ledger: streams, sorted sets and hashes under one hash tag per queue.",
    "Policy versions rise after each step; stale samples are requeued and generated again.",
    "Numbers like 0 1 2 3 4 5 6 7 8 9 10 42 100 and 2024 appear in math problems.",
    "What is 12 plus 30? The answer is 42. What is 7 times 6? It is also 42.",
    "She sells sea shells by the sea shore, and the shells she sells are surely sea shells.",
    "def add(a, b):\n    return a + b\n\nprint(add(2, 3))",
    "Once upon a time there was a small model that learned to count and to tell stories.",
    "Questions, answers, rewards and logprobs flow between the workers and the trainers.",
)


def build_tiny_model(
    path: str | os.PathLike[str],
    *,
    seed: int = 0,
    hidden_size: int = 128,
    intermediate_size: int = 256,
    num_layers: int = 2,
    num_heads: int = 4,
    max_position_embeddings: int = 1024,
    vocab_text: Sequence[str] | None = None,
) -> Path:
    """Build (or reuse) a random-init ``LlamaForCausalLM`` and byte-level BPE tokenizer at ``path``.

    Deterministic given the arguments. Idempotent: a folder whose marker records the same recipe is
    returned as is; a folder built with other arguments is rebuilt. A non-empty folder without our
    marker is someone else's data and is refused rather than overwritten.

    Raises ValueError for a head size vLLM's CPU backend cannot run, FileExistsError for a foreign
    non-empty folder.
    """
    if hidden_size % num_heads or hidden_size // num_heads not in SUPPORTED_HEAD_DIMS:
        raise ValueError(
            f"hidden_size/num_heads = {hidden_size}/{num_heads} must be one of "
            f"{SUPPORTED_HEAD_DIMS} (vLLM's CPU attention backend supports only these head sizes)"
        )
    text = tuple(vocab_text) if vocab_text is not None else DEFAULT_TEXT
    recipe: dict[str, Any] = {
        "recipe_version": RECIPE_VERSION,
        "seed": seed,
        "hidden_size": hidden_size,
        "intermediate_size": intermediate_size,
        "num_layers": num_layers,
        "num_heads": num_heads,
        "max_position_embeddings": max_position_embeddings,
        "vocab_text": list(text),
    }
    target = Path(path)
    if _read_marker(target) == recipe:
        return target
    if target.exists() and any(target.iterdir()) and _read_marker(target) is None:
        raise FileExistsError(f"{target} is not empty and was not built by build_tiny_model")

    tokenizer = _build_tokenizer(text)
    model = _build_model(
        seed=seed,
        vocab_size=len(tokenizer),
        tokenizer=tokenizer,
        hidden_size=hidden_size,
        intermediate_size=intermediate_size,
        num_layers=num_layers,
        num_heads=num_heads,
        max_position_embeddings=max_position_embeddings,
    )
    with _staging_dir(target) as staging:
        model.save_pretrained(staging)
        tokenizer.save_pretrained(staging)
        (staging / MARKER).write_text(json.dumps(recipe, indent=1, sort_keys=True))
    return target


def save_weights(
    model: torch.nn.Module, path: str | os.PathLike[str], *, overwrite: bool = False
) -> Path:
    """Write ``model`` (a transformers ``PreTrainedModel``) as a safetensors folder, atomically.

    The folder is complete the instant it appears at ``path``, so an engine told to load it never
    reads a partial checkpoint. Use a fresh path per policy version; with ``overwrite=True`` an
    existing folder is replaced, and for a moment ``path`` does not exist at all.

    Raises FileExistsError when ``path`` exists and ``overwrite`` is false.
    """
    target = Path(path)
    if target.exists() and not overwrite:
        raise FileExistsError(f"{target} exists; write each policy version to a fresh folder")
    with _staging_dir(target) as staging:
        model.save_pretrained(staging, safe_serialization=True)  # type: ignore[operator]
    return target


def perturb_weights(
    src: str | os.PathLike[str], dst: str | os.PathLike[str], seed: int, *, scale: float = 1.0
) -> Path:
    """Write a copy of the model at ``src`` whose weights differ noticeably (for weight-push tests).

    Each floating tensor gets Gaussian noise of ``scale`` times its own standard deviation, which is
    enough to change greedy outputs of the tiny model. The tokenizer files are copied unchanged, so
    ``dst`` is a complete model folder as well as a weight folder.
    """
    import torch
    from transformers import AutoModelForCausalLM

    source, target = Path(src), Path(dst)
    model = AutoModelForCausalLM.from_pretrained(source, dtype=torch.float32)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for param in model.parameters():
            std = float(param.std()) if param.numel() > 1 else 1.0
            noise = torch.randn(param.shape, generator=generator, dtype=param.dtype)
            param.add_(noise * (scale * (std or 1.0)))
    with _staging_dir(target) as staging:
        model.save_pretrained(staging, safe_serialization=True)
        for item in source.iterdir():
            if item.name.startswith("tokenizer") or item.name == "special_tokens_map.json":
                shutil.copy2(item, staging / item.name)
    return target


def _build_tokenizer(text: Sequence[str]) -> Any:
    """Train a byte-level BPE tokenizer on ``text`` and wrap it for transformers.

    Byte-level means every string is encodable (no unknown token). A post-processor adds ``<s>`` so
    prompts start with BOS like Llama's; there is no chat template (prompts are plain text).
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    bpe.train_from_iterator(list(text), trainer=trainer)
    bos_id = bpe.token_to_id("<s>")
    bpe.post_processor = processors.TemplateProcessing(
        single="<s> $A", pair="<s> $A <s> $B", special_tokens=[("<s>", bos_id)]
    )
    wrapper: Any = PreTrainedTokenizerFast  # untyped in transformers
    return wrapper(
        tokenizer_object=bpe,
        bos_token="<s>",
        eos_token="</s>",
        pad_token="<pad>",
        padding_side="left",
        model_max_length=1 << 30,
    )


def _build_model(*, seed: int, vocab_size: int, tokenizer: Any, **shape: int) -> Any:
    """A seeded random-init Llama. The wider init (0.1 instead of 0.02) makes the next-token
    distribution peaked enough that greedy argmax margins dwarf fp32 rounding, so two engines'
    greedy outputs can be compared token for token."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=shape["hidden_size"],
        intermediate_size=shape["intermediate_size"],
        num_hidden_layers=shape["num_layers"],
        num_attention_heads=shape["num_heads"],
        num_key_value_heads=shape["num_heads"],
        max_position_embeddings=shape["max_position_embeddings"],
        initializer_range=0.1,
        tie_word_embeddings=False,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        dtype="float32",
    )
    llama: Any = LlamaForCausalLM  # untyped in transformers
    # fork_rng: seeding must not disturb the caller's global RNG state.
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model: Any = llama(config)
    model.generation_config.bos_token_id = tokenizer.bos_token_id
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    return model.eval()


def _read_marker(folder: Path) -> dict[str, Any] | None:
    try:
        marker: dict[str, Any] = json.loads((folder / MARKER).read_text())
    except (FileNotFoundError, NotADirectoryError, json.JSONDecodeError):
        return None  # no (valid) marker: not a folder we built, or a build that never finished
    return marker


@contextmanager
def _staging_dir(target: Path) -> Iterator[Path]:
    """Yield a temp folder next to ``target``; on success, move it into place with a rename.

    The temp folder sits in the same parent so the rename stays on one filesystem (atomic). An
    existing ``target`` is first renamed aside and deleted after the swap.
    """
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent))
    try:
        yield staging
        os.chmod(staging, 0o755)  # mkdtemp makes it 0700; a weight folder is read by other users
        if target.exists():
            trash = Path(
                tempfile.mkdtemp(prefix=f".{target.name}.", suffix=".old", dir=target.parent)
            )
            os.rename(target, trash / "old")
            os.rename(staging, target)
            shutil.rmtree(trash)
        else:
            os.rename(staging, target)
    finally:
        # Only still there when the build failed; its contents are a partial, useless write.
        if staging.exists():
            shutil.rmtree(staging)


def main(argv: Sequence[str] | None = None) -> None:
    """CLI: build the tiny model at PATH and print the folder."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "path", help="folder to write (reused when already built with these options)"
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--hidden-size", type=int, default=128)
    parser.add_argument("--intermediate-size", type=int, default=256)
    parser.add_argument("--num-layers", type=int, default=2)
    parser.add_argument("--num-heads", type=int, default=4)
    args = parser.parse_args(argv)
    folder = build_tiny_model(
        args.path,
        seed=args.seed,
        hidden_size=args.hidden_size,
        intermediate_size=args.intermediate_size,
        num_layers=args.num_layers,
        num_heads=args.num_heads,
    )
    print(folder)


if __name__ == "__main__":
    main()
