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


def test_a_delta_chain_is_fetched_checked_and_cached(store: tuple[Path, str, list[str]], tmp_path: Path) -> None:
    root, url, seen = store
    net = Net()
    v1 = write_version(root, 1, model=net)
    with torch.no_grad():
        net.b.weight.add_(1)
    v2 = write_version(root, 2, tensors={"b.weight": net.b.weight}, base=v1)
    cache = tmp_path / "cache"
    local = localize(f"{url}/{v2.name}", cache)
    assert local.parent.parent == cache and weight_chain(local)[-1] == local
    state = read_chain_state(weight_chain(local))
    assert all(torch.equal(state[k], v) for k, v in net.state_dict().items())
    # Cached: asking again fetches only the head manifest, no tensor file.
    seen.clear()
    assert localize(f"{url}/{v2.name}", cache) == local
    assert seen == [f"/{v2.name}/manifest.json"]
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
