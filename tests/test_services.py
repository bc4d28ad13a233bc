"""The test-server harness itself works: real servers answer, die, come back and fail over.

These run first-hand against the servers of tests/services.py, so a broken harness shows up
here rather than as confusing failures in the gateway's own tests.
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import pytest
import redis.asyncio as aioredis
from redis.asyncio.cluster import ClusterNode

from tests.services import MariaDBServer, RedisCluster, RedisServer, ServiceError


@asynccontextmanager
async def cluster_client(cluster: RedisCluster) -> AsyncIterator[aioredis.RedisCluster]:
    """A redis.asyncio cluster client that learns the topology from all startup nodes."""
    nodes = [ClusterNode(host, port) for host, port in cluster.startup_nodes]
    client = aioredis.RedisCluster(startup_nodes=nodes, decode_responses=True)
    try:
        await client.initialize()
        yield client
    finally:
        await client.aclose()


def test_start_failure_names_the_log_and_its_tail() -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        server = RedisServer(port=busy.getsockname()[1])  # fixed port: no retry elsewhere
        try:
            with pytest.raises(ServiceError, match="Address already in use") as failure:
                server.start(timeout=5)
            assert str(server.log_path) in str(failure.value)
        finally:
            server.stop()
    assert server.dir is None


async def test_standalone_set_get(redis_url: str) -> None:
    client = aioredis.from_url(redis_url, decode_responses=True)
    try:
        assert await client.set("greeting", "hello")
        assert await client.get("greeting") == "hello"
    finally:
        await client.aclose()


async def test_standalone_kill_and_restart_keep_the_port(redis_server: RedisServer) -> None:
    port = redis_server.port
    redis_server.kill()
    assert not redis_server.is_running
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
    redis_server.restart()
    assert redis_server.port == port
    client = aioredis.from_url(redis_server.url)
    try:
        assert await client.ping()
    finally:
        await client.aclose()


async def test_cluster_spreads_keys_and_keeps_hash_tags_together(
    redis_cluster: RedisCluster,
) -> None:
    keys = [f"spread:{i}" for i in range(100)]
    async with cluster_client(redis_cluster) as client:
        for key in keys:
            await client.set(key, key)
        assert [await client.get(key) for key in keys] == keys
        assert len({client.keyslot(key) for key in keys}) > 90
        owners = {client.get_node_from_key(key).port for key in keys}
        assert owners == {node.port for node in redis_cluster.masters()}

        tagged = {f"{{user:42}}:{field}": field for field in ("a", "b", "c")}
        assert len({redis_cluster.keyslot(key) for key in tagged}) == 1
        await client.mset(tagged)  # multi-key commands need a single slot
        assert await client.mget(list(tagged)) == list(tagged.values())


@pytest.mark.timeout(60)  # failover plus re-joining the killed node: seconds, bounded at 30 s each
async def test_cluster_fails_over_when_a_master_is_killed(redis_cluster: RedisCluster) -> None:
    key = "failover:key"
    async with cluster_client(redis_cluster) as client:
        await client.set(key, "before")
        killed = redis_cluster.kill_master_of(key)
        try:
            promoted = await asyncio.to_thread(redis_cluster.wait_for_failover, key)
            assert promoted is not killed and promoted.is_running
            assert killed not in redis_cluster.masters()
            assert await client.set(key, "after")  # the old client finds the new master
            assert await client.get(key) == "after"
        finally:
            await asyncio.to_thread(redis_cluster.heal)
    async with cluster_client(redis_cluster) as fresh:
        assert await fresh.get(key) == "after"


def test_mariadb_answers_select_1(mariadb: MariaDBServer) -> None:
    assert mariadb.query("SELECT 1") == "1"
    assert mariadb.query("SELECT DATABASE()") == mariadb.database
    assert mariadb.url.startswith("mysql+asyncmy://")


def test_mariadb_kill_and_restart_keep_port_and_data(mariadb: MariaDBServer) -> None:
    if mariadb.external_url:
        pytest.skip("cannot kill the external server from GATEWAY_TEST_MYSQL_URL")
    port = mariadb.port
    mariadb.query("CREATE TABLE IF NOT EXISTS harness (v INT) ENGINE=InnoDB")
    mariadb.query("DELETE FROM harness; INSERT INTO harness VALUES (7)")
    mariadb.kill()
    assert not mariadb.is_running
    mariadb.restart()
    assert mariadb.port == port
    assert mariadb.query("SELECT v FROM harness") == "7"
