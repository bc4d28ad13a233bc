"""Real Redis and MariaDB servers for the test suite (plain helpers: no pytest, no mocks).

Each server is a child process on an ephemeral 127.0.0.1 port with its state in a private temp
dir, so tests never touch the machine's own Redis (6379) / MariaDB (3306) and may kill and
restart servers to exercise fault handling. Readiness is *polled* against a bounded deadline; a
failed start raises ServiceError naming the log file and its tail. Cleanup is explicit (stop()),
backed by atexit and, on Linux, a parent-death signal so no server outlives a killed pytest.

This module is the public entry point (``from tests.services import RedisServer, ...``); the
code lives in tests/services_base.py (process harness), tests/services_redis.py (Redis server
and cluster) and tests/services_mariadb.py (MariaDB).
"""

from __future__ import annotations

from tests.services_base import HOST, ServiceError, find_binary, free_port, log_tail, poll
from tests.services_mariadb import MYSQL_URL_ENV, MariaDBServer
from tests.services_redis import RedisCluster, RedisServer, cluster_view, redis_command

__all__ = [
    "HOST",
    "MYSQL_URL_ENV",
    "MariaDBServer",
    "RedisCluster",
    "RedisServer",
    "ServiceError",
    "cluster_view",
    "find_binary",
    "free_port",
    "log_tail",
    "poll",
    "redis_command",
]
