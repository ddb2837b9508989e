"""The faults of a chaos run, injected at random moments drawn from the run's seed.

Kinds (DESIGN, Failure handling; issue 6):
  worker_kill   SIGKILL a worker while it owns work (it never closes: the reaper must take it back)
  worker_pause  SIGSTOP a worker past worker_timeout_s, then SIGCONT it: its late settlement must be
                refused (StaleReceipt), which its log records
  trainer_kill  SIGKILL the trainer between lease and commit (waits up to 3 s for its log to say
                ``train_begin``; ``in_window`` records whether it was caught there)
  reaper_kill   SIGKILL a reaper process
  redis_kill    kill -9 Redis and restart it on the same port and AOF (with everysec: as a host crash,
                the last second of AOF writes is dropped first, see aof.py); down briefly (< worker_timeout_s)
  redis_outage  Redis down for LONGER than worker_timeout_s (``outage_factor`` x it, 1.5-3 by default),
                then restarted on the same port and data; alternately a clean stop (SIGTERM: shutdown,
                fsync) and a kill -9 (a crash, with everysec also dropping the last second of AOF).
                Time the server was down must not count against workers, leases or holds (issue 12
                item 5): no live worker may be reaped for it, no valid group dead-lettered, nothing
                acknowledged lost with AOF always. The outage runs in the background of tick(): the
                other faults (and the supervisor's restarts) go on while Redis is down.
  conn_kill     CLIENT KILL one connection of a worker, the trainer or the producer: a call in
                flight loses its reply after Redis ran it, so the client's retry must replay
  push_member_kill   SIGKILL a shipped worker while it is a member of a weights push round (open or
                sealed, not yet closed): the round ends for the others by its deadline, its retry
                reaches the live members that missed it (waits up to PUSH_AIM_S for such a round)
  push_member_pause  the same with SIGSTOP, SIGCONT after worker_timeout_s + 1-2.5 s
  partial_kill  SIGKILL a shipped worker while it owns an entry that has a progress record (a save of
                its own attempt, or the record it is continuing): the next attempt must continue
                from the last save, and the record must be dropped when the group settles (waits up
                to PARTIAL_AIM_S for such a worker)
  partial_pause the same with SIGSTOP past worker_timeout_s: the reaper requeues the entry while the
                paused worker's periodic save is due, so the save races the reaper and the next
                attempt (the receipt must fence it)
The worker faults (worker_kill, worker_pause) hit test-engine and shipped workers alike. The
``credential`` weight is not drawn here: it paces the adversary process (adversary.py; harness.py).
Every fault is written to the harness log with its wall-clock time; the checker uses them.
It owns no process itself: it signals the supervisor's slots and the LocalServer it was given.
"""

from __future__ import annotations

import random
import signal
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Mapping

import orjson
import redis

from rollout_queue.devtools.local_server import LocalServer

from rollout_queue.devtools.chaos.aof import AofTail
from rollout_queue.devtools.chaos.oplog import OpLog
from rollout_queue.devtools.chaos.supervisor import Slot, Supervisor

FAULT_KINDS = ("worker_kill", "worker_pause", "trainer_kill", "reaper_kill", "redis_kill", "redis_outage",
               "conn_kill", "push_member_kill", "push_member_pause", "partial_kill", "partial_pause", "credential")
#: Kinds that need a role of the run: the push faults a pusher, credential the adversary (its pace).
PUSH_KINDS = ("push_member_kill", "push_member_pause")
#: Kinds aimed at shipped workers holding progress records (partial rollouts).
PARTIAL_KINDS = ("partial_kill", "partial_pause")
DEFAULT_WEIGHTS: Mapping[str, float] = {"worker_kill": 3, "worker_pause": 2, "trainer_kill": 2,
                                        "reaper_kill": 1, "redis_kill": 1.2, "redis_outage": 0.6, "conn_kill": 3,
                                        "push_member_kill": 0.5, "push_member_pause": 0.5, "partial_kill": 1,
                                        "partial_pause": 0.5, "credential": 0}
