"""The ``[archive]`` configuration table, typed and checked.

Every key is read through :class:`gateway.configreader.Table`, so an error
names the file and the key path (``config.toml: archive.batch_size: expected
an integer >= 1, got 0``). The URL is parsed here without SQLAlchemy, so
loading a configuration stays cheap; its driver must be an asyncio one.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from urllib.parse import urlsplit, urlunsplit

from gateway.configreader import Table

DIALECTS = ("mysql", "tidb", "sqlite")
_DRIVERS = {"mysql+asyncmy": "mysql", "mariadb+asyncmy": "mysql", "sqlite+aiosqlite": "sqlite"}
_TABLE_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,47}$")


@dataclass(frozen=True, slots=True)
class ArchiveConfig:
    """Where and how session turns are archived; see config.toml for every key."""

    enabled: bool = True
    url: str = "sqlite+aiosqlite:///gateway-archive.db"
    """SQLAlchemy URL with an asyncio driver: ``mysql+asyncmy://user@host:4000/db``
    (TiDB, MySQL, MariaDB) or ``sqlite+aiosqlite:///path.db``. No password here:
    see ``password_env``."""
    dialect: str = "sqlite"
    """``mysql``, ``tidb`` (MySQL protocol plus TiDB's anti-hotspot DDL) or ``sqlite``;
    derived from the URL unless set."""
    password_env: str | None = None
    """Environment variable holding the database password (secrets stay out of files)."""
    table: str = "archive_turns"
    """The rows table; poison records go to ``{table}_dead_letters``."""
    batch_size: int = 500
    """Records (turns) written per transaction at most."""
    poll_interval_ms: int = 100
    """How long a reader waits on an empty outbox before it looks again (the BLOCK of
    XREADGROUP)."""
    batch_wait_ms: int = 100
    """After a read that brought less than half a ``batch_size``, how long a reader
    waits for more records before it writes them. Each transaction and its
    acknowledgement have a fixed CPU cost in the gateway's process: without the wait,
    at a steady turn rate the readers write a record or two at a time. The wait adds
    at most this much to the lag (target: p99 under 800 ms); a backlog is written
    in full batches, without it; 0 writes what each read brings at once. At most
    half of ``claim_idle_ms``: the records read wait pending."""
    workers: int = 2
    """Reader-writer tasks per Redis server (or for the local queue) in each gateway."""
    outbox_max_records: int = 500_000
    """Records the Redis outbox may hold over all buckets (each bucket its share);
    a session write that finds its bucket full is still made, its record is refused
    and counted. At 1,000 turns/s the default holds about 8 minutes of outage."""
    local_queue_max: int = 100_000
    """Records the in-process queue (``memory`` store) may hold; more are refused."""
    consumer_group: str = "archive"
    claim_idle_ms: int = 30_000
    """A record another consumer read and has not acknowledged for this long is
    claimed (XAUTOCLAIM): its gateway died or lost Redis."""
    claim_interval_ms: int = 5_000
    """How often each reader looks for such records."""
    poison_attempts: int = 3
    """Times a single record is tried while the database answers, before it is
    moved to the dead-letter table."""
    redis_timeout_ms: int = 1_000
    """Budget of one outbox call to Redis (reads block for ``poll_interval_ms`` on top)."""
    write_timeout_ms: int = 10_000
    """Budget of one database transaction."""
    connect_timeout_ms: int = 3_000
    backoff_initial_ms: int = 100
    """First wait after the database or Redis failed; doubles up to ``backoff_max_ms``."""
    backoff_max_ms: int = 5_000
    max_records_per_second: int = 0
    """Records this gateway writes per second at most (0: no limit). The archive runs
    in the gateway's process: after an outage it drains the backlog as fast as the
    database takes it, and that CPU is taken from requests. A cap above the normal
    rate (turns/s per gateway) still catches up, and leaves requests their share."""
    degraded_backlog: int = 10_000
    """Records waiting beyond which the archive reports itself degraded."""
    close_timeout_ms: int = 5_000
    """How long ``close()`` keeps writing what this gateway holds before it stops."""

    @property
    def dead_letter_table(self) -> str:
        return f"{self.table}_dead_letters"

    @property
    def safe_url(self) -> str:
        """The URL with any password masked, for logs and the admin API."""
        return redact(self.url)


def parse_archive(table: Table) -> ArchiveConfig:
    """Read the ``[archive]`` table (an empty table gives the defaults)."""
    d = ArchiveConfig()
    url = table.string("url", d.url)
    derived = _dialect_of(table, url)
    dialect = table.string("dialect", derived, choices=DIALECTS)
    if (dialect == "sqlite") != (derived == "sqlite"):
        raise table.error("dialect", f'a dialect matching the URL ("{derived}"'
                          + (' or "tidb")' if derived == "mysql" else ")"), dialect)
    config = ArchiveConfig(
        enabled=table.boolean("enabled", d.enabled), url=url, dialect=dialect,
        password_env=table.env_name("password_env"),
        table=_table_name(table),
        batch_size=table.integer("batch_size", d.batch_size, minimum=1, maximum=10_000),
        poll_interval_ms=table.integer("poll_interval_ms", d.poll_interval_ms, minimum=1,
                                       maximum=10_000),
        batch_wait_ms=table.integer("batch_wait_ms", d.batch_wait_ms, minimum=0,
                                    maximum=1_000),
        workers=table.integer("workers", d.workers, minimum=1, maximum=64),
        outbox_max_records=table.integer("outbox_max_records", d.outbox_max_records,
                                         minimum=1),
        local_queue_max=table.integer("local_queue_max", d.local_queue_max, minimum=1),
        consumer_group=table.string("consumer_group", d.consumer_group),
        claim_idle_ms=table.integer("claim_idle_ms", d.claim_idle_ms, minimum=100),
        claim_interval_ms=table.integer("claim_interval_ms", d.claim_interval_ms, minimum=10),
        poison_attempts=table.integer("poison_attempts", d.poison_attempts, minimum=1,
                                      maximum=100),
        redis_timeout_ms=table.integer("redis_timeout_ms", d.redis_timeout_ms, minimum=1),
        write_timeout_ms=table.integer("write_timeout_ms", d.write_timeout_ms, minimum=1),
        connect_timeout_ms=table.integer("connect_timeout_ms", d.connect_timeout_ms,
                                         minimum=1),
        backoff_initial_ms=table.integer("backoff_initial_ms", d.backoff_initial_ms,
                                         minimum=1),
        backoff_max_ms=table.integer("backoff_max_ms", d.backoff_max_ms, minimum=1),
        max_records_per_second=table.integer("max_records_per_second",
                                             d.max_records_per_second, minimum=0),
        degraded_backlog=table.integer("degraded_backlog", d.degraded_backlog, minimum=1),
        close_timeout_ms=table.integer("close_timeout_ms", d.close_timeout_ms, minimum=0),
    )
    _check(table, config)
    table.finish()
    return config


def _dialect_of(table: Table, url: str) -> str:
    parts = urlsplit(url)
    dialect = _DRIVERS.get(parts.scheme)
    expected = "a URL with an asyncio driver: " + ", ".join(f"{d}://..." for d in _DRIVERS)
    if dialect is None:
        raise table.error("url", expected, redact(url))
    if dialect == "mysql" and (not parts.hostname or not parts.path.strip("/")):
        raise table.error("url", "a mysql+asyncmy://user@host:port/database URL",
                          redact(url))
    if dialect == "sqlite" and not parts.path.strip("/"):
        raise table.error("url", "a sqlite+aiosqlite:///path/to/file.db URL (a file: an "
                          "in-memory database is not shared between connections)", url)
    return dialect


def _table_name(table: Table) -> str:
    name = table.string("table", ArchiveConfig().table)
    if not _TABLE_NAME.match(name):
        raise table.error("table", "a table name of letters, digits and _ (at most 48)", name)
    return name


def _check(table: Table, config: ArchiveConfig) -> None:
    if config.backoff_max_ms < config.backoff_initial_ms:
        raise table.error("backoff_max_ms", f">= backoff_initial_ms "
                          f"({config.backoff_initial_ms})", config.backoff_max_ms)
    if config.claim_interval_ms > config.claim_idle_ms:
        raise table.error("claim_interval_ms", f"<= claim_idle_ms ({config.claim_idle_ms})",
                          config.claim_interval_ms)
    if config.batch_wait_ms * 2 > config.claim_idle_ms:  # read records stay pending
        raise table.error("batch_wait_ms", f"<= half of claim_idle_ms "
                          f"({config.claim_idle_ms})", config.batch_wait_ms)
    if urlsplit(config.url).password and config.password_env:
        raise table.error("password_env", "no password in the URL as well", "both")


def redact(url: str) -> str:
    """``url`` with its password replaced by ``***``."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    host = parts.netloc.rpartition("@")[2]
    user = parts.username or ""
    return urlunsplit(parts._replace(netloc=f"{user}:***@{host}"))
