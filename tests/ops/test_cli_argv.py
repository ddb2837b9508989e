"""The ``rollout-queue`` argument parser (issue 29 item 19): every option reaches its command, in any
order, whatever its value.

A hand-written argv scan once took any word ``worker`` for the subcommand, so ``acl --role worker
--password P --apply --yes`` exited 0 having applied nothing, and ``rollout-queue worker --url U --
--engine torch`` exited 2. Now one argparse tree parses everything. The property test runs every
subcommand through ``main`` with its command function replaced by a recorder, its options in a random
order (also before, between and after the positionals, the connection options before or after the
subcommand, a ``--`` anywhere among the worker's) and values that are other subcommands' names; the
namespace the command receives must hold every value given. Real runs against a private server then
show an option after a colliding value taking effect.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import signal
import subprocess
import sys
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import redis
from hypothesis import given, settings
from hypothesis import strategies as st

from rollout_queue import QueueConfig, RolloutQueue, SourceGroup
from rollout_queue.cli import build_parser, main
from rollout_queue.devtools.local_server import LocalServer
from rollout_queue.ops import acl
from rollout_queue.workers import cli as worker_cli
from tests.helpers import wait_until
from tests.ops.conftest import Cli

REPO = Path(__file__).resolve().parents[2]
PARSER = build_parser()
#: name -> the subcommand's parser (argparse keeps them on its private _SubParsersAction).
COMMANDS: dict[str, argparse.ArgumentParser] = next(
    a for a in PARSER._actions if isinstance(a, argparse._SubParsersAction)).choices  # type: ignore[assignment]
#: The options before the subcommand: the connection options.
CONNECTION = [a for a in PARSER._actions if a.option_strings and a.dest != "help"]
#: Values a word scan could take for a subcommand.
COLLIDING = sorted(COMMANDS)


@dataclass
class Unit:
    """Words that stay together (an option and its value), and what they must set."""
    words: list[str]
    dest: str
    value: Any
    append: bool = False


def value_of(draw: st.DrawFn, action: argparse.Action) -> tuple[str, Any]:
    """A value for ``action``: (the word on the command line, what the namespace must hold)."""
    if action.choices is not None:
        choice = draw(st.sampled_from(sorted(action.choices)))
        return str(choice), choice
    if action.type is int:
        number = draw(st.integers(-5, 10**6))  # negative too: `train --max-staleness -1` is documented
        return str(number), number
    if action.type is float:
        real = draw(st.floats(0, 1e6, allow_nan=False, allow_infinity=False))
        return repr(real), float(repr(real))
    assert action.type is None, f"{action.dest}: a type this test does not generate ({action.type})"
    word = draw(st.sampled_from(COLLIDING + ["x", "a b"]))
    return word, word


def option_units(draw: st.DrawFn, actions: list[argparse.Action]) -> list[Unit]:
    units = []
    for action in actions:
        if not (action.required or draw(st.booleans())):
            continue
        flag = draw(st.sampled_from(action.option_strings))
        if action.nargs == 0:  # store_true, store_false
            units.append(Unit([flag], action.dest, action.const))
        elif isinstance(action, argparse._AppendAction):
            for _ in range(draw(st.integers(1, 2))):
                word, value = value_of(draw, action)
                units.append(Unit([flag, word], action.dest, value, append=True))
        else:
            word, value = value_of(draw, action)
            units.append(Unit([flag, word], action.dest, value))
    return units


def positional_words(draw: st.DrawFn, actions: list[argparse.Action]) -> tuple[list[str], dict[str, Any]]:
    words: list[str] = []
    expected: dict[str, Any] = {}
    for action in actions:
        if action.nargs in (None, "?"):
            if action.nargs == "?" and draw(st.booleans()):
                expected[action.dest] = action.default
                continue
            word, value = value_of(draw, action)
            words.append(word)
            expected[action.dest] = value
        else:
            assert action.nargs == "*", f"{action.dest}: nargs {action.nargs!r} not generated"
            values = [value_of(draw, action)[0] for _ in range(draw(st.integers(0, 3)))]
            words += values
            expected[action.dest] = values or ([] if action.default is None else action.default)
    return words, expected


@st.composite
def command_lines(draw: st.DrawFn) -> tuple[list[str], str, dict[str, Any]]:
    """(argv, subcommand, what its namespace must hold)."""
    name = draw(st.sampled_from(sorted(COMMANDS)))
    sub = COMMANDS[name]
    own = [a for a in sub._actions if a.option_strings and a.dest != "help"]
    takes = {a.dest for a in own}
    before, after = [], []
    # The connection options: before the subcommand, or after it where it takes them (the worker has
    # no --tls-*: test_a_connection_option_the_worker_does_not_take_is_refused).
    for unit in option_units(draw, [a for a in CONNECTION if name != "worker" or a.dest in takes]):
        (after if unit.dest in takes and draw(st.booleans()) else before).append(unit)
    after += option_units(draw, [a for a in own if a.dest not in {c.dest for c in CONNECTION}])
    before, after = draw(st.permutations(before)), draw(st.permutations(after))
    words, expected = positional_words(draw, [a for a in sub._actions if not a.option_strings])
    # The positionals keep their order; the option units go anywhere among them.
    slots = sorted(draw(st.lists(st.integers(0, len(after)), min_size=len(words), max_size=len(words))))
    tail: list[str] = []
    for i in range(len(after) + 1):
        tail += [word for word, slot in zip(words, slots) if slot == i]
        tail += after[i].words if i < len(after) else []
    if name == "worker" and draw(st.booleans()):  # `rollout-queue worker [options] -- [options]`
        tail.insert(draw(st.sampled_from([sum(len(u.words) for u in after[:i]) for i in range(len(after) + 1)])), "--")
    for unit in before + after:  # in command-line order: repeated options append in it
        if unit.append:
            expected.setdefault(unit.dest, []).append(unit.value)
        else:
            expected[unit.dest] = unit.value
    return [w for unit in before for w in unit.words] + [name] + tail, name, expected


def recording(mp: pytest.MonkeyPatch) -> list[argparse.Namespace]:
    """Every command's function replaced by one that records the namespace it gets and returns 0
    (register looks the function up when main builds the parser)."""
    seen: list[argparse.Namespace] = []
    for sub in COMMANDS.values():
        func = sub.get_default("func")
        mp.setattr(sys.modules[func.__module__], func.__name__, lambda args: seen.append(args) or 0)
    return seen


@settings(max_examples=400, deadline=None)
@given(line=command_lines())
def test_every_option_reaches_its_command_in_any_order(line: tuple[list[str], str, dict[str, Any]]) -> None:
    argv, name, expected = line
    with pytest.MonkeyPatch.context() as mp:
        seen = recording(mp)
        assert main(argv) == 0, argv
    (args,) = seen
    got = {dest: getattr(args, dest, "<missing>") for dest in expected}
    assert (args.command, got) == (name, expected), argv


def test_the_generator_reaches_every_subcommand_and_option() -> None:
    """Not vacuous: every subcommand has a recorded function, and no option has a type the generator
    cannot produce (value_of asserts it)."""
    assert {"worker", "acl", "produce", "train", "demo", "stats", "dlq", "config"} <= set(COMMANDS)
    for name, sub in COMMANDS.items():
        assert callable(sub.get_default("func")), name
        for action in sub._actions:
            assert action.type in (None, int, float) or action.choices is not None, (name, action.dest)


# -- the command lines, end to end -----------------------------------------------------------


def test_acl_role_worker_then_apply_really_applies_the_user(cli: Cli, server: LocalServer, queue_name: str,
                                                             r: redis.Redis) -> None:
    user = acl.user_name(queue_name, "worker")
    try:
        code, out, err = cli(server.url, queue_name, "acl", "--role", "worker", "--password", "worker=s3cret",
                             "--apply", "--yes")
        assert (code, out.split()) == (0, ["applied", user]), err
        assert hashlib.sha256(b"s3cret").hexdigest() in r.acl_getuser(user)["passwords"]
    finally:
        r.execute_command("ACL", "DELUSER", user)


def test_produce_named_worker_keeps_the_options_after_the_name(cli: Cli, server: LocalServer, queue_name: str,
                                                               tmp_path: Path) -> None:
    data = tmp_path / "prompts.jsonl"
    data.write_text("".join(json.dumps({"prompt": f"p{i}"}) + "\n" for i in range(3)))
    # --create after the value `worker`: without it the queue does not exist (exit 4).
    code, _, err = cli(server.url, queue_name, "produce", str(data), "--name", "worker", "--create", "--n", "2",
                       "--no-progress")
    assert code == 0, err
    q = RolloutQueue.from_url(server.url, queue_name)
    try:
        got = q.worker("reader").reserve(3)
        assert sorted(x.group.source_id for x in got) == ["worker:0:0", "worker:0:1", "worker:0:2"]
        assert {x.group.n for x in got} == {2}
    finally:
        q.close()


def test_the_documented_worker_line_runs_with_options_on_both_sides_of_the_separator(
        cli: Cli, server: LocalServer, queue_name: str) -> None:
    """examples/trl_grpo.py's form, `rollout-queue worker --url U --queue Q -- --engine ...`, with a
    worker id that is a subcommand's name."""
    q = RolloutQueue.from_url(server.url, queue_name, QueueConfig())
    q.submit([SourceGroup("g", "prompt", 2)])
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen([sys.executable, "-m", "rollout_queue", "worker", "--url", server.url, "--queue",
                             queue_name, "--", "--engine", "scripted", "--worker-id", "worker", "--block-ms", "200"],
                            cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    def served() -> bool:
        workers = json.loads(cli(server.url, queue_name, "workers", "--json")[1])
        return q.stats().completed == 1 and [w["worker_id"] for w in workers] == ["worker"]

    try:
        wait_until(lambda: proc.poll() is not None or served(), 60, interval=0.05,
                   message="worker `worker` to complete the group")
        assert proc.poll() is None, proc.communicate()[1]
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
        assert proc.returncode == 0, err
    finally:
        proc.kill()
        q.close()


def test_help_shows_the_workers_options(capsys: pytest.CaptureFixture[str]) -> None:
    flags = {f for a in worker_cli.build_parser()._actions for f in a.option_strings if f not in ("-h", "--help")}
    for argv in (["--help"], ["worker", "--help"]):
        with pytest.raises(SystemExit) as exit_:
            main(argv)
        out = capsys.readouterr().out
        assert exit_.value.code == 0 and not [f for f in flags if f not in out], argv


def test_a_connection_option_the_worker_does_not_take_is_refused(cli: Cli, capsys: pytest.CaptureFixture[str]) -> None:
    """Refused, not dropped: before the subcommand (exit 2, nothing started), and after it (argparse's exit 2)."""
    code, _, err = cli("rediss://127.0.0.1:1/0", "q", "--tls-ca-cert", "/nonexistent/ca.pem", "worker",
                       "--engine", "scripted")
    assert code == 2 and "does not take --tls-ca-cert" in err
    with pytest.raises(SystemExit) as exit_:
        main(["--url", "rediss://127.0.0.1:1/0", "--queue", "q", "worker", "--tls-ca-cert", "/nonexistent/ca.pem"])
    assert exit_.value.code == 2 and "unrecognized arguments: --tls-ca-cert" in capsys.readouterr().err
