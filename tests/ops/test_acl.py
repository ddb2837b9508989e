"""Role-based access: `rollout-queue acl` users on a live server. Each role does its job, and is
refused what it must not do; and the limit the docs admit (a role may send its scripts' commands
directly) is shown to be real, so the docs stay honest."""

from __future__ import annotations

import hashlib
import json
import re
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis

from rollout_queue import LeaseLost, Receipt, RolloutQueue, ScriptError, SourceGroup, StaleReceipt
from rollout_queue.ops import acl
from rollout_queue.core import flows
from rollout_queue.devtools.local_server import LocalServer
from rollout_queue.core.keys import QueueKeys
from rollout_queue.core.scripts import SCRIPTS
from tests.ops.conftest import CONFIG, Cli, samples

ROLES = acl.ROLE_NAMES
Urls = dict[str, str]


@pytest.fixture
def urls(server: LocalServer, queue_name: str, cli: Cli, r: redis.Redis) -> Iterator[Urls]:
    """The queue, created by the server's own admin, and one ACL user per role applied with the CLI."""
    RolloutQueue.from_url(server.url, queue_name, CONFIG).close()
    args = [x for role in ROLES for x in ("--password", f"{role}=pw-{role}")]
    assert cli(server.url, queue_name, "acl", "--apply", *args)[0] == 2  # --apply overwrites users: --yes
    code, out, _ = cli(server.url, queue_name, "acl", "--apply", "--yes", *args)
    assert code == 0 and out.count("applied\t") == len(ROLES)
    host = server.url.split("//")[1].split("/")[0]
    yield {role: f"redis://{acl.user_name(queue_name, role)}:pw-{role}@{host}/0" for role in ROLES}
    for role in ROLES:
        r.execute_command("ACL", "DELUSER", acl.user_name(queue_name, role))


def denied(call: Callable[[], Any]) -> None:
    """The call is refused by ACL (NOPERM), whether a script call or a plain command."""
    with pytest.raises((ScriptError, redis.exceptions.NoPermissionError, redis.exceptions.ResponseError)) as info:
        call()
    assert "NOPERM" in str(info.value) or "no permissions" in str(info.value).lower(), info.value


def dump(r: redis.Redis, queue: str) -> dict[bytes, Any]:
    return {k: r.dump(k) for k in r.scan_iter(f"rollout:{{{queue}}}:*") if not k.endswith(b":clock")}


def test_acl_prints_rules_for_every_role_in_three_formats(cli: Cli) -> None:
    code, out, _ = cli(None, "demo", "acl", "--password", "worker=s3cret")
    lines = [x for x in out.splitlines() if not x.startswith("#")]
    assert code == 0 and [x.split()[2] for x in lines] == [acl.user_name("demo", r) for r in ROLES]
    worker = lines[ROLES.index("worker")]
    assert "#" + hashlib.sha256(b"s3cret").hexdigest() in worker and "s3cret" not in worker
    assert f"+evalsha|{SCRIPTS['reserve'].sha}" in worker and f"evalsha|{SCRIPTS['commit'].sha}" not in worker
    assert "~rollout:{demo}:commits" not in worker and "~rollout:{demo}:src" in worker
    trainer = lines[ROLES.index("trainer")]
    assert "(+mget %R~rollout:{demo}:payload:*)" in trainer, "a trainer reads its leased payloads"
    # A worker stages a completion's payload with MULTI / SET / EXEC around its complete call; SET (and
    # DEL) are granted by a selector on the payload keys alone, never with the role's other keys.
    root = [x for x in acl.role_rules("demo", "worker").rules if not x.startswith("(")]
    assert {"+multi", "+exec"} <= set(root) and "+set" not in root and "+del" not in root
    assert "(+del +set ~rollout:{demo}:payload:*)" in worker
    operator = lines[ROLES.index("operator")].split()
    assert {"+strlen", "+mget"} <= set(operator), "inspect reads a completed group's payload size"
    assert not any(":results" in line for line in lines), "the results hash is gone"
    assert f"script library {acl.LIBRARY_VERSION}" in out
    code, out, _ = cli(None, "demo", "acl", "--format", "aclfile", "--role", "operator")
    assert code == 0 and [x for x in out.splitlines() if not x.startswith("#")][0].startswith("user rq-demo-operator on")
    code, out, _ = cli(None, "demo", "acl", "--format", "shell", "--role", "admin")
    assert code == 0 and "redis-cli ACL SETUSER rq-demo-admin on" in out and "'~rollout:{demo}:*'" in out
    assert cli(None, "demo", "acl", "--password", "nobody=x")[0] == 2


