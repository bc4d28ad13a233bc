"""The [archive] table, the record format, and the DDL each dialect gets."""

from __future__ import annotations

import tomllib
from dataclasses import replace

import pytest
from sqlalchemy.dialects import mysql, sqlite
from sqlalchemy.schema import CreateTable

from gateway.archive.record import BadRecord, OutboxPolicy, decode_record, encode_record
from gateway.archive.schema import TURN_COLUMNS, DriverInsert, build_tables, upsert
from gateway.archive.settings import ArchiveConfig, parse_archive
from gateway.configreader import ConfigError, Table
from gateway.sessions.keys import KeyScheme
from gateway.sessions.state import SessionState, Turn, TurnMeta


def parse(text: str) -> ArchiveConfig:
    return parse_archive(Table("test.toml", "archive", tomllib.loads(text)))


def test_an_empty_table_gives_the_embedded_sqlite_default() -> None:
    config = parse("")
    assert config == ArchiveConfig()
    assert (config.enabled, config.url, config.dialect) == (
        True, "sqlite+aiosqlite:///gateway-archive.db", "sqlite")
    assert config.dead_letter_table == "archive_turns_dead_letters"
    assert (config.batch_size, config.batch_wait_ms) == (500, 100)
    assert parse("batch_wait_ms = 0").batch_wait_ms == 0


def test_the_turn_insert_takes_rows_in_column_order() -> None:
    # the writer hands rows_of()'s tuples to the driver: their order must be the SQL's
    config = ArchiveConfig()
    _, turns, _ = build_tables(config)
    statement = upsert(turns, config.dialect)
    sql = DriverInsert(statement, sqlite.dialect(), TURN_COLUMNS).sql(
        sqlite.dialect())
    assert sql.startswith("INSERT INTO archive_turns (tenant, session_id, request_id, ")
    assert [c.name for c in turns.columns] == list(TURN_COLUMNS)
    with pytest.raises(ValueError, match="insert parameters"):
        DriverInsert(statement, sqlite.dialect(), TURN_COLUMNS[::-1])


def test_the_dialect_follows_the_url_and_tidb_is_chosen_explicitly() -> None:
    assert parse('url = "mysql+asyncmy://gw@db:3306/gateway"').dialect == "mysql"
    assert parse('url = "mariadb+asyncmy://gw@db/gateway"').dialect == "mysql"
    tidb = parse('url = "mysql+asyncmy://gw@tidb:4000/gateway"\ndialect = "tidb"\n'
                 'password_env = "ARCHIVE_DB_PASSWORD"\nbatch_size = 200\nworkers = 4\n'
                 "max_records_per_second = 3000\noutbox_max_records = 1000")
    assert (tidb.dialect, tidb.password_env, tidb.batch_size, tidb.workers) == (
        "tidb", "ARCHIVE_DB_PASSWORD", 200, 4)
    assert (tidb.max_records_per_second, tidb.outbox_max_records) == (3000, 1000)


def test_a_password_is_never_shown() -> None:
    config = parse('url = "mysql+asyncmy://gw:s3cret@db:3306/gateway"')
    assert "s3cret" not in config.safe_url and config.safe_url.startswith("mysql+asyncmy://gw:***@db")


@pytest.mark.parametrize("text,message", [
    ('url = "postgresql://x/y"', "archive.url: expected a URL with an asyncio driver"),
    ('url = "mysql+pymysql://x/y"', "archive.url: expected a URL with an asyncio driver"),
    ('url = "mysql+asyncmy://db"', "archive.url: expected a mysql+asyncmy://user@host:port/"),
    ('url = "sqlite+aiosqlite://"', "archive.url: expected a sqlite+aiosqlite:///path"),
    ('dialect = "tidb"', 'archive.dialect: expected a dialect matching the URL ("sqlite")'),
    ('url = "mysql+asyncmy://x/y"\ndialect = "sqlite"',
     'archive.dialect: expected a dialect matching the URL ("mysql" or "tidb")'),
    ('dialect = "oracle"', 'archive.dialect: expected one of "mysql", "tidb", "sqlite"'),
    ("batch_size = 0", "archive.batch_size: expected an integer >= 1 and <= 10000"),
    ("batch_wait_ms = 1001", "archive.batch_wait_ms: expected an integer >= 0 and <= 1000"),
    ("claim_idle_ms = 200\nclaim_interval_ms = 100\nbatch_wait_ms = 101",
     "archive.batch_wait_ms: expected <= half of claim_idle_ms (200)"),
    ('table = "drop table;"', "archive.table: expected a table name"),
    ('password_env = "not a name"', "archive.password_env: expected the name of an env"),
    ('url = "mysql+asyncmy://u:p@x/y"\npassword_env = "P"',
     "archive.password_env: expected no password in the URL as well"),
    ("claim_idle_ms = 1000\nclaim_interval_ms = 2000",
     "archive.claim_interval_ms: expected <= claim_idle_ms (1000)"),
    ("backoff_initial_ms = 100\nbackoff_max_ms = 50",
     "archive.backoff_max_ms: expected >= backoff_initial_ms (100)"),
    ("enabled = 1", "archive.enabled: expected true or false"),
    ("batchsize = 3", "archive.batchsize: unknown key"),
])
def test_errors_name_the_file_and_key_path(text: str, message: str) -> None:
    with pytest.raises(ConfigError) as error:
        parse(text)
    assert str(error.value).startswith(f"test.toml: {message}"), str(error.value)


