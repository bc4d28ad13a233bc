"""A cluster master dies mid-conversation: its replica takes over, no acknowledged turn is lost.

"Acknowledged" is a commit that returned. A commit returns after Redis applied
the write and WAIT saw it on a replica (wait_replicas = 1), or after the turn
went to the local LRU and the compensation log; a replay later writes it to
whichever node then owns the slot.
"""

from __future__ import annotations

import asyncio

import pytest
from redis.asyncio import RedisCluster
from redis.asyncio.cluster import ClusterNode

from gateway.sessions.codec import decode
from tests.fixtures_sessions import chat_turn, cluster_config, running, turn_numbers, wait_until
from tests.services import RedisCluster as ClusterServers

PACE_S = 0.02
"""Between two turns while the failover runs (a conversation, not a tight loop)."""
MAX_TURNS = 500


async def read_cluster_copy(servers: ClusterServers, redis_key: str) -> list[int]:
    """The session as the cluster holds it, through a fresh client."""
    nodes = [ClusterNode(host, port) for host, port in servers.startup_nodes]
    client = RedisCluster(startup_nodes=nodes)
    try:
        return turn_numbers(list(decode(await client.hget(redis_key, "c")).messages))
    finally:
        await client.aclose()


@pytest.mark.timeout(90)
async def test_killed_master_loses_no_acknowledged_turn(redis_cluster: ClusterServers) -> None:
    async with running(cluster_config(redis_cluster)) as service:
        key = service.keys.key("default", "failover").redis_key
        for n in range(10):
            await chat_turn(service, "failover", n)  # (a slow moment may make one degraded)
        killed = redis_cluster.kill_master_of(key)
        acknowledged = 10
        try:
            failover = asyncio.ensure_future(
                asyncio.to_thread(redis_cluster.wait_for_failover, key))
            while not failover.done() and acknowledged < MAX_TURNS:
                await chat_turn(service, "failover", acknowledged)  # served, maybe degraded
                acknowledged += 1
                await asyncio.wait({failover}, timeout=PACE_S)
            promoted = await failover
            assert promoted is not killed
            for _ in range(5):  # and the conversation goes on on the new master
                await chat_turn(service, "failover", acknowledged)
                acknowledged += 1
            await wait_until(lambda: service.stats.backlog == 0, within=20.0,
                             what="the compensation log drained into the new master")
            stats = service.stats
            assert stats.fallback_writes > 0  # some turns did go through the fallback
            assert stats.replayed >= stats.fallback_writes
            assert await read_cluster_copy(redis_cluster, key) == list(range(acknowledged))
        finally:
            await asyncio.to_thread(redis_cluster.heal)
    assert await read_cluster_copy(redis_cluster, key) == list(range(acknowledged))