def test_every_command_a_script_calls_is_known_to_the_rule_builder() -> None:
    """A new command in a script must reach the roles' rules (else the script dies mid-way on NOPERM)."""
    for script in SCRIPTS.values():
        called = set(re.findall(r"redis\.p?call\(\s*'([A-Z]+)'", script.source))
        assert called <= acl.KNOWN_COMMANDS, (script.name, called - acl.KNOWN_COMMANDS)
        assert {c.lower() for c in called if c not in acl.CONTAINERS} <= acl.script_commands(script)


def test_each_role_does_its_job(urls: Urls, queue_name: str, cli: Cli) -> None:
    producer = RolloutQueue.from_url(urls["producer"], queue_name)
    ids = producer.submit([SourceGroup(f"s-{i}", f"prompt {i}", 2) for i in range(4)])
    trainer = RolloutQueue.from_url(urls["trainer"], queue_name)
    assert trainer.publish_version(1)
    wq = RolloutQueue.from_url(urls["worker"], queue_name)
    pubsub = wq.client.pubsub()
    pubsub.subscribe(wq.keys.versions_channel)  # workers learn new versions by pub/sub
    w = wq.worker("gpu-0")
    got = w.reserve(3, block_ms=100)
    assert w.heartbeat().version == 1
    w.complete(got[0].receipt, samples(2, 1))
    w.fail(got[1].receipt, "engine crashed")
    with trainer.hold(timeout_s=5) as hold:
        assert not hold.wait_terminal(0.05)  # got[2] still executes
    lease = trainer.lease(1, block_ms=100)
    assert lease is not None and lease.groups[0].entry_id == ids[0]
    # The payloads come with a plain MGET of their payload keys after the lease script (P2): allowed, and decoded.
    assert [s.token_ids for s in lease.groups[0].samples] == [s.token_ids for s in samples(2, 1)]
    assert lease.groups[0].columns().token_ids.tolist() == [1, 2, 3, 1, 2, 3]
    lease.commit(step=1)
    assert trainer.checkpoint(1) == 1
    reaper = RolloutQueue.from_url(urls["reaper"], queue_name)
    assert reaper.reap().total == 0
    # With a short retention the reaper prunes the settled group's ledger line (prune.lua, reaper role).
    code, _, err = cli(urls["admin"], queue_name, "config", "set", "settled_retention_s=0.001", "--yes")
    assert code == 0, err
    time.sleep(0.05)
    assert reaper.reap().pruned == 1
    # A completed group for the operator to inspect: its size is read with STRLEN of its payload key.
    w2 = wq.worker("gpu-1")
    (extra,) = w2.reserve(1, block_ms=100)
    w2.complete(extra.receipt, samples(extra.group.n, 1))
    code, out, err = cli(urls["operator"], queue_name, "inspect", extra.entry_id)
    size = len(redis.Redis.from_url(urls["admin"]).get(wq.keys.payload(extra.entry_id, extra.receipt.attempt)))
    assert code == 0 and f"{size} bytes" in out, (out, err)
    for args in (["stats", "--json"], ["inspect", ids[1]], ["workers"], ["leases"], ["dlq", "list"],
                 ["config", "show"], ["drain", "status"], ["metrics", "--once"], ["top", "--once"],
                 ["stragglers"], ["at-risk"]):
        code, out, err = cli(urls["operator"], queue_name, *args)
        assert code == 0, (args, err)
    assert json.loads(cli(urls["operator"], queue_name, "stats", "--json")[1])["committed"] == 1
    for args in (["requeue", got[2].entry_id, "--yes", "--force"], ["drain", "--yes"], ["drain", "stop", "--yes"],
                 ["config", "set", "max_attempts=3", "--yes"], ["dlq", "purge", "--all", "--yes"]):
        code, out, err = cli(urls["admin"], queue_name, *args)
        assert code == 0, (args, err)
    w.close()
    w2.close()
    for q in (producer, trainer, wq, reaper):
        q.close()


