"""A real MariaDB server for the test suite (MariaDBServer), or the external one named by
$GATEWAY_TEST_MYSQL_URL. Re-exported by tests/services.py.
"""

from __future__ import annotations

import os
import subprocess
import tempfile
from pathlib import Path
from typing import Self
from urllib.parse import unquote, urlsplit

from tests.services_base import HOST, ServiceError, _Server, find_binary, log_tail

MYSQL_URL_ENV = "GATEWAY_TEST_MYSQL_URL"
_AS_ROOT = ["--user=root"] if os.geteuid() == 0 else []  # else mariadbd refuses to run as root


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
