"""Real redis-server processes for the test suite: a standalone server or cluster node
(RedisServer), a 3+3 Redis Cluster (RedisCluster) and one-shot commands (redis_command).
Re-exported by tests/services.py.
"""

from __future__ import annotations

import subprocess
from typing import Any, Self

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from tests.services_base import _LIVE, HOST, ServiceError, _Server, find_binary, free_port, poll


def redis_command(port: int, *args: Any, timeout: float = 2.0) -> Any:
    """One command on a throwaway connection. No retries: a dead node must fail fast rather
    than back off. redis-py parses replies (INFO, CLUSTER INFO/NODES become dicts)."""
    with redis.Redis(host=HOST, port=port, socket_timeout=timeout, decode_responses=True,
                     socket_connect_timeout=timeout, retry=Retry(NoBackoff(), 0)) as client:
        return client.execute_command(*args)


def cluster_view(port: int) -> list[dict[str, Any]]:
    """CLUSTER NODES as the node on `port` sees it, with "port" added and "flags" as a set."""
    nodes = redis_command(port, "CLUSTER NODES").items()
    return [{**v, "port": int(a.rsplit(":", 1)[1]), "flags": set(v["flags"].split(","))}
            for a, v in nodes]


def _healthy(view: dict[str, Any]) -> bool:
    return bool(view["connected"]) and not view["flags"] & {"fail", "fail?", "handshake", "noaddr"}


def _serves(view: dict[str, Any], slot: int | None = None) -> bool:
    """A master serving `slot` (any slot if None)."""
    ranges = [(int(r[0]), int(r[-1])) for r in view["slots"]]
    hit = bool(ranges) if slot is None else any(a <= slot <= b for a, b in ranges)
    return "master" in view["flags"] and hit


class RedisServer(_Server):
    """A private redis-server: standalone, or a cluster node if cluster_node_timeout_ms."""

    kind = "redis"

    def __init__(self, port: int | None = None, *, cluster_node_timeout_ms: int | None = None):
        super().__init__(port)
        self.node_timeout_ms = cluster_node_timeout_ms

    @property
    def url(self) -> str:
        return f"redis://{HOST}:{self.port}/0"

    def _new_port(self) -> int:
        return free_port(bus_offset=10000 if self.node_timeout_ms else 0)

    def _argv(self) -> list[str]:
        argv = [find_binary("redis-server"), "--port", str(self.port), "--bind", HOST,
                "--dir", str(self.dir), "--save", "", "--appendonly", "no",
                "--daemonize", "no", "--logfile", "",
                "--repl-diskless-sync-delay", "0"]  # replicas sync at once, not after 5 s
        if self.node_timeout_ms:  # validity factor 0: a replica may always take over
            argv += ["--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf",
                     "--cluster-node-timeout", str(self.node_timeout_ms),
                     "--cluster-replica-validity-factor", "0"]
        return argv

    def _ready(self) -> bool:
        # process_id proves that *our* process answers, not another server on the port.
        pid = redis_command(self.port, "INFO", "server", timeout=0.5)["process_id"]
        return redis_command(self.port, "PING", timeout=0.5) and self._popen.pid == pid

    def flushall(self) -> None:
        redis_command(self.port, "FLUSHALL")


