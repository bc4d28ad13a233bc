"""pytest fixtures for the real test servers of tests/services.py.

The main conftest does `from tests.fixtures_services import *`. Session-scoped fixtures
start lazily (only when a test asks for them) because a cluster costs seconds, and stop at
session end; services.py also stops leftovers at exit if a session dies midway.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.services import MariaDBServer, RedisCluster, RedisServer

__all__ = ["mariadb", "redis_cluster", "redis_server", "redis_url"]


@pytest.fixture(scope="session")
def redis_server() -> Iterator[RedisServer]:
    """One standalone redis-server for the session (tests may kill/restart it)."""
    server = RedisServer().start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def redis_url(redis_server: RedisServer) -> str:
    """URL of the standalone server, running and empty, so tests cannot leak into each other.

    Restarts the server first if an earlier (fault) test left it killed.
    """
    redis_server.start()
    redis_server.flushall()
    return redis_server.url


@pytest.fixture(scope="session")
def redis_cluster() -> Iterator[RedisCluster]:
    """A 3-master/3-replica cluster; a test that kills a node should heal() it afterwards."""
    cluster = RedisCluster().start()
    try:
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture(scope="session")
def mariadb() -> Iterator[MariaDBServer]:
    """A private MariaDB with database `gateway_test` (or $GATEWAY_TEST_MYSQL_URL if set)."""
    server = MariaDBServer().start()
    try:
        yield server
    finally:
        server.stop()
