"""The archive's tables, the rows of a record, and the idempotent insert.

``{table}``: one row per message of a turn. Its primary key is the turn's
identity, ``(tenant, session_id, request_id, msg_index)``, not an
auto-increment: a replayed record hits the same key and is skipped, so the
archive is idempotent however often the outbox delivers. The request id (the
turn id that makes session appends idempotent) is in the key rather than the
turn number, because a session that expired or was deleted and is then
started again under the same id counts its turns from 1 again: its turns are
new rows, not duplicates of the old ones. ``turn_seq`` orders a session's rows.

Id columns are ASCII with a binary collation: ids are case-sensitive in
Redis (``Chat-1`` is not ``chat-1``), and MySQL's default collation is not.

On TiDB (``dialect = "tidb"``) the primary key is NONCLUSTERED and rows get
``SHARD_ROW_ID_BITS``/``PRE_SPLIT_REGIONS``, which scatter the hidden row id
over regions instead of appending to one hot region. ``AUTO_RANDOM`` would
need a surrogate BIGINT key, and the natural key is what makes replays
idempotent.

Token usage is on the turn's last row (the reply) only, so that ``SUM()``
counts each turn once; model, backend and timestamps are on every row.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Sequence
from typing import Any

import orjson
import sqlalchemy as sa
from sqlalchemy.dialects import mysql, sqlite
from sqlalchemy.ext.compiler import compiles
from sqlalchemy.sql.dml import Insert

from gateway.archive.record import ArchiveRecord
from gateway.archive.settings import ArchiveConfig

ROLE_MAX = 32
DEAD_RECORD_MAX_BYTES = 1 << 20
"""A dead letter keeps at most this much of the record (and its full size)."""
_TIDB_OPTIONS = {"mysql_SHARD_ROW_ID_BITS": "4", "mysql_PRE_SPLIT_REGIONS": "3"}
NONCLUSTERED = "tidb_nonclustered"
"""``info`` flag of a primary key that TiDB must not cluster the table by."""


@compiles(sa.PrimaryKeyConstraint, "mysql")
def _primary_key(constraint: sa.PrimaryKeyConstraint, compiler: Any, **kw: Any) -> str:
    """SQLAlchemy has no NONCLUSTERED option: add TiDB's keyword to the clause."""
    text: str = compiler.visit_primary_key_constraint(constraint, **kw)
    return f"{text} NONCLUSTERED" if constraint.info.get(NONCLUSTERED) and text else text


def _ident(length: int) -> sa.types.TypeEngine[Any]:
    """Type of an id column: ASCII, binary (case-sensitive) collation on MySQL."""
    return sa.String(length).with_variant(
        mysql.VARCHAR(length, charset="ascii", collation="ascii_bin"), "mysql", "mariadb")


def _text() -> sa.types.TypeEngine[Any]:
    return sa.Text().with_variant(mysql.MEDIUMTEXT(), "mysql", "mariadb")


def build_tables(config: ArchiveConfig) -> tuple[sa.MetaData, sa.Table, sa.Table]:
    """The rows table and the dead-letter table for ``config``'s names and dialect."""
    metadata = sa.MetaData()
    tidb = config.dialect == "tidb"
    options = _TIDB_OPTIONS if tidb else {}
    turns = sa.Table(
        config.table, metadata,
        sa.Column("tenant", _ident(64), nullable=False),
        sa.Column("session_id", _ident(128), nullable=False),
        sa.Column("request_id", _ident(128), nullable=False),
        sa.Column("msg_index", sa.Integer, nullable=False),
        sa.Column("turn_seq", sa.Integer, nullable=False),
        sa.Column("role", sa.String(ROLE_MAX), nullable=False),
        sa.Column("content", _text()),
        sa.Column("extra", _text()),
        sa.Column("model", sa.String(128)),
        sa.Column("backend", sa.String(128)),
        sa.Column("prompt_tokens", sa.Integer),
        sa.Column("completion_tokens", sa.Integer),
        sa.Column("total_tokens", sa.Integer),
        sa.Column("started_ms", sa.BigInteger),
        sa.Column("turn_ts_ms", sa.BigInteger, nullable=False),
        sa.Column("archived_ts_ms", sa.BigInteger, nullable=False),
        sa.PrimaryKeyConstraint("tenant", "session_id", "request_id", "msg_index",
                                info={NONCLUSTERED: tidb}),
        # SQLite does not enforce VARCHAR lengths: with this it refuses the same rows.
        sa.CheckConstraint(f"length(role) <= {ROLE_MAX}",
                           name=f"{config.table}_role_len").ddl_if(dialect="sqlite"),
        # An index on a time column is a write hotspot on TiDB: none there.
        *(() if tidb else (sa.Index(f"{config.table}_by_turn_ts", "turn_ts_ms"),)),
        **options)
    dead = sa.Table(
        config.dead_letter_table, metadata,
        sa.Column("digest", _ident(64), primary_key=True),
        sa.Column("tenant", _ident(64)),
        sa.Column("session_id", _ident(128)),
        sa.Column("request_id", _ident(128)),
        sa.Column("reason", sa.Text, nullable=False),
        sa.Column("record", sa.LargeBinary().with_variant(mysql.MEDIUMBLOB(), "mysql",
                                                          "mariadb"), nullable=False),
        sa.Column("record_bytes", sa.Integer, nullable=False),
        sa.Column("failed_ts_ms", sa.BigInteger, nullable=False))  # digest keys scatter
    return metadata, turns, dead


