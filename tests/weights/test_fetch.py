"""Workers without shared storage: versions fetched over real HTTP (a local ``http.server``) into a
per-worker cache, every byte checked against the manifest's digests, nothing half-fetched kept."""

from __future__ import annotations

import functools
import threading
from collections.abc import Iterator
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("fsspec")
pytest.importorskip("aiohttp")

from rollout_queue.core.errors import WeightsError  # noqa: E402
from rollout_queue.weights import read_chain_state, weight_chain, write_version  # noqa: E402
from rollout_queue.weights.fetch import is_remote, localize  # noqa: E402


class Quiet(SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture
def store(tmp_path: Path) -> Iterator[tuple[Path, str, list[str]]]:
    """A weights root served over HTTP: (root, base URL, request paths seen)."""
    root = tmp_path / "served"
    root.mkdir()
    seen: list[str] = []

    class Recording(Quiet):
        def do_GET(self) -> None:
            seen.append(self.path)
            super().do_GET()

    server = ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(Recording, directory=str(root)))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield root, f"http://127.0.0.1:{server.server_address[1]}", seen
    server.shutdown()
    server.server_close()


class Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.a, self.b = torch.nn.Linear(16, 16), torch.nn.Linear(16, 4)


def full_and_delta(root: Path) -> tuple[Net, Path, Path]:
    """v1 (full) and v2 (a delta of one tensor) under ``root``; the net holds v2's weights."""
    net = Net()
    v1 = write_version(root, 1, model=net)
    with torch.no_grad():
        net.b.weight.add_(1)
    return net, v1, write_version(root, 2, tensors={"b.weight": net.b.weight}, base=v1)


def test_a_delta_chain_is_fetched_checked_and_cached(store: tuple[Path, str, list[str]], tmp_path: Path) -> None:
    root, url, seen = store
    net, v1, v2 = full_and_delta(root)
    cache = tmp_path / "cache"
    local = localize(f"{url}/{v2.name}", cache)
    assert local.parent.parent == cache and weight_chain(local)[-1] == local
    state = read_chain_state(weight_chain(local))
    assert all(torch.equal(state[k], v) for k, v in net.state_dict().items())
    # Cached: asking again fetches only the chain's manifests (each compared with the cached one), no tensor file.
    seen.clear()
    assert localize(f"{url}/{v2.name}", cache) == local
    assert sorted(seen) == [f"/{v1.name}/manifest.json", f"/{v2.name}/manifest.json"]
    # Local paths and file:// URIs are used where they are.
    assert localize(str(v2)) == v2 and localize(f"file://{v2}") == v2
    assert not is_remote(str(v2)) and is_remote(url)


def test_corrupt_short_and_missing_files_are_refused_and_nothing_is_cached(store: tuple[Path, str, list[str]],
                                                                          tmp_path: Path) -> None:
    root, url, _ = store
    net = Net()
    v1 = write_version(root, 1, model=net)
    cache = tmp_path / "cache"
    data = (v1 / "model.safetensors").read_bytes()
    (v1 / "model.safetensors").write_bytes(data[:-1] + bytes([data[-1] ^ 1]))  # one bit flipped
    with pytest.raises(WeightsError, match="sha256"):
        localize(f"{url}/{v1.name}", cache)
    (v1 / "model.safetensors").write_bytes(data[:100])
    with pytest.raises(WeightsError, match="100 bytes"):
        localize(f"{url}/{v1.name}", cache)
    with pytest.raises(WeightsError, match="no manifest"):
        localize(f"{url}/v0000009", cache)
    undigested = write_version(root, 2, model=net, digests=False)
    with pytest.raises(WeightsError, match="needs a sha256"):
        localize(f"{url}/{undigested.name}", cache)
    assert not any(p.name.startswith("v") for p in cache.rglob("*"))  # no folder, no partial one
    with pytest.raises(WeightsError, match="did not answer|no manifest"):
        localize("http://127.0.0.1:9/v0000001", cache)  # nothing listens on port 9


