"""Real Redis and MariaDB servers for the test suite (plain helpers: no pytest, no mocks).

Each server is a child process on an ephemeral 127.0.0.1 port with its state in a private temp
dir, so tests never touch the machine's own Redis (6379) / MariaDB (3306) and may kill and
restart servers to exercise fault handling. Readiness is *polled* against a bounded deadline; a
failed start raises ServiceError naming the log file and its tail. Cleanup is explicit (stop()),
backed by atexit and, on Linux, a parent-death signal so no server outlives a killed pytest.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import functools
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Self, TypeVar
from urllib.parse import unquote, urlsplit

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

HOST = "127.0.0.1"
MYSQL_URL_ENV = "GATEWAY_TEST_MYSQL_URL"
_HINT = "run scripts/ensure-services.sh (as root it installs redis-server and mariadb-server)"
_SBIN = ("/usr/sbin", "/usr/local/sbin", "/sbin")  # mariadbd lives there; user PATHs omit it
_AS_ROOT = ["--user=root"] if os.geteuid() == 0 else []  # else mariadbd refuses to run as root
_NOT_YET = (OSError, redis.RedisError, subprocess.SubprocessError)  # poll() retries on these
_T = TypeVar("_T")


class ServiceError(RuntimeError):
    """A test server could not be found, started, reached or stopped."""


def free_port(bus_offset: int = 0) -> int:
    """A free loopback port (and P+bus_offset, for a cluster node's bus). Another process may
    still grab it before use, so servers on auto-picked ports retry on "Address in use"."""
    for _ in range(200):
        with socket.socket() as sock, socket.socket() as bus:
            sock.bind((HOST, 0))
            port = int(sock.getsockname()[1])
            with contextlib.suppress(OSError, OverflowError):
                if bus_offset:
                    bus.bind((HOST, port + bus_offset))
                return port
    raise ServiceError(f"no free port pair (P, P+{bus_offset}) in 200 tries")


def find_binary(*names: str) -> str:
    """Path of the first of `names` on PATH or in the sbin dirs; ServiceError if none."""
    search = os.pathsep.join([os.environ.get("PATH", ""), *_SBIN])
    for name in names:
        if found := shutil.which(name, path=search):
            return found
    raise ServiceError(f"none of {', '.join(names)} found; {_HINT}")


def log_tail(path: Path, offset: int = 0, lines: int = 25) -> str:
    """Header plus last lines of a log from byte `offset` (earlier runs cannot mislead)."""
    try:
        with path.open("rb") as stream:
            stream.seek(offset)
            text = stream.read().decode(errors="replace")
    except OSError as exc:
        text = f"<cannot read: {exc}>"
    return f"--- last lines of {path} ---\n" + "\n".join(text.splitlines()[-lines:])


# preexec hook (PR_SET_PDEATHSIG = 1): the kernel SIGKILLs a server whose pytest died without
# running atexit. Main thread only, as the signal fires when the spawning *thread* exits.
_DIE_WITH_PARENT = (functools.partial(ctypes.CDLL(None).prctl, 1, signal.SIGKILL)
                    if sys.platform.startswith("linux") else None)
_LIVE: set[Any] = set()  # objects with stop(); stopped at interpreter exit as a safety net


@atexit.register
def _stop_leftovers() -> None:
    for service in list(_LIVE):
        with contextlib.suppress(Exception):
            service.stop()


def poll(check: Callable[[], _T], *, timeout: float, what: str, server: _Server | None = None,
         interval: float = 0.05) -> _T:
    """check()'s first truthy result within `timeout`; connection errors mean "not yet". If
    `server` dies, fail at once with its log tail: explain a broken start, don't time out."""
    deadline = time.monotonic() + timeout
    last: Exception | None = None
    while True:
        if server is not None and not server.is_running:
            raise server.failure(f"{what}: the process exited")
        result: _T | None = None
        try:
            result = check()
        except (*_NOT_YET, ServiceError) as exc:
            last = exc
        if result:
            return result
        if time.monotonic() >= deadline:
            message = f"{what}: not ready after {timeout:g}s (last error: {last!r})"
            raise server.failure(message) if server else ServiceError(message)
        time.sleep(interval)


class _Server:
    """A server child process with a temp dir and a log, on a port auto-picked until the first
    successful start and fixed from then on, so restart() comes back where clients expect it."""

    kind = "server"  # names the temp dir, the log file and error messages
    grace = 5.0  # seconds from SIGTERM to SIGKILL in stop()
    start_timeout = 10.0

    def __init__(self, port: int | None = None) -> None:
        self.port = port or 0
        self.dir: Path | None = None
        self._pick = port is None
        self._popen: subprocess.Popen[bytes] | None = None
        self._log_offset = 0

    @property
    def is_running(self) -> bool:
        return self._popen is not None and self._popen.poll() is None

    @property
    def log_path(self) -> Path:
        return (self.dir or Path(tempfile.gettempdir())) / f"{self.kind}.log"

    def _argv(self) -> list[str]:
        raise NotImplementedError

    def _ready(self) -> bool:
        raise NotImplementedError

    def _prepare(self) -> None:
        """Hook: runs after the temp dir exists, before spawning."""

    def _new_port(self) -> int:
        return free_port()

    def start(self, timeout: float | None = None) -> Self:
        """Start (no-op if running) and poll readiness; ServiceError with the log tail if not."""
        if self.is_running:
            return self
        if self.dir is None:
            self.dir = Path(tempfile.mkdtemp(prefix=f"gw-test-{self.kind}-"))
        _LIVE.add(self)
        self._prepare()
        for attempt in range(3):  # only an auto-picked port that lost a race is retried
            if self._pick:
                self.port = self._new_port()
            with self.log_path.open("ab") as log:  # the child keeps its own copy of the fd
                self._log_offset = log.tell()
                self._popen = subprocess.Popen(
                    self._argv(), stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                    start_new_session=True, preexec_fn=_DIE_WITH_PARENT
                    if threading.current_thread() is threading.main_thread() else None)
            try:
                poll(self._ready, timeout=timeout or self.start_timeout, server=self,
                     what=f"{self.kind} on port {self.port}")
                break
            except ServiceError as exc:
                self.kill()
                if not self._pick or attempt == 2 or "Address already in use" not in str(exc):
                    raise
        self._pick = False
        return self

    def failure(self, message: str) -> ServiceError:
        code = f" (exit code {self._popen.poll()})" if self._popen is not None else ""
        return ServiceError(f"{message}{code}\n{log_tail(self.log_path, self._log_offset)}")

    def stop(self, cleanup: bool = True) -> None:
        """SIGTERM, SIGKILL after `grace` s; cleanup=False keeps the dir for restart()."""
        if self.is_running and self._popen is not None:
            self._popen.terminate()
            try:
                self._popen.wait(self.grace)
            except subprocess.TimeoutExpired:
                self.kill()
        if cleanup:
            _LIVE.discard(self)
            if self.dir is not None:
                shutil.rmtree(self.dir, ignore_errors=True)
                self.dir = None

    def kill(self) -> None:
        """SIGKILL, like a crash (for fault tests); the dir stays for restart()."""
        if self.is_running and self._popen is not None:
            self._popen.kill()
            self._popen.wait(10)  # SIGKILL cannot be ignored; this only reaps

    def restart(self, timeout: float | None = None) -> Self:
        """Stop if running, then start on the same port with the same dir."""
        self.stop(cleanup=False)
        return self.start(timeout)


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


class MariaDBServer(_Server):
    """A private mariadbd, or the server named by $GATEWAY_TEST_MYSQL_URL (then nothing is
    started or stopped). SQL goes through the `mariadb` CLI: no Python driver needed."""

    kind, grace, start_timeout = "mariadb", 30.0, 60.0

    def __init__(self, database: str = "gateway_test", port: int | None = None,
                 external_url: str | None = None):
        super().__init__(port)
        url = os.environ.get(MYSQL_URL_ENV) if external_url is None else external_url
        self.external_url = url or None
        self.host, self.user, self.password, self.database = HOST, "root", "", database
        if self.external_url:
            parts = urlsplit(self.external_url)
            self.host, self.port = parts.hostname or HOST, parts.port or 3306
            self.user = unquote(parts.username or "root")
            self.password = unquote(parts.password or "")
            self.database = parts.path.lstrip("/") or database

    @property
    def url(self) -> str:
        local = f"mysql+asyncmy://{self.user}@{self.host}:{self.port}/{self.database}"
        return self.external_url or local

    @property
    def datadir(self) -> Path:
        return (self.dir or Path(tempfile.gettempdir())) / "data"

    def _prepare(self) -> None:
        """Create the system tables once per datadir (restart() reuses them)."""
        self.datadir.with_name("tmp").mkdir(exist_ok=True)
        if (self.datadir / "mysql").is_dir():
            return
        argv = [find_binary("mariadb-install-db", "mysql_install_db"), "--no-defaults",
                f"--datadir={self.datadir}", "--auth-root-authentication-method=normal",
                "--skip-test-db", *_AS_ROOT]
        log = self.log_path.with_name("install-db.log")
        with log.open("wb") as out:
            done = subprocess.run(argv, stdin=subprocess.DEVNULL, stdout=out, stderr=out,
                                  timeout=120, check=False)
        if done.returncode != 0:
            raise ServiceError(f"{argv[0]} failed ({done.returncode})\n{log_tail(log)}")

    def _argv(self) -> list[str]:
        tmp = self.datadir.parent
        return [find_binary("mariadbd", "mysqld"), "--no-defaults", *_AS_ROOT,
                f"--datadir={self.datadir}", f"--port={self.port}", f"--bind-address={HOST}",
                f"--socket={tmp / 'mysql.sock'}", f"--pid-file={tmp / 'mariadbd.pid'}",
                f"--tmpdir={tmp / 'tmp'}", "--skip-networking=0", "--skip-log-bin",
                "--skip-name-resolve", "--innodb-buffer-pool-size=64M",
                "--innodb-use-native-aio=0",  # io_setup() fails in some containers
                # Commits survive SIGKILL (the OS holds the log), not an OS crash: no fsyncs.
                "--innodb-flush-log-at-trx-commit=2", "--innodb-doublewrite=0",
                "--character-set-server=utf8mb4", "--collation-server=utf8mb4_general_ci"]

    def _ready(self) -> bool:
        # Comparing @@datadir proves that *our* server answers on the TCP port.
        datadir = self.query("SELECT @@datadir", database="", timeout=5)
        return os.path.realpath(datadir) == os.path.realpath(self.datadir)

    def start(self, timeout: float | None = None) -> Self:
        """Start (unless external), then create the database if it does not exist."""
        if self.external_url is None:
            super().start(timeout)
            self.query(f"CREATE DATABASE IF NOT EXISTS `{self.database}` "
                       "CHARACTER SET utf8mb4", database="")
        return self

    def kill(self) -> None:
        self._require_local("kill")
        super().kill()

    def restart(self, timeout: float | None = None) -> Self:
        self._require_local("restart")
        return super().restart(timeout)

    def _require_local(self, action: str) -> None:
        if self.external_url:
            raise ServiceError(f"cannot {action} the external server from ${MYSQL_URL_ENV}")

    def query(self, sql: str, *, database: str | None = None, timeout: float = 10.0) -> str:
        """Run SQL with the `mariadb` CLI over TCP (as the gateway connects); returns the
        tab-separated rows without headers, or raises ServiceError with the client's error."""
        argv = [find_binary("mariadb", "mysql"), "--no-defaults", "--protocol=TCP",
                f"--host={self.host}", f"--port={self.port}", f"--user={self.user}",
                f"--password={self.password}",
                "--connect-timeout=2", "--batch", "--skip-column-names", f"--execute={sql}"]
        if db := self.database if database is None else database:
            argv.append(f"--database={db}")
        done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout,
                              stdin=subprocess.DEVNULL, check=False)
        if done.returncode != 0:
            raise ServiceError(f"mariadb client -> {self.host}:{self.port} failed "
                               f"({done.returncode}): {done.stderr.strip()}")
        return done.stdout.rstrip("\n")