def test_roles_are_refused_what_they_must_not_do(urls: Urls, queue_name: str, r: redis.Redis, cli: Cli) -> None:
    trainer = RolloutQueue.from_url(urls["trainer"], queue_name)
    RolloutQueue.from_url(urls["producer"], queue_name).submit([SourceGroup("s-0", "p", 2)])
    wq = RolloutQueue.from_url(urls["worker"], queue_name)
    (res,) = wq.worker("gpu-0").reserve(1)
    wq.worker("gpu-0").complete(res.receipt, samples(2, 0))
    lease = trainer.lease(1)
    assert lease is not None
    keys, other = wq.keys, "rollout:{someone-else}:meta"
    before = dump(r, queue_name)
    # A worker cannot commit a lease, even holding its id and token: the script is not on its list,
    # and the commits stream is not among its keys at all.
    denied(lambda: wq.run(flows.commit(keys, lease.lease_id, lease.token, None)))
    denied(lambda: wq.client.xadd(keys["commits"], {"lease": lease.lease_id}))
    denied(lambda: wq.run(flows.submit(keys, [SourceGroup("s-9", "p", 1)], 1 << 20)))
    denied(lambda: wq.lease(1))
    assert dump(r, queue_name) == before, "a refused call wrote something"
    assert lease.commit()  # the trainer still can
    producer = RolloutQueue.from_url(urls["producer"], queue_name)
    denied(lambda: producer.worker("p").reserve(1))
    denied(lambda: producer.lease(1))
    denied(lambda: trainer.worker("t").reserve(1))
    denied(lambda: trainer.submit([SourceGroup("s-8", "p", 1)]))
    reaper = RolloutQueue.from_url(urls["reaper"], queue_name)
    denied(lambda: reaper.submit([SourceGroup("s-7", "p", 1)]))
    denied(lambda: reaper.worker("r").reserve(1))
    # The read-only operator writes nothing, in or out of a script, and cannot even open (create) a queue.
    op = redis.Redis.from_url(urls["operator"])
    denied(lambda: op.hset(keys["meta"], "max_attempts", 99))
    denied(lambda: op.delete(keys["src"]))
    denied(lambda: op.xack(keys["src"], "rollout", res.entry_id))
    denied(lambda: op.evalsha(SCRIPTS["reserve"].sha, 0))
    denied(lambda: RolloutQueue.from_url(urls["operator"], queue_name))
    for args in (["requeue", res.entry_id, "--yes"], ["drain", "--yes"], ["config", "set", "max_attempts=3", "--yes"]):
        code, _, err = cli(urls["operator"], queue_name, *args)
        assert code == 6 and "permission denied" in err, args
    assert cli(urls["operator"], "no-such-queue", "stats")[0] == 6  # another queue: not its keys
    assert r.exists("rollout:{no-such-queue}:meta") == 0
    # Every role, admin included, is confined to its queue's keys and to non-server-wide commands.
    for role in ROLES:
        c = redis.Redis.from_url(urls[role])
        denied(lambda: c.hgetall(other))
        denied(lambda: c.flushall())
        denied(lambda: c.config_set("maxmemory", "1"))
    admin = redis.Redis.from_url(urls["admin"])
    denied(lambda: admin.execute_command("ACL", "SETUSER", "intruder", "on"))
    denied(lambda: admin.script_flush())
    assert dump(r, queue_name) != before  # the commit above, and nothing refused, changed the queue


