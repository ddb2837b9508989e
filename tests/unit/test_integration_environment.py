"""The adapters' one environment convention (integrations/environment.py), with no Redis: explicit
configuration first, then REDIS_URL / ROLLOUT_QUEUE, else a typed error naming what to set; and no
adapter spells the variable names itself, so the convention cannot drift apart again."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from rollout_queue.core.errors import IntegrationConfigError
from rollout_queue.integrations.environment import QUEUE_ENV, URL_ENV, queue_address

INTEGRATIONS = Path(__file__).resolve().parents[2] / "rollout_queue" / "integrations"
ENV = {URL_ENV: "redis://env-host:6379/0", QUEUE_ENV: "env-queue"}


def test_the_names_are_the_projects() -> None:
    assert (URL_ENV, QUEUE_ENV) == ("REDIS_URL", "ROLLOUT_QUEUE")


def test_the_environment_fills_in_what_the_configuration_leaves_out() -> None:
    assert queue_address(needs="x", environ=ENV) == ("redis://env-host:6379/0", "env-queue")
    assert queue_address("redis://cfg:1/0", None, needs="x", environ=ENV) == ("redis://cfg:1/0", "env-queue")
    assert queue_address(None, "cfg-queue", needs="x", environ=ENV) == ("redis://env-host:6379/0", "cfg-queue")
    # an empty setting is no setting (a YAML key left blank, an empty env var)
    assert queue_address("", "", needs="x", environ=ENV) == ("redis://env-host:6379/0", "env-queue")


def test_the_configuration_wins_over_the_environment() -> None:
    assert queue_address("redis://cfg:1/0", "cfg-queue", needs="x", environ=ENV) == ("redis://cfg:1/0", "cfg-queue")
    assert queue_address("redis://cfg:1/0", "cfg-queue", needs="x", environ={}) == ("redis://cfg:1/0", "cfg-queue")


def test_the_process_environment_is_read_when_none_is_given(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(URL_ENV, "redis://proc:2/0")
    monkeypatch.setenv(QUEUE_ENV, "proc-queue")
    assert queue_address(needs="x") == ("redis://proc:2/0", "proc-queue")


@pytest.mark.parametrize(("url", "environ", "named", "not_named"), [
    (None, {}, ["the Redis URL (cfg.url or REDIS_URL)", "the queue name (cfg.queue or ROLLOUT_QUEUE)"], []),
    ("redis://cfg:1/0", {}, ["the queue name (cfg.queue or ROLLOUT_QUEUE)"], ["the Redis URL"]),
    (None, {QUEUE_ENV: "q"}, ["the Redis URL (cfg.url or REDIS_URL)"], ["the queue name"]),
    (None, {URL_ENV: "", QUEUE_ENV: ""}, ["the Redis URL", "the queue name"], []),
])
def test_a_missing_setting_is_named_with_both_ways_to_set_it(url: str | None, environ: dict[str, str],
                                                             named: list[str], not_named: list[str]) -> None:
    with pytest.raises(IntegrationConfigError) as got:
        queue_address(url, None, needs="the widget", keys=("cfg.url", "cfg.queue"), environ=environ)
    message = str(got.value)
    assert message.startswith("the widget has no ") and "configuration key, or the environment variable" in message
    assert all(part in message for part in named) and not any(part in message for part in not_named), message


def test_an_environment_only_adapter_is_told_the_variables() -> None:
    with pytest.raises(IntegrationConfigError, match=r"no the Redis URL \(REDIS_URL\) and the queue name "
                                                     r"\(ROLLOUT_QUEUE\): set the environment variable") as got:
        queue_address(needs="the miles integration", environ={})
    assert str(got.value).startswith("the miles integration")
    assert "configuration key" not in str(got.value) and "--runtime-env-json" in str(got.value)


def code_strings(path: Path) -> set[str]:
    """The string constants of a module's code, docstrings left out (they document the variables)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    docstrings = {id(node.body[0].value) for node in ast.walk(tree)
                  if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef)
                  and node.body and isinstance(node.body[0], ast.Expr)
                  and isinstance(node.body[0].value, ast.Constant)}
    return {node.value for node in ast.walk(tree)
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings}


def test_no_adapter_spells_the_variable_names() -> None:
    """Every adapter goes through queue_address: a name read anywhere else is a second convention."""
    spelled = {str(path.relative_to(INTEGRATIONS)): sorted(text for text in code_strings(path)
                                                             if "REDIS_URL" in text or "ROLLOUT_QUEUE" in text)
               for path in sorted(INTEGRATIONS.rglob("*.py")) if path.name != "environment.py"}
    assert {path: names for path, names in spelled.items() if names} == {}