TURN_COLUMNS = ("tenant", "session_id", "request_id", "msg_index", "turn_seq", "role",
                "content", "extra", "model", "backend", "prompt_tokens",
                "completion_tokens", "total_tokens", "started_ms", "turn_ts_ms",
                "archived_ts_ms")
"""The rows table's columns, in the order of :func:`rows_of`'s values."""


def rows_of(record: ArchiveRecord, archived_ms: int) -> list[tuple[Any, ...]]:
    """One row per message, values in :data:`TURN_COLUMNS` order; token usage on the
    last (the reply). Tuples, not dicts: the writer hands them to the driver as they
    are (see :class:`DriverInsert`)."""
    rows = []
    last = len(record.messages) - 1
    for index, message in enumerate(record.messages):
        content = message.get("content")
        extra = {k: v for k, v in message.items() if k not in ("role", "content")}
        reply = index == last
        rows.append((
            record.tenant, record.session_id, record.request_id, index, record.turn_seq,
            message["role"],
            content if content is None or isinstance(content, str)
            else orjson.dumps(content).decode(),
            orjson.dumps(extra).decode() if extra else None,
            record.model, record.backend,
            record.prompt_tokens if reply else None,
            record.completion_tokens if reply else None,
            record.total_tokens if reply else None,
            record.started_ms, record.ts_ms, archived_ms))
    return rows


def dead_row(raw: bytes, record: ArchiveRecord | None, reason: str) -> dict[str, Any]:
    """The dead-letter row of a refused record (keyed by its bytes: replays hit it)."""
    return {
        "digest": hashlib.sha256(raw).hexdigest(),
        "tenant": _ascii(record.tenant, 64) if record else None,
        "session_id": _ascii(record.session_id, 128) if record else None,
        "request_id": _ascii(record.request_id, 128) if record else None,
        "reason": reason[:2000], "record": raw[:DEAD_RECORD_MAX_BYTES],
        "record_bytes": len(raw), "failed_ts_ms": int(time.time() * 1000)}


def _ascii(value: str, length: int) -> str:
    """An id as its column takes it: a refused record's ids may be anything."""
    return value.encode("ascii", "replace").decode()[:length]


def upsert(table: sa.Table, dialect: str) -> Insert:
    """INSERT that skips rows whose key exists, without hiding any other error.

    MySQL's INSERT IGNORE would also turn a value too long for its column into a
    truncation warning: a no-op ON DUPLICATE KEY UPDATE skips duplicates only.
    With the FOUND_ROWS flag off (see the writer), its rowcount is the number of
    rows inserted, so duplicates can be counted.
    """
    if dialect == "sqlite":
        return sqlite.insert(table).on_conflict_do_nothing()
    statement = mysql.insert(table)
    first = table.primary_key.columns.values()[0].name
    return statement.on_duplicate_key_update({first: statement.inserted[first]})


class DriverInsert:
    """An upsert compiled once to the driver's SQL, for rows given as tuples.

    ``Connection.execute(insert, [dict, ...])`` builds every row's parameters
    through the compiled statement (``construct_params``): about 15 µs of the
    gateway's CPU per row, the largest part of the archive's cost at a steady
    rate. ``exec_driver_sql`` hands the tuples to the DBAPI ``executemany``
    unchanged; the columns' types have no bind processing (strings, integers,
    None), so the driver receives the same values. Same SQL, same transaction,
    same error wrapping (``DBAPIError``), same ``rowcount``.
    """

    def __init__(self, statement: Insert, dialect: sa.engine.Dialect,
                 columns: Sequence[str]) -> None:
        self._statement = statement
        self._columns = list(columns)
        self._sql: str | None = None
        self._compile(dialect)  # checked at once: a mismatch would misfile every value

    def sql(self, dialect: sa.engine.Dialect) -> str:
        """The SQL for a *connected* engine's dialect (compiled at the first call: the
        server version, known once connected, can change the rendering, e.g. the
        ON DUPLICATE KEY UPDATE form of MySQL 8.0.20+)."""
        if self._sql is None:
            self._sql = self._compile(dialect)
        return self._sql

    def _compile(self, dialect: sa.engine.Dialect) -> str:
        compiled = self._statement.compile(dialect=dialect)
        if list(compiled.positiontup or ()) != self._columns:
            raise ValueError(f"insert parameters {compiled.positiontup} are not "
                             f"{self._columns}")
        return str(compiled)


def count_rows(records: Sequence[ArchiveRecord]) -> int:
    return sum(len(record.messages) for record in records)