#: Roles whose processes the worker faults hit: the test-engine workers and the shipped ones.
WORKER_ROLES = ("worker", "traj")
#: Two Redis kills at least this far apart: each restart must replay and settle before the next.
REDIS_KILL_SPACING_S = 3.0
#: A long outage starts at least this long after the last restart: the clients reconnect, the
#: queue clock resumes and its post-outage grace (OUTAGE_GRACE worker timeouts) ends first.
REDIS_OUTAGE_SPACING_S = 8.0
#: A drawn outage waits up to this long for work in flight (see Nemesis._redis_outage).
OUTAGE_AIM_S = 5.0
#: A drawn push-member fault waits up to this long for a round with a shipped worker as a member.
PUSH_AIM_S = 15.0
#: A drawn partial fault waits up to this long for a shipped worker owning an entry with a record.
PARTIAL_AIM_S = 15.0


@dataclass
class NemesisConfig:
    interval_s: float = 1.0                   # mean time between faults (exponential)
    weights: Mapping[str, float] = field(default_factory=lambda: dict(DEFAULT_WEIGHTS))
    worker_timeout_s: float = 2.0
    loss_window_s: float | None = None         # everysec: the simulated host crash drops this much
    redis_down_s: tuple[float, float] = (0.2, 1.5)
    outage_factor: tuple[float, float] = (1.5, 3.0)  # redis_outage: down this many x worker_timeout_s
    cover_all: bool = True                     # begin with one fault of every kind (in seeded order)


def _member_pid(worker_id: object) -> int | None:
    """The pid in a shipped worker's id (``chaos-t<i>:<pid>:<nonce>``), or None for any other member."""
    text = worker_id.decode(errors="replace") if isinstance(worker_id, bytes) else str(worker_id)
    parts = text.split(":")
    return int(parts[1]) if len(parts) == 3 and parts[0].startswith("chaos-t") and parts[1].isdigit() else None


def _last_op(slot: Slot) -> str | None:
    """The op of the last complete line of a slot's log (reads only the file's tail)."""
    if slot.log_path is None:
        return None
    try:
        with open(slot.log_path, "rb") as fh:
            fh.seek(0, 2)
            fh.seek(max(0, fh.tell() - 4096))
            lines = fh.read().split(b"\n")
    except FileNotFoundError:
        return None
    full = [x for x in lines[:-1] if x.startswith(b"{")]  # the part after the last newline may be torn
    return orjson.loads(full[-1]).get("op") if full else None