def test_a_record_carries_the_turn_its_number_and_its_meta() -> None:
    keys = KeyScheme(buckets=4)
    key = keys.key("acme", "chat-1")
    turn = Turn("req-1", ({"role": "user", "content": "hi"}, {"role": "assistant",
                                                              "content": "hello"}),
                {"role": "system", "content": "be brief"}, 1_700_000_000_000,
                TurnMeta.of("m", "b", {"prompt_tokens": 3, "completion_tokens": 2,
                                       "total_tokens": True}))
    state = SessionState("acme", "chat-1", turns=7)
    policy = OutboxPolicy(keys, max_records=10, local=lambda raw: True, on_refused=lambda: None)
    entry = policy.entry(key, state, turn)
    assert entry.stream == keys.outbox_key(key.bucket) and entry.max_len == 3  # 10 / 4 buckets
    record = decode_record(entry.record)
    assert (record.tenant, record.session_id, record.request_id, record.turn_seq) == (
        "acme", "chat-1", "req-1", 7)
    assert [m["role"] for m in record.messages] == ["system", "user", "assistant"]
    assert (record.model, record.backend, record.prompt_tokens, record.completion_tokens,
            record.total_tokens) == ("m", "b", 3, 2, None)  # a bool is not a count
    assert decode_record(encode_record(record)) == record
    # whatever a backend put in its usage, the record stays readable
    odd = replace(turn, meta=TurnMeta("m", "b", "12", -1, 3.5))  # type: ignore[arg-type]
    record = decode_record(policy.entry(key, state, odd).record)
    assert (record.prompt_tokens, record.completion_tokens, record.total_tokens) == (
        None, None, None)


@pytest.mark.parametrize("raw", [b"not json", b"[]", b'{"v": 99}',
                                 b'{"v": 1, "tenant": "t", "messages": [{"content": 1}]}'])
def test_a_malformed_record_is_refused_with_a_reason(raw: bytes) -> None:
    with pytest.raises(BadRecord):
        decode_record(raw)


def test_tidb_gets_a_nonclustered_key_and_scattered_row_ids() -> None:
    _, turns, dead = build_tables(ArchiveConfig(url="mysql+asyncmy://x/y", dialect="tidb"))
    ddl = str(CreateTable(turns).compile(dialect=mysql.dialect()))
    assert "PRIMARY KEY (tenant, session_id, request_id, msg_index) NONCLUSTERED" in ddl
    assert "SHARD_ROW_ID_BITS=4" in ddl and "PRE_SPLIT_REGIONS=3" in ddl
    assert "AUTO_INCREMENT" not in ddl
    assert "ascii_bin" in ddl  # ids are case-sensitive, as in Redis
    assert "SHARD_ROW_ID_BITS" not in str(CreateTable(dead).compile(dialect=mysql.dialect()))
    _, turns, _ = build_tables(ArchiveConfig(url="mysql+asyncmy://x/y", dialect="mysql"))
    plain = str(CreateTable(turns).compile(dialect=mysql.dialect()))
    assert "NONCLUSTERED" not in plain and "SHARD_ROW_ID_BITS" not in plain
    _, turns, _ = build_tables(ArchiveConfig())
    assert "CHECK (length(role) <= 32)" in str(CreateTable(turns).compile(
        dialect=sqlite.dialect()))
