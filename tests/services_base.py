"""The process harness behind tests/services.py: free ports, binaries, log tails, readiness
polling and the _Server base class (plain helpers: no pytest, no mocks).

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

import redis

HOST = "127.0.0.1"
_HINT = "run scripts/ensure-services.sh (as root it installs redis-server and mariadb-server)"
_SBIN = ("/usr/sbin", "/usr/local/sbin", "/sbin")  # mariadbd lives there; user PATHs omit it
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