def test_only_the_trainer_derives_admission_control(urls: Urls, queue_name: str, r: redis.Redis) -> None:
    """Issue 30: the trainer's credential sizes the admission control its queue's config left to it
    (derive_admission: it can only turn an unset bound into a number); no other role may."""
    before = dump(r, queue_name)
    for role in ("producer", "worker", "reaper"):
        q = RolloutQueue.from_url(urls[role], queue_name)
        denied(lambda: q.derive_admission(4))
    assert dump(r, queue_name) == before, "a refused call wrote something"
    trainer = RolloutQueue.from_url(urls["trainer"], queue_name)
    assert trainer.derive_admission(4) == 4 and trainer.stats().admission_batch == 4


def test_the_documented_limit_is_real(urls: Urls, queue_name: str) -> None:
    """What OPERATIONS.md says ACLs cannot prevent: a credential may send, directly, the commands its
    own scripts use on the keys they use them on (no "only inside this script" permission exists). For
    the worker that is no longer XACK or XDEL (issue 29 item 7: its scripts park what they settle), but
    XCLAIM in the source stream still is. SCRIPT LOAD of new code is allowed, but EVALSHA of it is
    refused: only allow-listed SHA1s run."""
    RolloutQueue.from_url(urls["producer"], queue_name).submit([SourceGroup("s-0", "p", 2)])
    wq = RolloutQueue.from_url(urls["worker"], queue_name)
    (res,) = wq.worker("gpu-0").reserve(1)
    denied(lambda: wq.client.xack(wq.keys["src"], "rollout", res.entry_id))
    denied(lambda: wq.client.xdel(wq.keys["src"], res.entry_id))
    denied(lambda: wq.client.xadd(wq.keys["dlq"], {"entry_id": res.entry_id}))
    denied(lambda: wq.client.delete(wq.keys["src"]))
    # XCLAIM stays (its scripts park with it): it bypasses every script's checks, and the receipt is gone.
    assert wq.client.xclaim(wq.keys["src"], "rollout", "@dead", 0, [res.entry_id], justid=True) == [
        res.entry_id.encode()]
    sha = wq.client.script_load("return redis.call('DEL', KEYS[1])")
    denied(lambda: wq.client.evalsha(sha, 1, wq.keys["src"]))
    with pytest.raises(StaleReceipt):  # the PEL no longer gives the attempt to gpu-0: waste, not loss
        wq.worker("gpu-0").complete(Receipt(res.entry_id, 1, "gpu-0"), samples(2, 0))
    # Claimed to a parking consumer without a record is no settlement: the reaper requeues the group.
    reaper = RolloutQueue.from_url(urls["reaper"], queue_name)
    assert reaper.reap().settled == 1
    (again,) = wq.worker("gpu-1").reserve(1)
    assert again.entry_id == res.entry_id
    # It stages completions with a plain SET, so it may write any payload key of its queue directly
    # (not another queue's: every key pattern names this queue), and no other key: the SET selector
    # names the payload keys alone, so meta or the stream cannot be turned into a string.
    assert wq.client.set(wq.keys.payload(res.entry_id, 9), b"forged")
    denied(lambda: wq.client.set(QueueKeys("someone-else").payload(res.entry_id, 9), b"forged"))
    denied(lambda: wq.client.set(wq.keys["meta"], b"forged"))
    denied(lambda: wq.client.set(wq.keys["src"], b"forged"))


