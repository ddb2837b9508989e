"""Connecting by URL to a plain Redis or to a Redis Cluster: the one place that tells them apart.

A cluster is named by the URL scheme ``redis+cluster://host:port`` (``rediss+cluster://`` with TLS),
any one node of it being enough (redis-py's ``RedisCluster`` learns the others), or by passing
``cluster=True`` with a plain ``redis://`` URL. Everything above this module (flows, scripts,
clients) is the same for both: every key of a queue carries the hash tag ``{<queue>}``, so each
script runs on one slot, and transport.py routes plain commands by that tag.

It owns no queue semantics and keeps the connection defaults it is given (redis_options):
in particular redis-py's own retries stay off, on a cluster too, so that only the transport decides
what is safe to resend.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit, urlunsplit

import redis
import redis.asyncio
import redis.asyncio.cluster
import redis.cluster
from redis.backoff import NoBackoff
from redis.asyncio.retry import Retry as AsyncRetry
from redis.retry import Retry

#: cluster scheme -> the scheme redis-py expects for the same server
CLUSTER_SCHEMES = {"redis+cluster": "redis", "rediss+cluster": "rediss"}


def split_url(url: str, cluster: bool | None = None) -> tuple[str, bool]:
    """(the URL redis-py understands, whether it names a cluster).

    ``cluster=None`` decides by the scheme; True or False overrides it (a ``+cluster`` scheme with
    ``cluster=False`` is refused: the two would contradict each other).
    """
    parts = urlsplit(url)
    by_scheme = parts.scheme in CLUSTER_SCHEMES
    if by_scheme and cluster is False:
        raise ValueError(f"{url!r} names a cluster but cluster=False was passed")
    if by_scheme:
        url = urlunsplit(parts._replace(scheme=CLUSTER_SCHEMES[parts.scheme]))
    return url, bool(cluster) or by_scheme


def redis_options(options: dict[str, Any], *, asyncio: bool = False) -> dict[str, Any]:
    """Connection defaults: no silent retries inside redis-py (the transport decides what is safe to
    resend), and a socket timeout above the longest blocking wait. ``asyncio``: the options of a
    redis.asyncio client, whose retry must be redis.asyncio's (redis-py >= 7 converts a sync one with
    a UserWarning on stderr, which breaks a process's JSON log lines)."""
    retry = (AsyncRetry if asyncio else Retry)(NoBackoff(), 0)
    return {"retry": retry, "socket_timeout": 10.0, "socket_connect_timeout": 5.0, **options}


def connect(url: str, options: dict[str, Any], cluster: bool | None = None, *, asyncio: bool = False) -> Any:
    """A client for ``url``: ``RedisCluster`` for a cluster, else ``Redis``; from redis.asyncio when
    ``asyncio`` (an asyncio cluster client reads its slot map on first use, in the driver)."""
    plain, is_cluster = split_url(url, cluster)
    if asyncio:
        return (redis.asyncio.cluster.RedisCluster if is_cluster else redis.asyncio.Redis).from_url(plain, **options)
    return (redis.cluster.RedisCluster if is_cluster else redis.Redis).from_url(plain, **options)
