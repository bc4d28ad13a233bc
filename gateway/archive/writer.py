"""Writing records to the database: batches, idempotent upserts, poison set aside.

A batch is one transaction. When it fails, the writer first asks whether the
database takes writes at all (a *probe*: create missing tables, insert a
dead-letter row, roll back). If not — the database is down, read-only, out of
disk — the batch waits and is tried again with backoff, as long as it takes:
nothing is dropped for a fault of the database. If the probe passes, the
batch itself is at fault: it is split in halves until the records the
database refuses are alone, and each of those, refused ``poison_attempts``
times in a row, is moved to the dead-letter table with the database's reason.
The other records are written, so one bad record never blocks the rest, and
none is retried forever.

Error classes cannot tell these cases apart (asyncmy reports a violated CHECK
and an unknown server error as ``OperationalError``, like a refused
connection), which is why the probe decides. Connection drops and timeouts
are always waited out, never counted against a record.
"""

from __future__ import annotations

import asyncio
import logging
import os
import random
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa
from sqlalchemy import event
from sqlalchemy.engine import make_url
from sqlalchemy.exc import DBAPIError, DisconnectionError, InterfaceError
from sqlalchemy.exc import TimeoutError as PoolTimeout
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

from gateway.archive.record import ArchiveRecord, BadRecord, decode_record
from gateway.archive.schema import (
    TURN_COLUMNS,
    DriverInsert,
    build_tables,
    count_rows,
    dead_row,
    rows_of,
    upsert,
)
from gateway.archive.settings import ArchiveConfig
from gateway.archive.stats import ArchiveCounters, LagRecorder
from gateway.archive.tasks import reraise_if_cancelled

log = logging.getLogger("gateway.archive")
_STRICT = ("SET SESSION sql_mode = CONCAT_WS(',', NULLIF(@@SESSION.sql_mode, ''), "
           "'STRICT_ALL_TABLES')")
"""A value too long for its column is refused, never silently truncated."""
_PROBE_DIGEST = "probe"


@dataclass(frozen=True, slots=True)
class Pending:
    """A record to write, as it came from the outbox or the local queue."""

    raw: bytes
    record: ArchiveRecord | None
    """None when ``raw`` is not a record this gateway can read (see ``error``)."""
    error: str | None = None


def pending_of(raw: bytes) -> Pending:
    try:
        return Pending(raw, decode_record(raw))
    except BadRecord as exc:
        return Pending(raw, None, str(exc))


class Pacer:
    """At most ``rate`` records per second over all the writer's callers (0: no limit)."""

    def __init__(self, rate: int) -> None:
        self._rate = rate
        self._next = 0.0

    async def take(self, records: int) -> None:
        """Wait for this many records' share of the rate (a bounded sleep)."""
        if not self._rate:
            return
        now = time.monotonic()
        start = max(now, self._next)
        self._next = start + records / self._rate
        if start > now:
            await asyncio.sleep(start - now)


class _NotWritable(Exception):
    """The database does not take writes now: wait and try again."""


def build_engine(config: ArchiveConfig, pool_size: int) -> AsyncEngine:
    """An engine for ``config.url`` (nothing is connected yet)."""
    url = make_url(config.url)
    if config.password_env:
        url = url.set(password=os.environ.get(config.password_env, ""))
    timeout = config.write_timeout_ms / 1000
    if config.dialect == "sqlite":
        engine = create_async_engine(url, connect_args={"timeout": timeout})
        event.listen(engine.sync_engine, "connect", _sqlite_pragmas)
        return engine
    # client_flag 0: without FOUND_ROWS, a skipped duplicate counts 0 in rowcount.
    connect_args = {"client_flag": 0, "init_command": _STRICT,
                    "connect_timeout": max(1, round(config.connect_timeout_ms / 1000))}
    return create_async_engine(url, pool_size=pool_size, max_overflow=2, pool_pre_ping=True,
                               pool_recycle=3600, pool_timeout=timeout,
                               connect_args=connect_args)