class Nemesis:
    def __init__(self, sup: Supervisor, server: LocalServer, log: OpLog, rng: random.Random,
                 cfg: NemesisConfig, aof: AofTail | None = None, push_keys: tuple[str, str] = ("", ""),
                 partial_keys: tuple[str, str] = ("", "")) -> None:
        self.sup, self.server, self.log, self.rng, self.cfg, self.aof = sup, server, log, rng, cfg, aof
        self.push_keys = push_keys  # the queue's push and push:members keys (read raw, never written)
        self.counts: Counter[str] = Counter()
        self.skipped: Counter[str] = Counter()
        self.next_at = time.monotonic() + rng.expovariate(1 / cfg.interval_s)
        self.conts: list[tuple[float, Slot]] = []
        self.trainer_kill_until: float | None = None
        self.last_redis_kill = -1e9
        self.outage: tuple[float, float, float, str] | None = None  # (restart at, down since, planned, how)
        self.outage_aim_until: float | None = None  # a drawn outage waits (up to then) for work in flight
        self.outage_kinds = ["stop", "kill"]
        rng.shuffle(self.outage_kinds)  # which the first outage is comes from the seed; then they alternate
        self.outages: list[dict[str, object]] = []  # every finished outage: how, planned and real length
        self.push_aim: tuple[str, float] | None = None  # (kind, until): a push-member fault waiting for a round
        self.partial_keys = partial_keys  # the queue's partial:head and source stream keys (read raw)
        self.partial_aim: tuple[str, float] | None = None  # (kind, until): a partial fault waiting for a target
        self.partial_polled = 0.0
        self.push_polled = 0.0
        self.admin = redis.Redis.from_url(server.url, socket_timeout=1.0, socket_connect_timeout=1.0)
        self.cover = [k for k in FAULT_KINDS if cfg.cover_all and cfg.weights.get(k, 0) > 0]
        self.first_round = list(self.cover)
        rng.shuffle(self.first_round)

    def tick(self, active: bool) -> None:
        now = time.monotonic()
        if self.outage is not None and now >= self.outage[0]:
            self._end_outage()
        for due in [c for c in self.conts if c[0] <= now]:
            self.conts.remove(due)
            self.sup.signal(due[1], signal.SIGCONT, "worker_pause_end")
        if self.trainer_kill_until is not None:
            self._try_trainer_kill(now)
        if self.outage_aim_until is not None:
            self._try_outage(now)
        if self.push_aim is not None and now - self.push_polled >= 0.05:
            self.push_polled = now
            self._try_push_member(now)
        if self.partial_aim is not None and now - self.partial_polled >= 0.05:
            self.partial_polled = now
            self._try_partial(now)
        if active and now >= self.next_at:
            kind = self._next_kind()
            landed = getattr(self, f"_{kind}")(now)
            if landed is True:
                self.counts[kind] += 1
            elif landed is False:
                self._skip(kind)
            self.next_at = now + self.rng.expovariate(1 / self.cfg.interval_s)

    def _skip(self, kind: str) -> None:
        """A fault that could not be injected (no target now, or none came in its aim's time): counted
        skipped, and retried by the cover round after the others while it never landed."""
        self.skipped[kind] += 1
        if kind in self.cover and not self.counts[kind]:
            self.first_round.insert(0, kind)

    def _land(self, slot: Slot, kind: str, now: float, **extra: object) -> None:
        """An aimed fault lands on ``slot``: SIGKILL for a ``*_kill`` kind, else a pause past
        worker_timeout_s; counted when the signal was sent."""
        landed = (self.sup.signal(slot, signal.SIGKILL, kind, **extra) if kind.endswith("_kill")
                  else self._pause(slot, now, kind, **extra))
        if landed:
            self.counts[kind] += 1

    def _next_kind(self) -> str:
        """With ``cover_all``, a seeded round of every kind comes first; then draws by weight."""
        if self.first_round:
            return self.first_round.pop()
        kinds = list(self.cfg.weights)
        return self.rng.choices(kinds, [self.cfg.weights[k] for k in kinds])[0]

    @property
    def redis_down(self) -> bool:
        return self.outage is not None

    def release_all(self) -> None:
        """End an outage and SIGCONT every paused worker now (the run is ending: the roles close
        through Redis, so it must be up)."""
        if self.outage is not None:
            self._end_outage()
        for _, slot in self.conts:
            self.sup.signal(slot, signal.SIGCONT, "worker_pause_end")
        self.conts.clear()

    # -- the faults: each returns True when it was injected --------------------------------------

    def _pick(self, *roles: str) -> Slot | None:
        slots = self.sup.running(*roles)
        return self.rng.choice(slots) if slots else None

    def _worker_kill(self, now: float) -> bool:
        slot = self._pick(*WORKER_ROLES)
        return slot is not None and self.sup.signal(slot, signal.SIGKILL, "worker_kill")

    def _reaper_kill(self, now: float) -> bool:
        slot = self._pick("reaper")
        return slot is not None and self.sup.signal(slot, signal.SIGKILL, "reaper_kill")

    def _worker_pause(self, now: float) -> bool:
        slot = self._pick(*WORKER_ROLES)
        return slot is not None and self._pause(slot, now, "worker_pause")

    def _pause(self, slot: Slot, now: float, kind: str, **extra: object) -> bool:
        pause = self.cfg.worker_timeout_s + self.rng.uniform(1.0, 2.5)
        if not self.sup.signal(slot, signal.SIGSTOP, kind, pause_s=round(pause, 3), **extra):
            return False
        self.conts.append((now + pause, slot))
        return True

    def _push_member_kill(self, now: float) -> bool | None:
        return self._aim_push("push_member_kill", now)

    def _push_member_pause(self, now: float) -> bool | None:
        return self._aim_push("push_member_pause", now)

    def _aim_push(self, kind: str, now: float) -> bool | None:
        if self.push_aim is not None or not self.sup.running("traj"):
            return False
        self.push_aim = (kind, now + PUSH_AIM_S)
        return None  # counted when it lands (see _try_push_member)

    def _try_push_member(self, now: float) -> None:
        """The aimed push-member fault, once a round still in progress has a running shipped worker
        as a member (the member's pid is in its worker id: shipped.worker_id)."""
        assert self.push_aim is not None
        kind, until = self.push_aim
        try:
            state, epoch = self.admin.hmget(self.push_keys[0], "state", "epoch")
            members = self.admin.hkeys(self.push_keys[1]) if state in (b"open", b"sealed") else []
        except redis.RedisError:
            members = []
        by_pid = {s.pid: s for s in self.sup.running("traj")}
        targets = [by_pid[pid] for pid in (_member_pid(m) for m in members) if pid in by_pid]
        if not targets:
            if now > until:
                self.push_aim = None
                self._skip(kind)
            return
        self.push_aim = None
        self._land(self.rng.choice(targets), kind, now, epoch=int(epoch or 0))

    def _partial_kill(self, now: float) -> bool | None:
        return self._aim_partial("partial_kill", now)

    def _partial_pause(self, now: float) -> bool | None:
        return self._aim_partial("partial_pause", now)

    def _aim_partial(self, kind: str, now: float) -> bool | None:
        if self.partial_aim is not None or not self.sup.running("traj"):
            return False
        self.partial_aim = (kind, now + PARTIAL_AIM_S)
        return None  # counted when it lands (see _try_partial)

    def _partial_owners(self) -> dict[int, str]:
        """pid -> an entry with a progress record that the shipped worker of that pid owns now."""
        head_key, src = self.partial_keys
        out: dict[int, str] = {}
        try:
            for entry in self.admin.hkeys(head_key)[:32]:
                eid = entry.decode() if isinstance(entry, bytes) else str(entry)
                pending = self.admin.xpending_range(src, "rollout", eid, eid, 1)
                pid = _member_pid(pending[0]["consumer"]) if pending else None
                if pid is not None:
                    out[pid] = eid
        except redis.RedisError:
            return {}
        return out

    def _try_partial(self, now: float) -> None:
        """The aimed partial fault, once a running shipped worker owns an entry with a progress record."""
        assert self.partial_aim is not None
        kind, until = self.partial_aim
        owners = self._partial_owners()
        targets = [(s, owners[s.pid]) for s in self.sup.running("traj") if s.pid in owners]
        if not targets:
            if now > until:
                self.partial_aim = None
                self._skip(kind)
            return
        self.partial_aim = None
        slot, eid = self.rng.choice(targets)
        self._land(slot, kind, now, entry=eid)

    def _trainer_kill(self, now: float) -> bool | None:
        if self.trainer_kill_until is not None or not self.sup.running("trainer"):
            return False
        self.trainer_kill_until = now + 3.0
        return None  # counted when it lands (see _try_trainer_kill)

    def _try_trainer_kill(self, now: float) -> None:
        slot = self._pick("trainer")
        if slot is None:
            if self.trainer_kill_until is not None and now > self.trainer_kill_until:
                self.trainer_kill_until = None  # no trainer ran in time: not injected
                self._skip("trainer_kill")
            return
        in_window = _last_op(slot) == "train_begin"
        if in_window or now > (self.trainer_kill_until or 0):
            if self.sup.signal(slot, signal.SIGKILL, "trainer_kill", in_window=in_window):
                self.counts["trainer_kill"] += 1
                self.counts["trainer_kill_between_lease_and_commit"] += in_window
            self.trainer_kill_until = None

    def _redis_kill(self, now: float) -> bool:
        if (self.outage is not None or self.outage_aim_until is not None
                or now - self.last_redis_kill < REDIS_KILL_SPACING_S):
            return False
        self.last_redis_kill = now
        kill_t = time.time()
        self.server.kill()
        crash = self.aof.crash(kill_t, self.cfg.loss_window_s) if self.aof and self.cfg.loss_window_s else None
        down = self.rng.uniform(*self.cfg.redis_down_s)
        self.log.write("redis_kill", kill_t=kill_t, down_s=round(down, 3),
                       loss_from=crash.loss_from if crash else None,
                       dropped_bytes=crash.dropped_bytes if crash else 0,
                       not_cut=self.aof.refusal if self.aof and crash is None else None)
        time.sleep(down)  # Redis is down: every client is retrying
        self.server.restart()
        if self.aof:
            self.aof.reset()
        self.log.write("redis_restart", pid=self.server.pid)
        return True

    def _redis_outage(self, now: float) -> bool | None:
        """Take Redis down for 1.5-3 x worker_timeout_s; tick() restarts it when that time is up.
        Alternates a clean stop and a kill -9 (the seed picks the first), so every run with two
        outages has one of each. It is
        aimed (up to OUTAGE_AIM_S) at a moment when work is in flight: a trainer between lease and
        commit and a worker between reserve and settlement, so the outage spans a lease and a receipt
        (downtime counted against either is then seen by the checker)."""
        if (self.outage is not None or self.outage_aim_until is not None
                or now - self.last_redis_kill < REDIS_OUTAGE_SPACING_S):
            return False
        self.outage_aim_until = now + OUTAGE_AIM_S
        return None  # counted when it lands (see _try_outage)

    def _try_outage(self, now: float) -> None:
        trainer = any(_last_op(s) == "train_begin" for s in self.sup.running("trainer"))
        worker = any(_last_op(s) in ("reserve_ok", "complete_invoke", "fail_invoke", "complete_ok", "fail_ok")
                     for s in self.sup.running("worker"))
        if not ((trainer and worker) or now > (self.outage_aim_until or 0)):
            return
        self.outage_aim_until = None
        self.counts["redis_outage"] += 1
        self.counts["redis_outage_in_flight"] += int(trainer and worker)
        self._start_outage()

    def _start_outage(self) -> None:
        how = self.outage_kinds[(self.counts["redis_outage"] - 1) % 2]
        down = self.cfg.worker_timeout_s * self.rng.uniform(*self.cfg.outage_factor)
        kill_t = time.time()
        if how == "stop":
            self.server.stop()  # SIGTERM: Redis finishes the command it runs, fsyncs the AOF, exits
            crash = None
        else:
            self.server.kill()
            crash = self.aof.crash(kill_t, self.cfg.loss_window_s) if self.aof and self.cfg.loss_window_s else None
        self.log.write("redis_outage", how=how, kill_t=kill_t, down_s=round(down, 3),
                       worker_timeout_s=self.cfg.worker_timeout_s, loss_from=crash.loss_from if crash else None,
                       dropped_bytes=crash.dropped_bytes if crash else 0)
        self.outage = (time.monotonic() + down, time.monotonic(), down, how)
        self.counts[f"redis_outage_{how}"] += 1

    def _end_outage(self) -> None:
        assert self.outage is not None
        _, since, planned, how = self.outage
        self.server.restart()
        if self.aof:
            self.aof.reset()
        self.last_redis_kill = time.monotonic()
        real = self.last_redis_kill - since
        self.outages.append({"how": how, "planned_s": round(planned, 2), "down_s": round(real, 2)})
        self.log.write("redis_restart", pid=self.server.pid, outage=how, down_s=round(real, 3))
        self.outage = None

    def _conn_kill(self, now: float) -> bool:
        try:
            clients = [c for c in self.admin.client_list() if str(c.get("name", "")).endswith("|work")]
            if not clients:
                return False
            busy = [c for c in clients if c.get("cmd") in ("evalsha", "xread")]
            target = self.rng.choice(busy or clients)
            killed = self.admin.client_kill_filter(_id=target["id"])
        except redis.RedisError as exc:  # Redis is restarting: this fault is skipped, not injected
            self.log.write("conn_kill_skipped", error=type(exc).__name__)
            return False
        self.log.write("conn_kill", target=target.get("name"), cmd=target.get("cmd"), killed=killed)
        return bool(killed)
