"""The package's layers, as the folders say: the core is sans-IO, drivers do the I/O, and the
installed distribution adds one top-level name (issue 13)."""

from __future__ import annotations

import ast
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

import rollout_queue

PACKAGE = Path(rollout_queue.__file__).resolve().parent
REPO = PACKAGE.parent
#: sans-IO layers: what each may import from the package
SANS_IO = {"core": ("core",), "scale": ("core", "scale")}


def modules_of(folder: str) -> list[Path]:
    return sorted((PACKAGE / folder).rglob("*.py"))


def imported_package_parts(path: Path) -> set[str]:
    """The rollout_queue subpackages a module imports (``rollout_queue.core.x`` -> ``core``)."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        names = [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level else (
            [a.name for a in node.names] if isinstance(node, ast.Import) else [])
        for name in names:
            parts = name.split(".")
            if parts[0] == "rollout_queue":
                out.add(parts[1] if len(parts) > 1 else "")
            if parts[0] in ("redis", "hiredis"):
                out.add("<redis>")
    return out


@pytest.mark.parametrize("layer", sorted(SANS_IO))
def test_sans_io_layers_import_only_themselves(layer: str) -> None:
    bad = {}
    for path in modules_of(layer):
        extra = imported_package_parts(path) - set(SANS_IO[layer])
        if extra:
            bad[str(path.relative_to(PACKAGE))] = sorted(extra)
    assert not bad, f"{layer}/ must not import redis, drivers or the facade: {bad}"


def imported_modules(path: Path) -> set[str]:
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and not node.level:
            out.add(node.module or "")
        elif isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
    return out


def test_integrations_call_the_public_api_only() -> None:
    """Integrations never reach into keys, scripts, flows, drivers or partitions (the guide: "the CLI
    and the integrations only call the public API"), and only trl*.py import TRL."""
    inner = ("rollout_queue.core.flows", "rollout_queue.core.keys", "rollout_queue.core.scripts",
             "rollout_queue.core.protocol", "rollout_queue.drivers", "rollout_queue.scale", "redis")
    bad, trl = {}, set()
    for path in modules_of("integrations"):
        mods = imported_modules(path)
        reach = sorted(m for m in mods if m == "redis" or m.startswith(inner))
        if reach:
            bad[path.name] = reach
        if any(m.split(".")[0] == "trl" for m in mods):
            trl.add(path.name)
    assert not bad, f"integrations reaching past the public API: {bad}"
    assert trl <= {"trl.py", "trl_async.py"}, trl


def test_the_core_imports_without_redis_or_a_driver() -> None:
    """Importing every sans-IO module (through the package's __init__) loads neither redis nor a driver."""
    mods = [".".join(p.relative_to(REPO).with_suffix("").parts).removesuffix(".__init__")
            for layer in SANS_IO for p in modules_of(layer)]
    code = ("import sys\n" + "".join(f"import {m}\n" for m in mods) +
            "bad = sorted(m for m in sys.modules if m.split('.')[0] == 'redis' or "
            "m.startswith(('rollout_queue.drivers', 'rollout_queue.api')))\n"
            "assert not bad, bad\nprint(len(sys.modules))")
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr


def test_public_names_still_import_from_the_package() -> None:
    from rollout_queue import (AsyncHold, AsyncLease, AsyncPartitionedQueue, AsyncRolloutQueue,  # noqa: F401
                               AsyncWorker, FleetReserver, Hold, Lease, PartitionedQueue, QueueConfig, RolloutQueue,
                               Worker)
    for name in rollout_queue.__all__:
        assert getattr(rollout_queue, name) is not None, name


def test_one_error_module_with_one_root() -> None:
    """Every exception class the library defines lives in core/errors.py (the CLI's usage errors
    excepted: they never leave the CLI) and derives from RolloutQueueError."""
    from rollout_queue.core import errors

    strays = []
    for path in PACKAGE.rglob("*.py"):
        if path == PACKAGE / "core" / "errors.py" or "cli" in path.relative_to(PACKAGE).parts:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef) and any(
                    getattr(b, "id", getattr(b, "attr", "")).endswith(("Error", "Exception")) for b in node.bases):
                strays.append(f"{path.relative_to(PACKAGE)}:{node.name}")
    assert not strays, f"exception classes outside core/errors.py: {strays}"
    classes = [v for v in vars(errors).values() if isinstance(v, type) and issubclass(v, BaseException)]
    assert all(issubclass(c, errors.RolloutQueueError) for c in classes if c.__module__ == errors.__name__)


def test_the_wheel_adds_one_top_level_name(tmp_path: Path) -> None:
    """``pip install`` must not put generic names (``workers``, ``chaos``) into site-packages."""
    done = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
                           "-w", str(tmp_path), str(REPO)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    [wheel] = tmp_path.glob("*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    tops = {n.split("/")[0] for n in names if not n.split("/")[0].endswith((".dist-info", ".data"))}
    assert tops == {"rollout_queue"}, tops
    assert "rollout_queue/core/lua/reserve.lua" in names and "rollout_queue/py.typed" in names