def test_a_cached_folder_is_used_only_while_it_is_the_stores(store: tuple[Path, str, list[str]],
                                                             tmp_path: Path) -> None:
    """Issue 29 item 5: the store's folders of a chain rewritten under the same names (a trainer
    restarted on another machine publishing the same versions again) are fetched again: the
    worker gets the bytes of the store's current manifests, not the ones it cached before."""
    import shutil

    root, url, _ = store
    net, v1, v2 = full_and_delta(root)
    cache = tmp_path / "cache"
    old = read_chain_state(weight_chain(localize(f"{url}/{v2.name}", cache)))
    shutil.rmtree(v1)
    shutil.rmtree(v2)
    with torch.no_grad():
        for p in net.parameters():
            p.mul_(-2)
    assert write_version(root, 1, model=net) == v1
    with torch.no_grad():
        net.a.bias.add_(3)
    assert write_version(root, 2, tensors={"a.bias": net.a.bias}, base=v1) == v2
    state = read_chain_state(weight_chain(localize(f"{url}/{v2.name}", cache)))
    assert all(torch.equal(state[k], v) for k, v in net.state_dict().items())
    assert not torch.equal(state["b.weight"], old["b.weight"])
    assert sorted(p.name for p in (cache.iterdir().__next__()).iterdir()) == [v1.name, v2.name]  # nothing left aside


@pytest.fixture
def s3_store(monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """A bucket on a local S3 server (moto's, speaking the S3 REST protocol over HTTP), reached the
    way a worker reaches a real one: s3fs with the standard AWS variables. Yields its base URI."""
    pytest.importorskip("s3fs")
    moto_server = pytest.importorskip("moto.server")
    import boto3

    server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    endpoint = f"http://127.0.0.1:{server._server.server_port}"
    for name, value in {"AWS_ACCESS_KEY_ID": "test", "AWS_SECRET_ACCESS_KEY": "test",
                        "AWS_DEFAULT_REGION": "us-east-1", "AWS_ENDPOINT_URL": endpoint}.items():
        monkeypatch.setenv(name, value)
    boto3.client("s3").create_bucket(Bucket="weights")
    import fsspec

    fsspec.config.conf.pop("s3", None)
    try:
        yield "s3://weights/run-7"
    finally:
        import s3fs

        s3fs.S3FileSystem.clear_instance_cache()
        server.stop()


def test_a_publisher_uploads_to_s3_and_a_worker_fetches_the_chain_back(s3_store: str, tmp_path: Path) -> None:
    """The trainer's publisher copies every version to the bucket (manifest last) and removes the
    ones it prunes; a worker with only the bucket's URI rebuilds each version, checked byte for byte."""
    import boto3

    from rollout_queue.weights import WeightPublisher

    class Recorder:  # the queue side of publish: record_weight_update through a hold
        name = "s3-test"
        recorded: list[tuple[int, str]] = []

        def hold(self, timeout_s: float) -> "Recorder":
            return self

        def record_weight_update(self, version: int, uri: str) -> None:
            self.recorded.append((version, uri))

        def release(self) -> None:
            pass

    queue = Recorder()
    net = Net()
    publisher = WeightPublisher(queue, tmp_path / "local", transport="delta", uri_base=s3_store, upload=True,  # type: ignore[arg-type]
                                keep=2, full_every=2)
    states = []
    for version in range(1, 6):
        with torch.no_grad():
            net.b.weight.add_(version)
        publisher.publish(net, version)
        states.append({k: v.clone() for k, v in net.state_dict().items()})
        uri = queue.recorded[-1][1]
        assert uri == f"{s3_store}/v{version:07d}"
        local = localize(uri, tmp_path / "cache")
        state = read_chain_state(weight_chain(local))
        assert all(torch.equal(state[k], v) for k, v in states[-1].items())
    keys = {o["Key"].split("/")[1] for o in boto3.client("s3").list_objects_v2(Bucket="weights")["Contents"]}
    assert keys == {p.name for p in (tmp_path / "local").iterdir()}  # pruned there as here
    assert len(keys) < 5
    # A corrupt object in the bucket: refused, nothing cached.
    boto3.client("s3").put_object(Bucket="weights", Key="run-7/v0000005/model.safetensors", Body=b"garbage")
    with pytest.raises(WeightsError):
        localize(f"{s3_store}/v0000005", tmp_path / "cache2")
    assert not any((tmp_path / "cache2").rglob("*.safetensors"))