class RedisCluster:
    """Real cluster nodes (3 masters + 3 replicas by default) joined by redis-cli --cluster
    create; node_timeout_ms is small (1 s) so a killed master fails over within seconds."""

    def __init__(self, masters: int = 3, replicas: int = 1, node_timeout_ms: int = 1000):
        self.n_masters, self.replicas = masters, replicas
        self.nodes = [RedisServer(cluster_node_timeout_ms=node_timeout_ms)
                      for _ in range(masters * (1 + replicas))]

    @property
    def startup_nodes(self) -> list[tuple[str, int]]:
        return [(HOST, node.port) for node in self.nodes]

    @property
    def url(self) -> str:
        return self._any().url

    def start(self, timeout: float = 30.0) -> Self:
        """Start all nodes, create the cluster and wait until it is fully healthy."""
        _LIVE.add(self)
        try:
            for node in self.nodes:
                node.start()
            argv = [find_binary("redis-cli"), "--cluster", "create", "--cluster-yes",
                    *(f"{HOST}:{node.port}" for node in self.nodes),
                    "--cluster-replicas", str(self.replicas)]
            done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout,
                                  stdin=subprocess.DEVNULL, check=False)
            if done.returncode != 0:
                raise ServiceError(f"{' '.join(argv)} failed:\n{done.stdout}{done.stderr}")
            self.wait_healthy(timeout)
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        for node in self.nodes:
            node.stop()
        _LIVE.discard(self)

    def _any(self) -> RedisServer:
        """A running node, to ask about the cluster."""
        live = [node for node in self.nodes if node.is_running]
        if not live:
            raise ServiceError("no cluster node is running")
        return live[0]

    def _node(self, port: int) -> RedisServer:
        return next(node for node in self.nodes if node.port == port)

    def keyslot(self, key: str) -> int:
        return int(redis_command(self._any().port, "CLUSTER KEYSLOT", key))

    def masters(self) -> list[RedisServer]:
        """The nodes that the cluster currently treats as healthy, slot-serving masters."""
        views = cluster_view(self._any().port)
        return [self._node(v["port"]) for v in views if _serves(v) and _healthy(v)]

    def kill_master_of(self, key: str) -> RedisServer:
        """SIGKILL the master serving `key`'s slot and return it (heal() restarts it)."""
        slot, views = self.keyslot(key), cluster_view(self._any().port)
        node = self._node(next(v["port"] for v in views if _serves(v, slot) and _healthy(v)))
        node.kill()
        return node

    def wait_for_failover(self, key: str, timeout: float = 30.0) -> RedisServer:
        """Poll until all live nodes are ok and agree that one live master serves `key`."""
        slot = self.keyslot(key)
        return poll(lambda: self._agreed_owner(slot), timeout=timeout, interval=0.1,
                    what=f"failover of slot {slot} (node dirs: {[n.dir for n in self.nodes]})")

    def _agreed_owner(self, slot: int) -> RedisServer | None:
        owners: set[int] = set()
        for node in (node for node in self.nodes if node.is_running):
            if redis_command(node.port, "CLUSTER INFO")["cluster_state"] != "ok":
                return None
            owners |= {v["port"] for v in cluster_view(node.port) if _serves(v, slot)}
        owner = self._node(owners.pop()) if len(owners) == 1 else None
        if owner is None or redis_command(owner.port, "INFO", "replication")["role"] != "master":
            return None
        return owner

    def heal(self, timeout: float = 30.0) -> None:
        """Restart killed nodes (they rejoin from nodes.conf as replicas); wait for health."""
        for node in self.nodes:
            if not node.is_running:
                node.restart()
        self.wait_healthy(timeout)

    def wait_healthy(self, timeout: float = 30.0) -> None:
        """Poll until all nodes agree, every slot is served and every master has linked
        replicas, i.e. the cluster could fail over again."""
        poll(self._healthy, timeout=timeout, interval=0.1,
             what=f"redis cluster health (node dirs: {[n.dir for n in self.nodes]})")

    def _healthy(self) -> bool:
        want = {"cluster_state": "ok", "cluster_slots_ok": "16384",
                "cluster_known_nodes": str(len(self.nodes))}
        for node in self.nodes:
            state = redis_command(node.port, "CLUSTER INFO")
            views = cluster_view(node.port)
            masters = [v for v in views if _serves(v)]
            linked = redis_command(node.port, "INFO", "replication").get("master_link_status")
            if (any(state.get(k) != v for k, v in want.items()) or linked not in (None, "up")
                    or not all(_healthy(v) for v in views) or len(masters) != self.n_masters
                    or any(sum(v["master_id"] == m["node_id"] for v in views) < self.replicas
                           for m in masters)):
                return False
        return True
