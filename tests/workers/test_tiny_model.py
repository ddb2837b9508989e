"""The tiny local model: deterministic, idempotent, loadable; atomic weight folders."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from safetensors.torch import load_file
from transformers import AutoModelForCausalLM, AutoTokenizer

from rollout_queue.workers.tiny_model import MARKER, build_tiny_model, save_weights

pytestmark = pytest.mark.torch


def build_small(path: Path, *, seed: int = 0, num_layers: int = 1) -> Path:
    """A smaller model than the session's, so rebuilding it in each test stays cheap."""
    return build_tiny_model(
        path, seed=seed, hidden_size=64, intermediate_size=64, num_layers=num_layers, num_heads=2
    )


def digest(folder: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.iterdir())}


def test_build_is_deterministic(tmp_path: Path) -> None:
    first = build_small(tmp_path / "a", seed=5)
    second = build_small(tmp_path / "b", seed=5)
    third = build_small(tmp_path / "c", seed=6)
    assert digest(first) == digest(second)
    assert digest(first)["model.safetensors"] != digest(third)["model.safetensors"]


def test_build_is_idempotent_and_rebuilds_on_new_recipe(tmp_path: Path) -> None:
    folder = build_small(tmp_path / "m")
    stamp = (folder / "model.safetensors").stat().st_mtime_ns
    assert build_small(tmp_path / "m") == folder
    assert (folder / "model.safetensors").stat().st_mtime_ns == stamp
    build_small(tmp_path / "m", num_layers=2)
    config = AutoModelForCausalLM.from_pretrained(folder).config
    assert config.num_hidden_layers == 2


def test_refuses_foreign_folder_and_bad_head_dim(tmp_path: Path) -> None:
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("mine")
    with pytest.raises(FileExistsError):
        build_small(foreign)
    with pytest.raises(ValueError, match="head"):
        build_tiny_model(tmp_path / "bad", hidden_size=64, num_heads=4)


def test_tiny_model_shape(tiny_model: Path) -> None:
    tokenizer = AutoTokenizer.from_pretrained(tiny_model)
    assert 400 <= len(tokenizer) <= 500
    assert (tokenizer.bos_token, tokenizer.eos_token, tokenizer.pad_token) == (
        "<s>",
        "</s>",
        "<pad>",
    )
    ids = tokenizer("héllo wörld 😀")["input_ids"]
    assert ids[0] == tokenizer.bos_token_id
    assert tokenizer.decode(ids, skip_special_tokens=True) == "héllo wörld 😀"
    config = AutoModelForCausalLM.from_pretrained(tiny_model).config
    assert config.hidden_size // config.num_attention_heads in (32, 64, 80, 96, 112, 128)
    assert config.max_position_embeddings >= 1024
    assert (tiny_model / MARKER).exists() and (tiny_model / "model.safetensors").exists()


def test_save_weights_is_atomic_and_refuses_overwrite(tiny_model: Path, tmp_path: Path) -> None:
    model = AutoModelForCausalLM.from_pretrained(tiny_model)
    target = save_weights(model, tmp_path / "v1")
    assert set(load_file(target / "model.safetensors")) == set(model.state_dict())
    with pytest.raises(FileExistsError):
        save_weights(model, target)
    save_weights(model, target, overwrite=True)
    # No staging or trash folders are left next to the published one.
    assert sorted(p.name for p in tmp_path.iterdir()) == ["v1"]


def test_perturbed_weights_differ(tiny_model: Path, perturbed_model: Path) -> None:
    old = load_file(tiny_model / "model.safetensors")
    new = load_file(perturbed_model / "model.safetensors")
    assert old.keys() == new.keys()
    for name in old:
        assert (old[name] - new[name]).abs().max() > 1e-3, name
    assert (perturbed_model / "tokenizer.json").read_bytes() == (
        tiny_model / "tokenizer.json"
    ).read_bytes()
