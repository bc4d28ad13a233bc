"""Building the configured store and its Redis connections.

Connections get a connect timeout as small as the call budget and at most one
retry (which reconnects a pooled connection that a restarted server closed):
the budget, not the client's retry policy, decides how long a caller waits.
The cluster client also gets a socket timeout of one budget; the standalone
link needs none (see :mod:`gateway.sessions.redis_link`).
"""

from __future__ import annotations

from typing import Any

from redis.asyncio import RedisCluster
from redis.asyncio.cluster import ClusterNode
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.driver_info import DriverInfo

from gateway.sessions.lru import BlobCache
from gateway.sessions.memory_store import MemoryStore
from gateway.sessions.redis_link import ClusterLink, Link, ServerLink
from gateway.sessions.redis_store import RedisStore
from gateway.sessions.settings import SessionsConfig
from gateway.sessions.sharded_store import ShardedStore
from gateway.sessions.store import SessionStore


def build_cache(config: SessionsConfig) -> BlobCache:
    return BlobCache(config.lru_max_entries, config.lru_max_bytes, config.ttl_seconds)


def build_store(config: SessionsConfig) -> SessionStore:
    """The store named by ``config.store``; nothing is contacted yet."""
    if config.store == "memory":
        return MemoryStore(build_cache(config))
    if config.store == "redis":
        return _redis_store(config, _server_link(config, config.url))
    if config.store == "cluster":
        return _redis_store(config, ClusterLink(_cluster_client(config)))
    if config.store == "sharded":
        servers = [_redis_store(config, _server_link(config, shard.url))
                   for shard in config.shards]
        owner = {bucket: index for index, shard in enumerate(config.shards)
                 for bucket in shard.buckets}
        return ShardedStore(servers, owner)
    raise ValueError(f"unknown session store {config.store!r}")


def _connection_options(config: SessionsConfig) -> dict[str, Any]:
    """Small timeouts, one retry, and no CLIENT SETINFO round trips on connect."""
    seconds = config.op_timeout_ms / 1000
    return {"socket_timeout": seconds, "socket_connect_timeout": seconds,
            "retry": Retry(NoBackoff(), 1), "decode_responses": False,
            "driver_info": DriverInfo(name=None, lib_version=None)}


def _server_link(config: SessionsConfig, url: str) -> ServerLink:
    """A link whose callers queue for a bounded, pre-warmed pool.

    Opening a connection costs more than a command: with a fixed pool a
    burst waits a few hundred microseconds for a free connection instead.
    The wait is unbounded here because every call has its own budget.
    """
    return ServerLink(url, config.connection_limit, _connection_options(config))


def _cluster_client(config: SessionsConfig) -> RedisCluster:
    nodes = []
    for node in config.nodes:
        host, _, port = node.rpartition(":")
        nodes.append(ClusterNode(host, int(port)))
    return RedisCluster(startup_nodes=nodes, max_connections=config.connection_limit,
                        **_connection_options(config))


def _redis_store(config: SessionsConfig, link: Link) -> RedisStore:
    return RedisStore(link, ttl_ms=int(config.ttl_seconds * 1000),
                      op_timeout_ms=config.op_timeout_ms, wait_replicas=config.wait_replicas,
                      warm_connections=min(config.warm_connections, config.connection_limit))