def test_each_role_is_refused_the_direct_commands_issue_12_found(urls: Urls, queue_name: str, r: redis.Redis) -> None:
    """Issue 12 item 10: a worker credential could XGROUP DELCONSUMER a lease's consumer (destroying a
    leased group) and HSET a lease record's token; the operator could SCAN other queues' keys and SCRIPT
    LOAD; the producer could HSET the queue's version. Each is refused now, and changes nothing."""
    trainer = RolloutQueue.from_url(urls["trainer"], queue_name)
    RolloutQueue.from_url(urls["producer"], queue_name).submit([SourceGroup("s-0", "p", 2)])
    wq = RolloutQueue.from_url(urls["worker"], queue_name)
    (res,) = wq.worker("gpu-0").reserve(1)
    wq.worker("gpu-0").complete(res.receipt, samples(2, 0))
    lease = trainer.lease(1)
    assert lease is not None
    keys = wq.keys
    before = dump(r, queue_name)
    worker = redis.Redis.from_url(urls["worker"])
    denied(lambda: worker.execute_command("XGROUP", "DELCONSUMER", keys["src"], "rollout", f"@lease:{lease.lease_id}"))
    denied(lambda: worker.execute_command("XGROUP", "DELCONSUMER", keys["src"], "rollout", "gpu-0"))
    denied(lambda: worker.hset(keys.lease(lease.lease_id), "token", "forged"))
    denied(lambda: worker.hgetall(keys.lease(lease.lease_id)))
    producer = redis.Redis.from_url(urls["producer"])
    denied(lambda: producer.hset(keys["meta"], "version", 99))
    denied(lambda: producer.hset(keys["meta"], "max_attempts", 99))
    denied(lambda: producer.hincrby(keys["meta"], "committed", 1))
    assert producer.hget(keys["meta"], "max_attempts") is not None  # it still reads the config
    operator = redis.Redis.from_url(urls["operator"])
    denied(lambda: operator.scan(0, match="*"))
    denied(lambda: operator.script_load("return 1"))
    denied(lambda: operator.execute_command("WAIT", 0, 0))
    reaper = redis.Redis.from_url(urls["reaper"])
    denied(lambda: reaper.evalsha(SCRIPTS["restore"].sha, 0))  # it finishes restores, never starts one
    denied(lambda: reaper.evalsha(SCRIPTS["checkpoint"].sha, 0))
    assert dump(r, queue_name) == before
    lease.commit()  # the leased group was never touched
    assert trainer.stats().committed == 1
    for c in (worker, producer, operator, reaper):
        c.close()


def test_the_operator_reads_after_a_restart_once_another_role_loaded_its_scripts(
        fresh_server: LocalServer, cli: Cli) -> None:
    """The operator may not SCRIPT LOAD: after a restart its first stats says why, and the first other
    client back (here a worker's heartbeat) loads the read-only scripts for it (transport._companions)."""
    name = "acl-restart"
    RolloutQueue.from_url(fresh_server.url, name, CONFIG).close()
    args = [x for role in ROLES for x in ("--password", f"{role}=pw-{role}")]
    assert cli(fresh_server.url, name, "acl", "--apply", "--yes", *args)[0] == 0
    host = fresh_server.url.split("//")[1].split("/")[0]
    url = {role: f"redis://{acl.user_name(name, role)}:pw-{role}@{host}/0" for role in ROLES}
    trainer = RolloutQueue.from_url(url["trainer"], name)
    admin = redis.Redis.from_url(fresh_server.url)
    admin.script_flush()  # what a restart does to the script cache (ACL users stay: no aclfile here)
    code, _, err = cli(url["operator"], name, "stats")
    assert code != 0 and "may not load it" in err, err
    RolloutQueue.from_url(url["worker"], name).worker("w").heartbeat()  # reloads its script + companions
    code, out, err = cli(url["operator"], name, "stats")
    assert code == 0, err
    trainer.close()
    admin.close()


def test_a_trainer_credential_checkpoints_after_the_reaper_takes_back_a_dead_lease(urls: Urls, queue_name: str) -> None:
    """TrainingStream.checkpoint reaps a dead incarnation's expired lease where it may; with the trainer
    role it may not (NOPERM), so it waits for the reaper process instead of failing."""
    import threading

    from rollout_queue.integrations.stream import TrainingStream

    admin = RolloutQueue.from_url(urls["admin"], queue_name)
    admin.submit([SourceGroup("s1", "p", 2)])
    worker = admin.worker("w")
    (r,) = worker.reserve(max_groups=1, block_ms=1000)
    worker.complete(r.receipt, samples(r.group.n, r.version))
    assert admin.lease(groups=1, timeout_s=1.0) is not None  # held by a trainer that died
    trainer = RolloutQueue.from_url(urls["trainer"], queue_name)
    denied(trainer.reap)
    reaper = RolloutQueue.from_url(urls["reaper"], queue_name)
    timer = threading.Timer(2.0, reaper.reap)
    timer.start()
    try:
        TrainingStream(trainer).checkpoint(1, wait_s=20)
    finally:
        timer.join()
    assert admin.stats().leased == 0


