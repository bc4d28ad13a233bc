"""Helpers for the archive tests: configs, a running session + archive pair, rows.

No tests here. Everything is real: Redis servers, MariaDB (the ``mariadb``
fixture) or SQLite in a temp file, the session service writing turns, and
SQL reading the rows back. Each test gets tables of its own, so tests sharing
the MariaDB server cannot see each other's rows.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any

import sqlalchemy as sa

from gateway.archive.service import ArchiveService
from gateway.archive.settings import ArchiveConfig
from gateway.sessions.keys import KeyScheme
from gateway.sessions.service import SessionService
from gateway.sessions.settings import SessionsConfig
from gateway.sessions.state import TurnMeta
from tests.fixtures_sessions import completion, wait_until
from tests.services import MariaDBServer, redis_command

__all__ = ["wait_until"]
_tables = itertools.count()
MODEL, BACKEND = "sim-model", "sim-a"
ROW_COLUMNS = ("tenant", "session_id", "request_id", "msg_index", "turn_seq", "role",
               "content", "model", "backend", "completion_tokens")


def archive_config(url: str, **overrides: Any) -> ArchiveConfig:
    """Fast timings, and a table no other test uses."""
    dialect = "sqlite" if url.startswith("sqlite") else "mysql"
    base = ArchiveConfig(url=url, dialect=dialect, table=f"t{os.getpid()}_{next(_tables)}",
                         poll_interval_ms=20, claim_idle_ms=1_000, claim_interval_ms=100,
                         backoff_initial_ms=20, backoff_max_ms=300, redis_timeout_ms=500,
                         write_timeout_ms=5_000, connect_timeout_ms=1_000,
                         close_timeout_ms=3_000)
    return replace(base, **overrides)


def sqlite_url(tmp_path: Path) -> str:
    return f"sqlite+aiosqlite:///{tmp_path / 'archive.db'}"


def database_url(kind: str, tmp_path: Path, mariadb: MariaDBServer | None) -> str:
    if kind == "sqlite":
        return sqlite_url(tmp_path)
    assert mariadb is not None
    return mariadb.url


@asynccontextmanager
async def running(sessions: SessionsConfig, config: ArchiveConfig, *, start: bool = True,
                  metrics: Any = None) -> AsyncIterator[tuple[SessionService, ArchiveService]]:
    """A session service whose turns feed an archive; both closed in order at the end."""
    archive = ArchiveService(config, sessions, metrics)
    service = SessionService(sessions, outbox=archive.outbox_policy)
    await service.start()
    if start:
        await archive.start()
    try:
        yield service, archive
    finally:
        await service.close()
        await archive.close()


async def commit_turn(service: SessionService, session_id: str, n: int, *,
                      role: str = "user", tenant: str = "default") -> bool:
    """Question q<n>, answer a<n>, with model, backend and usage; degraded?"""
    body = {"model": MODEL, "messages": [{"role": role, "content": f"q{n}"}]}
    binding = await service.bind(tenant, session_id, body)
    binding.observe_json(completion(f"a{n}"))
    meta = TurnMeta.of(MODEL, BACKEND, {"prompt_tokens": 10 + n, "completion_tokens": n,
                                        "total_tokens": 10 + 2 * n})
    await binding.commit(request_id(session_id, n), meta=meta)
    return binding.degraded


def request_id(session_id: str, n: int) -> str:
    return f"req-{session_id}-{n}"


async def commit_turns(service: SessionService, sessions: Sequence[str],
                       turns: range) -> list[bool]:
    """Turn after turn on each session (a chat: one turn at a time per session)."""
    return [await commit_turn(service, session_id, n)
            for n in turns for session_id in sessions]


def expected_rows(sessions: Sequence[str], turns: range,
                  tenant: str = "default") -> list[tuple[Any, ...]]:
    """The rows those turns must leave, in :func:`archived_rows` order."""
    rows = []
    for session_id in sessions:
        for n in turns:
            rid = request_id(session_id, n)
            rows += [(tenant, session_id, rid, 0, n + 1, "user", f"q{n}", MODEL, BACKEND, None),
                     (tenant, session_id, rid, 1, n + 1, "assistant", f"a{n}", MODEL,
                      BACKEND, n)]
    return sorted(rows, key=_order)


def _order(row: tuple[Any, ...]) -> tuple[Any, ...]:
    return (row[0], row[1], row[4], row[3])


async def archived_rows(archive: ArchiveService) -> list[tuple[Any, ...]]:
    """Every row of the archive's table, read back with SQL."""
    table = archive.config.table
    columns = ", ".join(f"`{c}`" if c == "role" else c for c in ROW_COLUMNS)
    if archive.config.dialect == "sqlite":
        columns = columns.replace("`", '"')
    async with archive.writer.engine.connect() as conn:
        result = await conn.execute(sa.text(f"SELECT {columns} FROM {table}"))
        return sorted((tuple(row) for row in result), key=_order)


async def dead_letters(archive: ArchiveService) -> list[tuple[Any, ...]]:
    table = archive.config.dead_letter_table
    async with archive.writer.engine.connect() as conn:
        result = await conn.execute(sa.text(
            f"SELECT request_id, reason, record_bytes FROM {table} ORDER BY request_id"))
        return [tuple(row) for row in result]


def outbox_lengths(port: int, sessions: SessionsConfig) -> list[int]:
    """XLEN of every bucket's outbox stream on one standalone server."""
    keys = KeyScheme(sessions.prefix, sessions.buckets)
    return [int(redis_command(port, "XLEN", keys.outbox_key(bucket)))
            for bucket in range(sessions.buckets)]


def pending_count(port: int, sessions: SessionsConfig, group: str) -> int:
    """Records delivered to some reader and not acknowledged, over all buckets."""
    keys = KeyScheme(sessions.prefix, sessions.buckets)
    total = 0
    for bucket in range(sessions.buckets):
        try:
            summary = redis_command(port, "XPENDING", keys.outbox_key(bucket), group)
        except Exception:  # no stream or group yet: nothing pending there
            continue
        total += int(summary["pending"] if isinstance(summary, dict) else summary[0])
    return total
