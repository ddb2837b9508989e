"""Weight versions on storage (rollout_queue.weights): full and delta folders, chains, pruning, and
the publisher recording each version in a real queue."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from rollout_queue import RolloutQueue  # noqa: E402
from rollout_queue.core.errors import WeightsError  # noqa: E402
from rollout_queue.weights import (  # noqa: E402
    WeightPublisher,
    prune_versions,
    read_chain_state,
    read_manifest,
    weight_chain,
    write_version,
)


class Net(torch.nn.Module):
    """Three layers, so a step can change some tensors and leave others bit-identical."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.a, self.b, self.c = torch.nn.Linear(8, 8), torch.nn.Linear(8, 8), torch.nn.Linear(8, 4)


def same_state(state: dict[str, "torch.Tensor"], model: torch.nn.Module) -> bool:
    expected = model.state_dict()
    return set(state) == set(expected) and all(torch.equal(state[k], expected[k]) for k in expected)


def test_full_then_deltas_rebuild_every_version(tmp_path: Path) -> None:
    net = Net()
    full = write_version(tmp_path, 1, model=net)
    with torch.no_grad():
        net.b.weight.add_(1.0)
    delta = write_version(tmp_path, 2, tensors={"b.weight": net.b.weight}, base=full)
    manifest = read_manifest(delta)
    assert manifest is not None and (manifest.kind, manifest.base, manifest.tensors) == ("delta", 1, 1)
    assert weight_chain(delta) == (full, delta)
    assert same_state(read_chain_state(weight_chain(delta)), net)
    # A reader that applied the full folder reads only the delta.
    assert set(read_chain_state(weight_chain(delta), since=(full,))) == {"b.weight"}
    # A reader on another chain (or none) reads everything.
    assert same_state(read_chain_state(weight_chain(delta), since=(tmp_path / "elsewhere",)), net)


def test_broken_chains_are_refused_before_anything_is_read(tmp_path: Path) -> None:
    net = Net()
    full = write_version(tmp_path, 1, model=net)
    delta = write_version(tmp_path, 2, tensors={"a.bias": net.a.bias}, base=full)
    (delta / "model.safetensors").write_bytes((delta / "model.safetensors").read_bytes()[:-3])
    with pytest.raises(WeightsError, match="bytes, the manifest recorded"):
        weight_chain(delta)
    other = write_version(tmp_path, 3, tensors={"a.bias": net.a.bias}, base=full)
    os.rename(full, tmp_path / "moved")
    with pytest.raises(WeightsError, match="missing"):
        weight_chain(other)
    (tmp_path / "garbage").mkdir()
    (tmp_path / "garbage" / "manifest.json").write_text('{"format": "rollout-queue-weights/1", "kind": 3}')
    with pytest.raises(WeightsError, match="not a valid weights manifest"):
        weight_chain(tmp_path / "garbage")
    with pytest.raises(WeightsError, match="no weights folder"):
        weight_chain(tmp_path / "nothing")