def test_rotation_revokes_the_old_password_and_reapplying_keeps_logins(server: LocalServer, queue_name: str,
                                                                       r: redis.Redis, cli: Cli) -> None:
    """Issue 29 item 20: `acl --apply` with a new password must lock out the old one (ACL SETUSER adds
    passwords: resetpass first), re-applying without one (the upgrade flow) keeps the passwords a
    user has, and re-applying never stacks selectors."""
    RolloutQueue.from_url(server.url, queue_name, CONFIG).close()
    host = server.url.split("//")[1].split("/")[0]
    user = acl.user_name(queue_name, "worker")

    def login(secret: str) -> bool:
        c = redis.Redis.from_url(f"redis://{user}:{secret}@{host}/0")
        try:
            return c.ping() is True
        except redis.exceptions.AuthenticationError:
            return False
        finally:
            c.close()

    def apply(*args: str) -> None:
        code, _, err = cli(server.url, queue_name, "acl", "--apply", "--yes", "--role", "worker", *args)
        assert code == 0, err

    try:
        apply("--password", "worker=leaked")
        assert login("leaked")
        apply("--password", "worker=rotated")
        assert login("rotated") and not login("leaked"), "rotation must revoke the old password"
        apply()  # the upgrade flow: new rules, no password given
        apply()
        assert login("rotated") and not login("leaked")
        fields = r.acl_getuser(user)
        assert len(fields["passwords"]) == 1
        selectors = [x for x in acl.role_rules(queue_name, "worker").rules if x.startswith("(")]
        assert len(fields["selectors"]) == len(selectors), "re-applying stacked selectors"
        # The printed forms carry the same revocation: resetpass before the hash, only with a password.
        with_pw = acl.role_rules(queue_name, "worker", "x").rules
        assert with_pw.index("resetpass") == with_pw.index("#" + hashlib.sha256(b"x").hexdigest()) - 1
        assert "resetpass" not in acl.role_rules(queue_name, "worker").rules
        assert all("clearselectors" in acl.role_rules(queue_name, role).rules for role in ROLES)
    finally:
        r.execute_command("ACL", "DELUSER", user)


def test_the_worker_role_cannot_write_meta_nor_create_or_migrate_a_queue(urls: Urls, queue_name: str,
                                                                         r: redis.Redis) -> None:
    """Issue 29 item 7: meta (config, policy version, weights URI) is what every process trusts, so the
    worker role only reads it: the counters it moves live in their own hash. It can therefore neither
    create a queue (QueueCreateRefused, nothing written) nor migrate a layout-3 one (the trainer does)."""
    from rollout_queue.core.errors import LayoutMigrationRefused, QueueCreateRefused

    keys = QueueKeys(queue_name)
    worker = redis.Redis.from_url(urls["worker"])
    before = dump(r, queue_name)
    denied(lambda: worker.hset(keys["meta"], "version", 99))
    denied(lambda: worker.hset(keys["meta"], "weights_uri", "s3://attacker/weights"))
    denied(lambda: worker.hset(keys["meta"], "max_attempts", 1000))
    denied(lambda: worker.hincrby(keys["meta"], "committed", 1))
    denied(lambda: worker.hdel(keys["meta"], "library"))
    denied(lambda: worker.delete(keys["meta"]))
    assert dump(r, queue_name) == before
    assert worker.hget(keys["meta"], "library") is not None  # it still reads the config
    # The counters are the worker's to move (garbage there stalls admission at worst; see OPERATIONS).
    assert RolloutQueue.from_url(urls["worker"], queue_name).worker("w").heartbeat().version == 0
    # No queue: the worker credential may not create one, and writes nothing trying.
    for key in list(r.scan_iter(f"rollout:{{{queue_name}}}:*")):
        r.delete(key)
    with pytest.raises(QueueCreateRefused, match="may not create it"):
        RolloutQueue.from_url(urls["worker"], queue_name)
    assert list(r.scan_iter(f"rollout:{{{queue_name}}}:*")) == []
    # A queue of the previous layout: the worker is refused with what to do; the trainer migrates it.
    admin = RolloutQueue.from_url(urls["admin"], queue_name, CONFIG)
    admin.submit([SourceGroup("s-0", "p", 2)])
    counters = r.hgetall(keys["counters"])
    r.hset(keys["meta"], mapping={**counters, b"library": b"3.oldbuild00000"})
    r.delete(keys["counters"])
    before = dump(r, queue_name)
    with pytest.raises(LayoutMigrationRefused, match="trainer or admin"):
        RolloutQueue.from_url(urls["worker"], queue_name)
    assert dump(r, queue_name) == before
    trainer = RolloutQueue.from_url(urls["trainer"], queue_name)
    assert r.hgetall(keys["counters"]) == counters
    assert RolloutQueue.from_url(urls["worker"], queue_name).worker("w").reserve(1)
    for c in (admin, trainer):
        c.close()
    worker.close()


