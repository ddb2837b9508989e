"""The processes of a run besides the core roles: shipped workers, the pusher, a push-fault member, the adversary.

Owns their command lines, the ACL file the adversary's credential comes from, and the end of a run
with shipped workers (``converge``): the publishers stop, then every live shipped worker gets a
bounded time to apply the last version the queue recorded, and the harness log says which workers
were alive and what that version was, for the checker (pushes.check_pushes).
"""

from __future__ import annotations

import secrets
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

import redis

from rollout_queue.core.keys import QueueKeys
from rollout_queue.devtools.chaos.envs import POISON_MARK
from rollout_queue.devtools.chaos.oplog import read_log
from rollout_queue.devtools.chaos.samples import ENGINE_TOKENS, MAX_TOKENS, TRAJECTORY_TOKENS
from rollout_queue.devtools.chaos.supervisor import Slot
from rollout_queue.ops.acl import role_rules, user_name

if TYPE_CHECKING:
    from rollout_queue.devtools.chaos.harness import Run, RunConfig

#: How long the live shipped workers get, once the publishers stopped, to apply the last version.
CONVERGE_S = 20.0
#: A hostile tool call hangs this many step deadlines (then returns: its thread is freed).
HANG_FACTOR = 3.0


def role_argv(role: str, url: str, queue: str, cfg: "RunConfig", index: int, *tail: str,
              **extra: Any) -> Callable[[Path], list[str]]:
    """The command line of a chaos role (``roles.py``), given its log path; ``tail`` follows a ``--``."""
    def argv(log: Path) -> list[str]:
        out = ["-m", "rollout_queue.devtools.chaos.roles", role, "--url", url, "--queue", queue, "--log", str(log),
               "--seed", str(cfg.seed), "--index", str(index), "--worker-timeout-s", str(cfg.worker_timeout_s)]
        for k, v in extra.items():
            out += [f"--{k.replace('_', '-')}", str(v)]
        return out + (["--", *tail] if tail else [])
    return argv


def shipped_options(cfg: "RunConfig", index: int) -> list[str]:
    """The shipped worker's own options: the scripted engine (poison prompts fail in it, and with
    pushes it takes part in them), the chaos environment and reward, short step deadlines. Worker 0
    aborts its trajectories at a weight update, worker 1 continues them (both paths run). Each saves
    its progress every ``save_progress_every_s``, and each model turn takes ``traj_latency_s`` plus
    up to ``traj_jitter_s``, so kills land while progress records exist and attempts continue them."""
    engine: dict[str, object] = {"max_concurrency": cfg.traj_slots, "latency_s": cfg.traj_latency_s, "jitter_s": cfg.traj_jitter_s,
              "tokens": ENGINE_TOKENS, "fail_prompt": POISON_MARK}
    if cfg.pushes:
        engine["push"] = "true"
    out = ["--engine", "scripted"]
    for k, v in engine.items():
        out += ["--engine-arg", f"{k}={v}"]
    return out + ["--env", "rollout_queue.devtools.chaos.envs:ChaosEnv",
                  "--reward", "rollout_queue.devtools.chaos.envs:chaos_reward",
                  "--max-turns", "4", "--max-tokens", str(MAX_TOKENS), "--trajectory-tokens", str(TRAJECTORY_TOKENS),
                  "--save-progress-every-s", str(cfg.save_progress_every_s),
                  "--env-step-timeout", str(cfg.env_step_timeout_s), "--trajectory-timeout", "30",
                  "--max-samples", str(cfg.traj_slots), "--drain-timeout", "3", "--seed", str(cfg.seed),
                  "--weights-mode", ("abort", "continue")[index % 2], "--json-logs"]


def hang_s(cfg: "RunConfig") -> float:
    return HANG_FACTOR * cfg.env_step_timeout_s


def adversary_interval_s(cfg: "RunConfig") -> float:
    """The adversary's mean seconds between commands: as if ``credential`` were a nemesis kind drawn
    by its weight among the others at the run's fault interval."""
    weights = cfg.nemesis_weights()
    return cfg.fault_interval_s * (sum(weights.values()) + cfg.weights["credential"]) / cfg.weights["credential"]


class Credential:
    """The worker role's ACL user for the adversary, in an ``aclfile`` the server loads at every
    (re)start (ACL SETUSER would not survive a kill -9). The default user keeps every right: the
    other roles connect as it, as before."""

    def __init__(self, queue: str, log_dir: Path) -> None:
        self.user, self.password = user_name(queue, "worker"), secrets.token_hex(12)
        self.path = log_dir / "users.acl"
        self.path.write_text("user default on nopass ~* &* +@all\n"
                             + role_rules(queue, "worker", self.password).aclfile() + "\n")


def add_roles(run: "Run", url: str) -> None:
    """Spawn the shipped workers, the pusher and push-fault member, and the adversary the config asks for."""
    cfg, queue, sup = run.cfg, run.queue, run.sup
    for i in range(cfg.traj_workers):
        sup.add(Slot("traj", i, role_argv("traj", url, queue, cfg, i, *shipped_options(cfg, i))))
    if cfg.pushes:
        expect = cfg.traj_workers + (1 if cfg.unreachable_rate > 0 else 0)  # the join window stays open for it
        sup.add(Slot("pusher", 0, role_argv("pusher", url, queue, cfg, 0, publish_interval_s=cfg.publish_interval_s,
                                            push_every=cfg.push_every, push_join_s=cfg.push_join_s,
                                            push_deadline_s=cfg.push_deadline_s, push_expect=expect)))
        sup.add(Slot("pushfault", 0, role_argv("pushfault", url, queue, cfg, 0, unreachable_rate=cfg.unreachable_rate,
                                               invented_rate=cfg.invented_rate)))
    if run.credential is not None:
        until = time.time() + cfg.deadline_s - cfg.settle_s
        sup.add(Slot("adversary", 0, role_argv("adversary", url, queue, cfg, 0, user=run.credential.user,
                                               password=run.credential.password,
                                               interval_s=round(adversary_interval_s(cfg), 3), until=until,
                                               commands=cfg.adversary_commands)))


def _versions(slot: Slot) -> int:
    """The newest version a shipped worker's log says it started on or applied."""
    out = 0
    if slot.log_path is not None and slot.log_path.exists():
        for rec in read_log(slot.log_path):
            if rec["op"] in ("start", "weights_applied") and rec.get("version") is not None:
                out = max(out, int(rec["version"]))
    return out


def converge(run: "Run") -> None:
    """Stop the publishers, then wait (up to CONVERGE_S) until every live shipped worker applied the
    version the queue recorded last; log it (``final_version``) for the checker, which fails the run
    on a live worker left behind."""
    if not run.cfg.traj_workers:
        return
    run.sup.stop_all(("pusher", "trainer"))
    try:
        raw = run.watch.hget(QueueKeys(run.queue)["meta"], "version")
    except redis.RedisError:
        return
    version, began = int(raw or 0), time.monotonic()
    live = run.sup.running("traj")
    while time.monotonic() - began < CONVERGE_S and any(_versions(s) != version for s in live):
        time.sleep(0.2)
    run.log.write("final_version", version=version, live=[s.pid for s in live if s.pid is not None],
                  waited_s=round(time.monotonic() - began, 2))