def _sqlite_pragmas(connection: Any, _record: Any) -> None:
    """WAL: readers (analytics) do not block the writer, commits cost one write."""
    cursor = connection.cursor()
    cursor.execute("PRAGMA journal_mode=WAL")
    cursor.execute("PRAGMA synchronous=NORMAL")
    cursor.close()


_BUSY_ERRNOS = frozenset({1205, 1213})
"""MySQL lock wait timeout and deadlock: contention, not the record's fault."""


def _waitable(exc: BaseException) -> bool:
    """Faults of the connection or of contention, never of a record: waited out."""
    if isinstance(exc, DBAPIError):
        if exc.connection_invalidated:
            return True
        args = getattr(exc.orig, "args", ())
        if args and args[0] in _BUSY_ERRNOS:
            return True
        if "database is locked" in str(exc.orig):  # SQLite: another writer holds it
            return True
    return isinstance(exc, TimeoutError | OSError | DisconnectionError | InterfaceError
                      | PoolTimeout)


Keepalive = Callable[[], Awaitable[None]]


class ArchiveWriter:
    """Writes batches of records; shared by every reader task of one gateway."""

    def __init__(self, config: ArchiveConfig, counters: ArchiveCounters, lag: LagRecorder,
                 pool_size: int) -> None:
        self._config = config
        self._counters = counters
        self._lag = lag
        self._engine = build_engine(config, pool_size)
        self._metadata, self._turns, self._dead = build_tables(config)
        self._insert_turns = DriverInsert(upsert(self._turns, config.dialect),
                                          self._engine.dialect, TURN_COLUMNS)
        self._insert_dead = upsert(self._dead, config.dialect)
        self._timeout = config.write_timeout_ms / 1000
        self._failures = 0
        self._pacer = Pacer(config.max_records_per_second)

    @property
    def engine(self) -> AsyncEngine:
        return self._engine

    async def start(self) -> None:
        """Create the tables when missing; a database that is down is only logged."""
        try:
            await self.ensure_schema()
        except Exception as exc:  # the readers wait for it with backoff
            reraise_if_cancelled()
            self._counters.database_down = True
            log.warning("archive database %s unavailable at start: %r", self._config.safe_url,
                        exc)

    async def ensure_schema(self) -> None:
        async with asyncio.timeout(self._timeout), self._engine.begin() as conn:
            await conn.run_sync(self._metadata.create_all, checkfirst=True)

    async def close(self) -> None:
        await self._engine.dispose()

    async def write(self, items: Sequence[Pending], keepalive: Keepalive | None = None) -> None:
        """Write every item (rows, or a dead letter); waits while the database cannot.

        ``keepalive`` runs before each wait (the outbox uses it to keep the
        records claimed). Returns once all are written; cancel it to give up.
        """
        await self._pacer.take(len(items))
        pending = list(items)
        while pending:
            pending = await self._attempt(pending)
            if not pending:
                break
            self._failures += 1
            if not self._counters.database_down:
                log.warning("archive database %s does not take writes: %d records wait",
                            self._config.safe_url, len(pending))
            self._counters.database_down = True
            if keepalive is not None:
                await keepalive()
            await asyncio.sleep(self._backoff())
        if self._counters.database_down:
            log.info("archive database %s takes writes again", self._config.safe_url)
        self._counters.database_down = False
        self._failures = 0

    async def _attempt(self, items: list[Pending]) -> list[Pending]:
        """Write what can be written now; return what must wait for the database."""
        stack: list[list[Pending]] = []
        for item in items:
            if item.record is None:
                stack.append([item])
        good = [item for item in items if item.record is not None]
        if good:
            stack.append(good)
        refusals: dict[int, int] = {}
        while stack:
            chunk = stack.pop()
            try:
                await self._write_chunk(chunk)
                continue
            except _NotWritable:
                return [item for rest in stack for item in rest] + chunk
            except Exception as exc:
                reraise_if_cancelled()
                self._counters.write_failures += 1
                if _waitable(exc) or not await self._writable():
                    return [item for rest in stack for item in rest] + chunk
                failure = exc
            if len(chunk) > 1:
                half = len(chunk) // 2
                stack += [chunk[half:], chunk[:half]]
                continue
            refusals[id(chunk[0])] = refusals.get(id(chunk[0]), 0) + 1
            if refusals[id(chunk[0])] < self._config.poison_attempts:
                stack.append(chunk)
            elif not await self._dead_letter(chunk[0], _reason(failure)):
                return [item for rest in stack for item in rest] + chunk
        return []

    async def _write_chunk(self, chunk: list[Pending]) -> None:
        """One transaction; an undecodable record goes straight to the dead letters."""
        if chunk[0].record is None:
            if not await self._dead_letter(chunk[0], f"undecodable record: {chunk[0].error}"):
                raise _NotWritable
            return
        records = [item.record for item in chunk if item.record is not None]
        now_ms = int(time.time() * 1000)
        rows = [row for record in records for row in rows_of(record, now_ms)]
        async with asyncio.timeout(self._timeout), self._engine.begin() as conn:
            result = await conn.exec_driver_sql(self._insert_turns.sql(conn.dialect), rows)
        inserted = max(0, min(len(rows), result.rowcount))
        counters = self._counters
        counters.records_written += len(records)
        counters.batches_written += 1
        counters.rows_inserted += inserted
        counters.duplicate_rows += count_rows(records) - inserted
        self._lag.committed(records)

    async def _dead_letter(self, item: Pending, reason: str) -> bool:
        """Move a refused record aside; False when the database does not take writes."""
        row = dead_row(item.raw, item.record, reason)
        try:
            async with asyncio.timeout(self._timeout), self._engine.begin() as conn:
                await conn.execute(self._insert_dead, [row])
        except Exception as exc:
            reraise_if_cancelled()
            if _waitable(exc) or not await self._writable():
                return False
            self._counters.dead_letter_failures += 1
            log.error("archive: a refused record could not be moved aside either, dropped "
                      "(%s): %s; then %r", _identity(item), reason, exc)
            return True
        self._counters.dead_letters += 1
        log.error("archive: record %s moved to %s: %s", _identity(item),
                  self._config.dead_letter_table, reason)
        return True

    async def _writable(self) -> bool:
        """Whether the database takes a write now: tables created, a probe rolled back."""
        probe = dead_row(b"", None, "probe") | {"digest": _PROBE_DIGEST}
        try:
            await self.ensure_schema()
            async with asyncio.timeout(self._timeout), self._engine.connect() as conn:
                transaction = await conn.begin()
                await conn.execute(self._insert_dead, [probe])
                await transaction.rollback()
        except Exception as exc:
            reraise_if_cancelled()
            log.debug("archive database probe failed: %r", exc)
            return False
        return True

    def _backoff(self) -> float:
        """Capped exponential backoff with full jitter, in seconds."""
        initial = self._config.backoff_initial_ms / 1000
        cap = self._config.backoff_max_ms / 1000
        return random.uniform(initial / 2, min(cap, initial * 2 ** min(self._failures, 30)))


def _reason(exc: BaseException) -> str:
    """The database's own message (without SQLAlchemy's statement dump)."""
    original = getattr(exc, "orig", None)
    return f"{type(original or exc).__name__}: {original or exc}"[:2000]


def _identity(item: Pending) -> str:
    record = item.record
    if record is None:
        return f"<{len(item.raw)} undecodable bytes>"
    return f"{record.tenant}/{record.session_id}/{record.request_id}"


async def count_archived(engine: AsyncEngine, table: sa.Table) -> int:
    """Rows in ``table``; for tests, the benchmark and tools."""
    async with engine.connect() as conn:
        return int(await conn.scalar(sa.select(sa.func.count()).select_from(table)) or 0)
