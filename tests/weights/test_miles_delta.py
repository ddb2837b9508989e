"""miles' disk-delta folders read by the queue's workers (rollout_queue/weights/miles_delta.py), and
the post-write hook that records each version in the queue.

The deltas are written as miles' writer writes them (radixark/miles@31f1ca96,
``update_weight_from_distributed/delta.py`` ``_encode_delta`` / ``_write_delta_files``), with miles'
own ``checksum`` and ``overwrite_encode`` (``miles/utils/disk_delta.py``, from ``$MILES_SRC``).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from rollout_queue import QueueConfig, RolloutQueue
from rollout_queue.core.errors import WeightsError
from rollout_queue.weights.fetch import localize
from rollout_queue.weights.miles_delta import materialize
from tests.integrations.framework_src import add_source

add_source("MILES_SRC")
zstandard = pytest.importorskip("zstandard", reason="miles deltas are zstd-compressed: pip install zstandard")
disk_delta = pytest.importorskip("miles.utils.disk_delta", reason="set MILES_SRC to a radixark/miles checkout "
                                                                  "(scripts/test_frameworks.sh miles)")
st = pytest.importorskip("safetensors.numpy")


def base_checkpoint(folder: Path) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    tensors = {"a": rng.standard_normal(64).astype(np.float32), "b": rng.standard_normal(32).astype(np.float16),
               "c": np.arange(10, dtype=np.int32)}
    folder.mkdir(parents=True)
    st.save_file({"a": tensors["a"], "b": tensors["b"]}, os.fspath(folder / "model-00001-of-00002.safetensors"))
    st.save_file({"c": tensors["c"]}, os.fspath(folder / "model-00002-of-00002.safetensors"))
    (folder / "config.json").write_text("{}")
    return tensors


def write_delta(root: Path, version: int, old: dict[str, np.ndarray], new: dict[str, np.ndarray],
                encoding: str = "xor", algorithm: str = "xxh3-128") -> Path:
    """miles' _encode_delta + _write_delta_files for one source rank."""
    delta, digests = {}, {}
    for name, value in new.items():
        o, n = old[name].view(np.uint8).reshape(-1), value.view(np.uint8).reshape(-1)
        if encoding == "xor":
            diff, changed = n ^ o, int(np.count_nonzero(n ^ o))
        else:
            mask = n != o
            diff, changed = disk_delta.overwrite_encode(n, mask), int(np.count_nonzero(mask))
        if changed:
            delta[name] = np.frombuffer(zstandard.ZstdCompressor(level=1).compress(diff), dtype=np.uint8)
            digests[name] = disk_delta.checksum(algorithm, n)
    folder = root / f"weight_v{version:06d}"
    folder.mkdir(parents=True)
    fname = "model-00000-of-00001.safetensors"
    (folder / fname).write_bytes(st.save(delta, metadata=digests))
    index = {"metadata": {"version": f"{version:06d}", "base_version": f"{version - 1:06d}",
                          "delta_encoding": encoding, "compression_format": "zstd", "checksum_format": algorithm},
             "weight_map": {name: fname for name in delta}}
    (folder / "model.safetensors.index.json").write_text(json.dumps(index))
    return folder


def read_all(folder: Path) -> dict[str, np.ndarray]:
    out: dict[str, np.ndarray] = {}
    for path in folder.glob("*.safetensors"):
        out.update(st.load_file(os.fspath(path)))
    return out


def steps(t0: dict[str, np.ndarray]) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    t1 = {**t0, "a": t0["a"] + np.float32(0.5)}                       # one tensor of the first file
    t2 = {**t1, "b": t1["b"].copy(), "c": t1["c"] + 1}                 # a sparse change and the second file
    t2["b"][3] = np.float16(7.0)
    return t1, t2


def test_materialize_applies_xor_then_overwrite_in_order(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    t0 = base_checkpoint(tmp_path / "hf")
    t1, t2 = steps(t0)
    root = tmp_path / "deltas"
    write_delta(root, 1, t0, t1, "xor")
    v2 = write_delta(root, 2, t1, t2, "overwrite", "blake3")
    monkeypatch.setenv("ROLLOUT_MILES_BASE", os.fspath(tmp_path / "hf"))
    got = read_all(materialize(v2, tmp_path / "cache"))
    for name, value in t2.items():
        assert got[name].tobytes() == value.tobytes()
    assert read_all(tmp_path / "hf")["a"].tobytes() == t0["a"].tobytes()  # the base is never written
    assert (tmp_path / "cache").exists() and materialize(v2, tmp_path / "cache").name == "v0000002"


def test_a_wrong_base_or_a_missing_delta_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    t0 = base_checkpoint(tmp_path / "hf")
    t1, t2 = steps(t0)
    root = tmp_path / "deltas"
    v1 = write_delta(root, 1, t0, t1)
    wrong = tmp_path / "other"
    base_checkpoint(wrong)
    st.save_file({"a": np.zeros(64, np.float32), "b": t0["b"]}, os.fspath(wrong / "model-00001-of-00002.safetensors"))
    monkeypatch.setenv("ROLLOUT_MILES_BASE", os.fspath(wrong))
    with pytest.raises(WeightsError, match="checksum"):
        materialize(v1, tmp_path / "cache")
    assert not any((tmp_path / "cache").rglob("v0000001"))  # nothing half-built is left
    monkeypatch.setenv("ROLLOUT_MILES_BASE", os.fspath(tmp_path / "hf"))
    v3 = root / "weight_v000003"
    write_delta(root, 3, t2, t2 | {"c": t2["c"] * 2})
    with pytest.raises(WeightsError, match="weight_v000002"):
        materialize(v3, tmp_path / "cache")


def test_post_write_hook_records_each_version_for_the_workers(tmp_path: Path, redis_url: str, queue_name: str,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    from rollout_queue.integrations.miles import record_version

    q = RolloutQueue.from_url(redis_url, queue_name, QueueConfig(max_staleness=4))
    monkeypatch.setenv("REDIS_URL", redis_url)
    monkeypatch.setenv("ROLLOUT_QUEUE", queue_name)
    monkeypatch.delenv("ROLLOUT_MILES_BASE", raising=False)
    monkeypatch.setenv("ROLLOUT_WEIGHTS_CACHE", os.fspath(tmp_path / "cache"))
    t0 = base_checkpoint(tmp_path / "hf")
    t1, _ = steps(t0)
    root = tmp_path / "deltas"
    root.mkdir()
    args = SimpleNamespace(hf_checkpoint=os.fspath(tmp_path / "hf"))
    assert record_version(args, os.fspath(root), []) is False  # miles' baseline call: where version 0 is
    v1 = write_delta(root, 1, t0, t1)
    assert record_version(args, os.fspath(v1), []) is True
    assert int(q.version) == 1
    s = q.stats()
    assert s.version == 1
    got = read_all(localize(os.fspath(v1)))  # what a worker's engine loads for the recorded URI
    assert got["a"].tobytes() == t1["a"].tobytes()
    q.close()
