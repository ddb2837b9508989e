"""A private Redis Cluster of N masters on loopback, for the cluster tests and the cluster benchmark.

It owns the life of the cluster: N LocalServer nodes (cluster-enabled, AOF on, each with its
``nodes.conf`` in its own directory), ``redis-cli --cluster create`` to assign the slots, and the
waits until every node reports ``cluster_state:ok``. ``kill(i)`` SIGKILLs one master and
``restart(i)`` brings it back on the same port and directory (it rereads ``nodes.conf`` and replays
its AOF, so every acknowledged write is there again).

The nodes run with ``cluster-require-full-coverage no``: while one master is down the others keep
serving their own slots, which is what a partitioned queue relies on (its other partitions keep
working). There are no replicas, so no failover: a dead master's slots wait for it to come back.

Like local_server.py it must not touch a server it did not start, and it knows nothing about queues.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path
from types import TracebackType

import redis

from rollout_queue.devtools.local_server import (
    HOST,
    LocalServer,
    LocalServerError,
    ServerStartError,
    find_server,
    pick_free_port,
)


def find_cli(binary: str) -> str:
    """The ``*-cli`` that belongs to a ``*-server`` binary (beside it, else on PATH)."""
    name = os.path.basename(binary).replace("-server", "-cli")
    beside = Path(binary).with_name(name)
    if beside.is_file() and os.access(beside, os.X_OK):
        return str(beside)
    found = shutil.which(name)
    if found is None:
        raise LocalServerError(f"no {name} found next to {binary} or on PATH: it creates the cluster")
    return found


class LocalCluster:
    """``masters`` cluster nodes on free loopback ports; ``url`` is ``redis+cluster://`` to the first."""

    def __init__(self, kind: str | None = None, masters: int = 3, *, node_timeout_ms: int = 2000,
                 appendfsync: str = "always", ready_timeout_s: float = 30.0) -> None:
        self.kind, self.binary = find_server(kind)
        self.cli = find_cli(self.binary)
        self.ready_timeout_s, self.node_timeout_ms, self.appendfsync = ready_timeout_s, node_timeout_ms, appendfsync
        self.nodes: list[LocalServer] = [self._new_node() for _ in range(masters)]

    def _new_node(self) -> LocalServer:
        # The cluster bus port is set explicitly: the default (port + 10000) may be taken or > 65535.
        config = [("cluster-enabled", "yes"), ("cluster-config-file", "nodes.conf"),
                  ("cluster-node-timeout", str(self.node_timeout_ms)), ("cluster-port", str(pick_free_port())),
                  ("cluster-require-full-coverage", "no")]
        return LocalServer(self.kind, binary=self.binary, appendfsync=self.appendfsync, extra_config=config)

    @property
    def url(self) -> str:
        return f"redis+cluster://{HOST}:{self.nodes[0].port}"

    @property
    def addresses(self) -> list[str]:
        return [f"{HOST}:{n.port}" for n in self.nodes]

    def start(self) -> "LocalCluster":
        """Start every node, assign the slots evenly, and wait until all agree the cluster is ok."""
        try:
            return self._start()
        except BaseException:
            self.cleanup()  # a half-made cluster is of no use to anyone
            raise

    def _start(self) -> "LocalCluster":
        for i in range(len(self.nodes)):
            for tries in range(3):
                try:
                    self.nodes[i].start()
                    break
                except ServerStartError:
                    # Most likely another process took the bus port between picking and binding.
                    self.nodes[i].cleanup(graceful=False)
                    if tries == 2:
                        raise
                    self.nodes[i] = self._new_node()
        result = subprocess.run(
            [self.cli, "--cluster", "create", *self.addresses, "--cluster-replicas", "0", "--cluster-yes"],
            stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=self.ready_timeout_s)
        if result.returncode != 0:
            raise LocalServerError(f"{self.cli} --cluster create failed:\n{result.stdout}\n{result.stderr}")
        self.wait_ok()
        return self

    def wait_ok(self, nodes: list[int] | None = None) -> None:
        """Wait until each node (all running ones by default) reports cluster_state:ok and knows every
        master's slots."""
        deadline = time.monotonic() + self.ready_timeout_s
        for i in nodes if nodes is not None else [i for i, n in enumerate(self.nodes) if n.is_running()]:
            client = redis.Redis(host=HOST, port=self.nodes[i].port, socket_timeout=2.0)
            try:
                while not self._is_ok(client):
                    if time.monotonic() > deadline:
                        raise LocalServerError(f"cluster node {i} not ok after {self.ready_timeout_s}s:\n"
                                               f"{self.nodes[i].log_tail()}")
                    time.sleep(0.05)  # polling the cluster's own convergence, bounded by the deadline
            finally:
                client.close()

    def _is_ok(self, client: redis.Redis) -> bool:
        try:
            info = client.execute_command("CLUSTER", "INFO")
        except redis.RedisError:
            return False
        text = info.decode() if isinstance(info, bytes) else str(info)
        return "cluster_state:ok" in text and "cluster_slots_ok:16384" in text

    def node_of(self, key: str) -> int:
        """Index of the node that owns ``key``'s slot (from the first running node's view)."""
        running = next(n for n in self.nodes if n.is_running())
        client = redis.Redis(host=HOST, port=running.port)
        try:
            slot = int(client.execute_command("CLUSTER", "KEYSLOT", key))
            for start, end, master, *_ in client.execute_command("CLUSTER", "SLOTS"):
                if start <= slot <= end:
                    return next(i for i, n in enumerate(self.nodes) if n.port == int(master[1]))
        finally:
            client.close()
        raise LocalServerError(f"slot of {key!r} is not assigned")

    def kill(self, i: int) -> None:
        """SIGKILL master ``i`` (a crash; its slots are unavailable until restart)."""
        self.nodes[i].kill()

    def restart(self, i: int) -> None:
        """Start master ``i`` again on its port and directory, and wait until the cluster is ok."""
        self.nodes[i].start()
        self.wait_ok()

    def cleanup(self) -> None:
        for node in self.nodes:
            node.cleanup(graceful=False)  # throwaway data: no need to wait for a clean stop

    def __enter__(self) -> "LocalCluster":
        return self.start()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.cleanup()