def test_the_worker_role_cannot_rewrite_a_push_round(urls: Urls, queue_name: str, r: redis.Redis) -> None:
    """Issue 29 item 7: the push hash (epoch, rendezvous address, deadline) is what every member
    trusts; a worker credential may only read it. Joining (push_join) writes push:members alone, so
    rounds still work under the worker role."""
    trainer = RolloutQueue.from_url(urls["trainer"], queue_name)
    wq = RolloutQueue.from_url(urls["worker"], queue_name)
    w = wq.worker("gpu-0")
    w.heartbeat()
    epoch = trainer.open_push(1, "/weights/v1", "127.0.0.1:29500", "gloo", 5, 30)
    keys, worker = wq.keys, redis.Redis.from_url(urls["worker"])
    before = dump(r, queue_name)
    denied(lambda: worker.hset(keys["push"], "addr", "attacker.example:29500"))
    denied(lambda: worker.hset(keys["push"], "epoch", epoch + 1))
    denied(lambda: worker.hset(keys["push"], "state", "open"))
    denied(lambda: worker.hdel(keys["push"], "unreached:gpu-1"))
    denied(lambda: worker.delete(keys["push"]))
    assert dump(r, queue_name) == before
    # It reads the round only inside push_join (a direct HGET is not among the worker's reads).
    denied(lambda: worker.hget(keys["push"], "addr"))
    ticket = w.join_push(epoch)
    assert ticket is not None and (ticket.rank, ticket.addr) == (1, "127.0.0.1:29500")
    seal = trainer.seal_push(epoch, expect=1)
    assert seal is not None and not isinstance(seal, tuple) and seal.world == 2
    for c in (trainer, wq):
        c.close()
    worker.close()


def test_only_the_admin_rolls_back_a_lease_by_id_and_others_are_told_so(urls: Urls, queue_name: str,
                                                                        r: redis.Redis, cli: Cli) -> None:
    """`leases rollback` (revoke_lease.lua) changes state: the read-only operator, and the trainer (which
    rolls back only the leases it holds the token of), are refused with the role that may do it."""
    admin = RolloutQueue.from_url(urls["admin"], queue_name)
    admin.submit([SourceGroup("s1", "p", 2)])
    worker = admin.worker("w")
    (res,) = worker.reserve(max_groups=1, block_ms=1000)
    worker.complete(res.receipt, samples(res.group.n, res.version))
    trainer = RolloutQueue.from_url(urls["trainer"], queue_name)
    lease = trainer.lease(1)
    assert lease is not None
    trainer.beats.stop()  # no background beat moves the lease's score while the refusals are compared
    before = dump(r, queue_name)
    for role in ("operator", "trainer", "worker"):
        code, out, err = cli(urls[role], queue_name, "leases", "rollback", lease.lease_id, "--yes")
        assert code == 6 and out == "", (role, err)
        assert "only the admin role may run" in err and "revoke_lease" in err, err
    assert dump(r, queue_name) == before, "a refused rollback wrote something"
    code, out, err = cli(urls["admin"], queue_name, "leases", "rollback", lease.lease_id, "--yes")
    assert code == 0 and out == f"{lease.lease_id}\trolled_back\t1\n", err
    with pytest.raises(LeaseLost):
        lease.commit()
    assert admin.stats().ready == 1
    for q in (admin, trainer):
        q.close()
