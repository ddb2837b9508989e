"""docker-compose.yml, checked without Docker: every service's command parses with the real CLI
parsers, every ${VAR} it uses is defined in .env, and Redis, GPUs and restarts are set up as the
docs/USAGE.md says."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

yaml = pytest.importorskip("yaml")

REPO = Path(__file__).resolve().parents[2]
VAR = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?:[:?-][^}]*)?\}")


def env_file() -> dict[str, str]:
    out = {}
    for line in (REPO / ".env").read_text().splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            name, sep, value = line.partition("=")
            assert sep, f".env line {line!r} is not NAME=value"
            out[name.strip()] = value.strip()
    return out


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    data: dict[str, Any] = yaml.safe_load((REPO / "docker-compose.yml").read_text())
    return data


def substitute(value: str, env: dict[str, str]) -> str:
    return VAR.sub(lambda m: env[m.group(1)], value)


def test_every_referenced_variable_is_defined_in_dot_env() -> None:
    # deploy/compose.cpu.yml is layered over docker-compose.yml and reads the same .env.
    used = {v for f in ("docker-compose.yml", "deploy/compose.cpu.yml") for v in VAR.findall((REPO / f).read_text())}
    defined = env_file()
    assert used, "the compose file should take its knobs from .env"
    assert used <= set(defined), f"undefined in .env: {sorted(used - set(defined))}"
    assert set(defined) <= used, f"defined in .env but unused: {sorted(set(defined) - used)}"


def test_the_services_the_readme_promises_are_there(compose: dict[str, Any]) -> None:
    assert {"redis", "trainer", "producer", "reaper", "worker", "metrics"} <= set(compose["services"])


def test_every_rollout_queue_command_parses_with_the_real_cli(compose: dict[str, Any]) -> None:
    from rollout_queue.cli import build_parser

    env = env_file()
    parsed = {}
    for name, service in compose["services"].items():
        command = [substitute(str(x), env) for x in service.get("command", [])]
        if not command or command[0] != "rollout-queue":
            continue
        try:
            args = build_parser().parse_args(command[1:])  # the worker's options too: one tree
        except SystemExit as exc:
            raise AssertionError(f"service {name}: `{' '.join(command)}` does not parse") from exc
        parsed[name] = args.command
    assert parsed == {"trainer": "train", "producer": "produce", "reaper": "reaper", "worker": "worker",
                      "metrics": "metrics"}
    assert "--port" in compose["services"]["metrics"]["command"]


def test_redis_keeps_an_aof_and_never_evicts(compose: dict[str, Any]) -> None:
    command = compose["services"]["redis"]["command"]
    pairs = dict(zip(command[1::2], command[2::2]))
    assert pairs["--appendonly"] == "yes" and pairs["--maxmemory-policy"] == "noeviction"
    assert "redis-data:/data" in compose["services"]["redis"]["volumes"]


def test_workers_and_the_trainer_reserve_gpus(compose: dict[str, Any]) -> None:
    for name in ("worker", "trainer"):
        devices = compose["services"][name]["deploy"]["resources"]["reservations"]["devices"]
        assert devices and "gpu" in devices[0]["capabilities"], name
    assert compose["services"]["worker"]["deploy"]["replicas"] == "${WORKERS}"


def test_everything_waits_for_the_queue_the_trainer_creates(compose: dict[str, Any]) -> None:
    services = compose["services"]
    assert services["trainer"]["depends_on"]["redis"]["condition"] == "service_healthy"
    for name in ("producer", "reaper", "worker", "metrics"):
        assert services[name]["depends_on"]["trainer"]["condition"] == "service_healthy", name
        assert services[name]["environment"]["REDIS_URL"] == "${REDIS_URL}", name
