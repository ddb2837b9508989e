"""The shipped processes on a 3-master Redis Cluster with P = 6 partitions, each a real subprocess:
the producer (``rollout-queue produce``), two workers (``python -m rollout_queue.workers``, scripted
engine), a trainer (tests/cluster/trainer_process.py: the public API, no torch) and the reaper
(``rollout-queue reaper``). The producer and one worker are SIGKILLed mid-way; a restarted producer
and the reaper recover. Every produced group is trained exactly once: the trainer saw each
source_id once, and the partitions' commits streams (Redis's own record) name each entry once.
The chaos variant also SIGKILLs a master holding partitions mid-run and restarts it on its AOF.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import orjson

from rollout_queue import RolloutQueue
from rollout_queue.core.errors import QueueNotFound
from rollout_queue.core.flows.producer import read_cursor
from rollout_queue.devtools.local_cluster import LocalCluster
from tests.cluster.conftest import P, delete_queue, spread_name
from tests.cluster.test_composite_lease import commit_ledger
from tests.helpers import wait_until

REPO = Path(__file__).resolve().parents[2]
GROUPS = 48


def spawn(*argv: str) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.Popen([sys.executable, *argv], cwd=REPO, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def finish(proc: subprocess.Popen[str], timeout: float = 30.0) -> tuple[int, str, str]:
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
        raise AssertionError(f"{proc.args} did not exit; stderr:\n{err[-3000:]}") from None
    return proc.returncode, out, err


def clean_up(procs: list[subprocess.Popen[str]], cluster: LocalCluster, name: str) -> None:
    """Kill what a test left running and delete its queue."""
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    delete_queue(cluster, name)


def opened(url: str, name: str) -> Any:
    try:
        return RolloutQueue.from_url(url, name, partitions=P, create=False)
    except QueueNotFound:
        return None


def test_producer_workers_trainer_and_reaper_processes_train_each_group_once_on_a_cluster(
        cluster: LocalCluster, tmp_path: Path) -> None:
    run_processes(cluster, tmp_path, kill_master=False)


def test_the_processes_ride_out_a_master_crash_and_train_each_group_once(private_cluster: LocalCluster,
                                                                         tmp_path: Path) -> None:
    """Cluster chaos through the shipped processes: besides the producer and worker kills, a master
    is SIGKILLed mid-run and restarted on its AOF 1.5 s later. The partitions it serves stall and
    recover (the processes retry within their window); the others keep going; still once each."""
    run_processes(private_cluster, tmp_path, kill_master=True)


def run_processes(cluster: LocalCluster, tmp_path: Path, kill_master: bool) -> None:
    url, name = cluster.url, spread_name(cluster, P)
    dataset = tmp_path / "d.jsonl"
    dataset.write_bytes(b"".join(orjson.dumps({"question": f"what is {i} + {i}?"}) + b"\n" for i in range(GROUPS)))
    common = ["--url", url, "--queue", name, "--partitions", str(P)]
    procs: list[subprocess.Popen[str]] = []

    def start(*argv: str) -> subprocess.Popen[str]:
        procs.append(spawn(*argv))
        return procs[-1]

    def worker(worker_id: str, latency: str) -> subprocess.Popen[str]:
        return start("-m", "rollout_queue.workers", *common, "--engine", "scripted", "--worker-id", worker_id,
                     "--block-ms", "200", "--engine-arg", f"latency_s={latency}", "--max-samples", "4")

    def produce() -> subprocess.Popen[str]:
        return start("-m", "rollout_queue", *common, "produce", str(dataset), "--prompt-field", "question", "--n", "2",
                     "--batch-size", "4", "--max-backlog", "12", "--no-progress")

    try:
        trainer = start("-m", "tests.cluster.trainer_process", url, name, str(P), str(GROUPS))
        q = wait_until(lambda: opened(url, name), 30, interval=0.1, message="the trainer to create the queue")
        reaper = start("-m", "rollout_queue", *common, "reaper", "--interval", "0.3")
        # The doomed worker never finishes a sample: whatever the PEL shows it holding is still executing
        # when it is killed (with a short latency it could complete between the look and the kill, and
        # nothing would be lost for the reaper to bring back).
        doomed, steady = worker("w-doomed", "60"), worker("w-steady", "0.02")
        first = produce()
        wait_until(lambda: q.stats().submitted >= 12, 30, interval=0.05, message="the producer to get going")
        first.send_signal(signal.SIGKILL)  # mid-run: the restarted producer resumes from its partition cursors
        first.communicate()
        # Restarted before the doomed worker must hold work: on a loaded machine the steady worker can
        # drain the first producer's 12 groups before the doomed one has started.
        second = produce()
        wait_until(lambda: q.worker("w-doomed").owned(), 60, interval=0.05,  # read-only: the PELs
                   message="the doomed worker to hold work")
        doomed.send_signal(signal.SIGKILL)  # the reaper requeues its work after worker_timeout_s
        doomed.communicate()
        if kill_master:
            wait_until(lambda: q.stats().committed >= 4, 30, interval=0.05, message="training to start")
            # a master the URL does not name: a process that (re)connects meanwhile finds the cluster
            # through the URL's node (a start while that node is down is exit 3, tested beside)
            victim = next(v for v in (cluster.node_of(k["meta"]) for k in q.layout.keys) if v != 0)
            cluster.kill(victim)
            time.sleep(1.5)
            cluster.restart(victim)
        code, _, err = finish(second, 60)
        assert code == 0, err
        code, out, err = finish(trainer, 60)
        assert code == 0, err
        for proc in (steady, reaper):
            proc.send_signal(signal.SIGTERM)
            code, _, err = finish(proc)
            assert code == 0, err
        trained = Counter(line for line in out.splitlines() if line and line != "ready")
        assert set(trained) == {f"d.jsonl:0:{i}" for i in range(GROUPS)} and set(trained.values()) == {1}
        ledger = commit_ledger(q)
        assert len(ledger) == GROUPS and set(ledger.values()) == {1}  # each entry in one commits line, once
        st = q.stats()
        assert (st.submitted, st.committed, st.dead, st.executing_groups) == (GROUPS, GROUPS, 0, 0)
        assert st.terminals["lost"] >= 1  # the killed worker's attempts came back through the reaper
        cursors = [q.run(read_cursor(keys, "d.jsonl"))[0] for keys in q.layout.keys]
        assert sum(cursors) == GROUPS and all(cursors)  # each partition's cursor counts its own groups
        q.close()
    finally:
        clean_up(procs, cluster, name)



def test_a_process_started_while_the_urls_node_is_down_exits_3_not_an_internal_error(
        private_cluster: LocalCluster) -> None:
    url = private_cluster.url
    private_cluster.kill(0)
    try:
        done = subprocess.run([sys.executable, "-m", "rollout_queue", "--url", url, "--queue", "q", "stats"],
                              cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)}, capture_output=True, text=True,
                              timeout=60)
        assert done.returncode == 3, done.stderr
        assert "cannot reach" in done.stderr and "internal error" not in done.stderr
    finally:
        private_cluster.restart(0)


def test_the_shipped_trainer_and_torch_workers_train_on_a_cluster_with_pushed_weights(
        cluster: LocalCluster, tmp_path: Path, monkeypatch: Any) -> None:
    """``rollout-queue train`` itself (the GRPO trainer, a real tiny model) creates a P = 6 queue on
    the 3-master cluster and trains 3 steps from two torch workers and ``rollout-queue produce``,
    every version pushed over torch.distributed with the rendezvous on the cluster; the workers
    take every push and exit 0 on SIGTERM."""
    import pytest

    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from rollout_queue.workers.tiny_model import build_tiny_model

    monkeypatch.setenv("ROLLOUT_PUSH_HOST", "127.0.0.1")
    model = str(build_tiny_model(tmp_path / "tiny"))
    url, name = cluster.url, spread_name(cluster, P)
    dataset = tmp_path / "d.jsonl"
    dataset.write_bytes(b"".join(orjson.dumps({"question": f"what is {i} + {i}?"}) + b"\n" for i in range(36)))
    common = ["--url", url, "--queue", name, "--partitions", str(P)]
    procs: list[subprocess.Popen[str]] = []

    def start(*argv: str) -> subprocess.Popen[str]:
        procs.append(spawn(*argv))
        return procs[-1]

    try:
        trainer = start("-m", "rollout_queue", *common, "train", "--model", model, "--weights-dir",
                        str(tmp_path / "weights"), "--steps", "3", "--batch-groups", str(P), "--lr", "1e-3",
                        "--threads", "1", "--weights-transport", "dist", "--push-join", "10")
        def created() -> Any:
            if trainer.poll() is not None:
                raise AssertionError(f"the trainer exited {trainer.returncode}: {trainer.communicate()[1][-3000:]}")
            return opened(url, name)

        q = wait_until(created, 120, interval=0.1, message="the trainer to create the queue")
        workers = [start("-m", "rollout_queue.workers", *common, "--engine", "torch", "--model", model,
                         "--worker-id", f"tw-{i}", "--max-tokens", "6", "--block-ms", "200",
                         "--reward", "rollout_queue.demo.task:digit_reward") for i in (1, 2)]
        # No data before both workers are up: every version's round then expects and reaches both.
        wait_until(lambda: q.client.zcard(q.layout.keys[0]["workers"]) == 2, 120, interval=0.1,
                   message="both workers up")
        producer = start("-m", "rollout_queue", *common, "produce", str(dataset), "--prompt-field", "question",
                         "--n", "2", "--batch-size", "6", "--max-backlog", "18", "--no-progress")
        code, _, trainer_err = finish(trainer, 240)
        assert code == 0, trainer_err[-3000:]
        rounds = [line for line in trainer_err.splitlines() if "weights push round" in line]
        assert q.version == 3 and q.stats().committed >= 3 * P
        producer.send_signal(signal.SIGTERM)
        finish(producer)
        for proc in workers:
            proc.send_signal(signal.SIGTERM)
            code, _, err = finish(proc, 60)
            assert code == 0, err[-3000:]
            assert err.count("weights received by push") == 3, (err[-3000:], rounds)
        push = q.client.hgetall(q.layout.keys[0]["push"])
        assert push[b"version"] == b"3" and push[b"state"] == b"done" and push[b"acked"] == b"2"
        q.close()
    finally:
        clean_up(procs, cluster, name)