def test_a_same_size_file_that_is_not_the_published_one_is_refused(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 29 item 5: a local folder's files are checked against the manifest's sha256, not only
    their sizes. A file verified once is not hashed again while unchanged; rewritten in place with
    its size and mtime kept, it is hashed again (its ctime moved) and refused."""
    import time

    from rollout_queue.weights import store
    from tests.helpers import wait_until

    net = Net()
    full = write_version(tmp_path, 1, model=net)
    delta = write_version(tmp_path, 2, tensors={"a.bias": net.a.bias}, base=full)
    path = full / "model.safetensors"
    data, st = bytearray(path.read_bytes()), path.stat()
    hashed: list[Path] = []
    real_sha256 = store.file_sha256
    monkeypatch.setattr(store, "file_sha256", lambda p: hashed.append(p) or real_sha256(p))
    monkeypatch.setattr(store, "_SETTLED_NS", 50_000_000)  # remembered once 50 ms old (2 s in use)
    written = (delta / "model.safetensors").stat().st_ctime_ns  # the later of the two files
    wait_until(lambda: time.time_ns() > written + 100_000_000, 5, message="the files to settle")
    assert weight_chain(delta) == (full, delta) and len(hashed) == 2  # both files hashed
    assert weight_chain(delta) == (full, delta) and len(hashed) == 2  # remembered: not hashed again
    data[-1] ^= 1  # one bit of the last tensor's data (not its header): same size
    with open(path, "r+b") as handle:
        handle.write(data)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))  # even with its mtime put back
    assert path.stat().st_size == st.st_size and path.stat().st_mtime_ns == st.st_mtime_ns
    with pytest.raises(WeightsError, match="sha256"):
        weight_chain(delta)
    with pytest.raises(WeightsError, match="sha256"):
        weight_chain(full)
    # Without digests (WeightPublisher(digests=False)) only sizes can be checked.
    undigested = write_version(tmp_path, 3, model=net, digests=False)
    assert weight_chain(undigested) == (undigested,)


def test_older_versions_are_the_folders_a_worker_may_start_on(tmp_path: Path) -> None:
    """What a worker that cannot load the recorded version yet tries instead (issue 29 item 4):
    version folders beside it, older than it, newest first, by their manifests' versions."""
    from rollout_queue.weights.fetch import older_versions
    from rollout_queue.weights.store import version_folder

    net = Net()
    v1 = write_version(tmp_path, 1, model=net)
    v2 = write_version(tmp_path, 2, tensors={"a.bias": net.a.bias}, base=v1)
    v3 = write_version(tmp_path, 3, model=net)
    (tmp_path / "v0000004").mkdir()  # a folder of another tool (QueueWeightTransfer): its name's version
    liar = tmp_path / "v0000000"
    liar.mkdir()
    (liar / "manifest.json").write_bytes((v3 / "manifest.json").read_bytes())  # says version 3: skipped
    (tmp_path / "notes").mkdir()
    write_version(tmp_path, 5, model=net)
    write_version(tmp_path, 5, model=net)  # two attempts at version 5: which was recorded is unknown, both skipped
    pending = version_folder(tmp_path, 6, unique=True)  # recorded, not written yet
    newer = write_version(tmp_path, 7, model=net)
    assert older_versions(str(pending), 6) == [(4, str(tmp_path / "v0000004")), (3, str(v3)), (2, str(v2)), (1, str(v1))]
    assert older_versions(str(pending), 6, limit=2) == [(4, str(tmp_path / "v0000004")), (3, str(v3))]
    assert older_versions(f"file://{newer}", 3) == [(2, str(v2)), (1, str(v1))]
    assert older_versions(str(v1), 1) == []  # v0000000's manifest says another version
    assert older_versions(str(tmp_path / "absent" / "v0000002"), 2) == []
    assert older_versions("https://weights.internal/run/v0000006", 6) == []  # a store is not listed


def test_pruning_keeps_the_chains_of_kept_versions(tmp_path: Path) -> None:
    net = Net()
    full = write_version(tmp_path, 1, model=net)
    deltas = [full]
    for version in range(2, 6):
        deltas.append(write_version(tmp_path, version, tensors={"c.bias": net.c.bias}, base=deltas[-1]))
    restart = write_version(tmp_path, 6, model=net)
    removed = prune_versions(tmp_path, keep=2)
    # v5 (a delta) is kept, so its whole chain v1..v4 is too; nothing is prunable yet.
    assert removed == [] and weight_chain(deltas[-1])
    write_version(tmp_path, 7, tensors={"c.bias": net.c.bias}, base=restart)
    assert sorted(p.name for p in prune_versions(tmp_path, keep=2)) == [d.name for d in deltas]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["v0000006", "v0000007"]


def test_publisher_writes_deltas_of_changed_tensors(server: object, redis_url: str, queue_name: str,
                                                    tmp_path: Path) -> None:
    queue = RolloutQueue.from_url(redis_url, queue_name)
    net = Net()
    publisher = WeightPublisher(queue, tmp_path, transport="delta", full_every=3)
    kinds = []
    for version in range(1, 6):
        if version > 1:
            with torch.no_grad():
                net.a.weight.mul_(0.5)  # one tensor of six changes per step
        uri = publisher.publish(net, version)
        assert publisher.last is not None
        kinds.append((publisher.last.kind, publisher.last.tensors))
        assert queue.version == version and uri == publisher.last.uri
        assert same_state(read_chain_state(weight_chain(uri)), net)
    # full_every=3: a chain holds at most three folders, then a full version starts the next one.
    assert kinds == [("full", 6), ("delta", 1), ("delta", 1), ("full", 6), ("delta", 1)]
    # Every tensor changed: a delta would save nothing, so the version is written in full.
    with torch.no_grad():
        for p in net.parameters():
            p.add_(1.0)
    publisher.publish(net, 6)
    assert publisher.last is not None and publisher.last.kind == "full"
    # Nothing changed: an empty delta, still a version of its own.
    publisher.publish(net, 7)
    assert publisher.last is not None and (publisher.last.kind, publisher.last.tensors) == ("delta", 0)
    assert same_state(read_chain_state(weight_chain(publisher.last.uri)), net)
    # A restarted trainer has no base: its first version is full.
    again = WeightPublisher(queue, tmp_path, transport="delta")
    again.publish(net, 8)
    assert again.last is not None and again.last.kind == "full"
    # The folder transport never writes a delta.
    folder = WeightPublisher(queue, tmp_path, transport="folder")
    folder.publish(net, 9)
    folder.publish(net, 10)
    assert folder.last is not None and folder.last.kind == "full"
    assert weight_chain(folder.last.uri) == (Path(folder.last.uri),)


def test_nan_changes_are_seen_and_unchanged_nans_are_not(server: object, redis_url: str, queue_name: str,
                                                         tmp_path: Path) -> None:
    queue = RolloutQueue.from_url(redis_url, queue_name)
    net = Net()
    with torch.no_grad():
        net.c.bias[0] = float("nan")
    publisher = WeightPublisher(queue, tmp_path, transport="delta")
    publisher.publish(net, 1)
    publisher.publish(net, 2)
    assert publisher.last is not None and publisher.last.tensors == 0
    with torch.no_grad():
        net.b.bias[1] = float("nan")
    publisher.publish(net, 3)
    assert publisher.last is not None and publisher.last.tensors == 1
    assert torch.isnan(read_chain_state(weight_chain(publisher.last.uri))["b.bias"][1])


def test_publisher_refuses_bad_settings(tmp_path: Path) -> None:
    for kwargs in ({"transport": "nccl"}, {"full_every": 0}, {"keep": 0}):
        with pytest.raises(ValueError):
            WeightPublisher(None, tmp_path, **kwargs)  # type: ignore[arg-type]
