"""The archive without Redis (``memory`` store): the local queue feeds the writer.

Against SQLite in a temp file and the real MariaDB: every turn becomes its
rows exactly once, a duplicate commit adds nothing, a record the database
refuses is moved aside with the reason, and a full queue refuses (and counts)
instead of growing.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from gateway.archive.record import ArchiveRecord, encode_record
from gateway.archive.writer import pending_of
from gateway.sessions.settings import SessionsConfig
from gateway.telemetry.metrics import GatewayMetrics
from tests.services import MariaDBServer
from tests.test_archive_support import (
    BACKEND,
    MODEL,
    archive_config,
    archived_rows,
    commit_turn,
    commit_turns,
    database_url,
    dead_letters,
    expected_rows,
    request_id,
    running,
    sqlite_url,
    wait_until,
)

MEMORY = SessionsConfig(store="memory")


@pytest.fixture(params=["sqlite", "mariadb"])
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    mariadb = request.getfixturevalue("mariadb") if request.param == "mariadb" else None
    return database_url(request.param, tmp_path, mariadb)


async def test_every_turn_becomes_its_rows_once(db_url: str) -> None:
    sessions, turns = [f"chat-{i}" for i in range(6)], range(5)
    metrics = GatewayMetrics()
    async with running(MEMORY, archive_config(db_url), metrics=metrics) as (service, archive):
        await commit_turns(service, sessions, turns)
        # the same request committed again (a retried commit) is not a new turn
        assert not await commit_turn(service, "chat-0", 4)
        await wait_until(lambda: archive.stats.records_written == 30, within=10,
                         what="30 turns archived")
        assert await archived_rows(archive) == expected_rows(sessions, turns)
        stats = archive.stats
        assert (stats.rows_inserted, stats.duplicate_rows, stats.dead_letters) == (60, 0, 0)
        assert stats.backlog == 0 and not archive.degraded
        assert stats.lag_p99_s is not None and stats.lag_p99_s < 1.0
    registry = metrics.registry
    assert registry.get_sample_value("gateway_archive_lag_seconds_count") == 30
    assert registry.get_sample_value("gateway_archive_backlog_records") == 0


async def test_case_sensitive_ids_are_different_sessions(db_url: str) -> None:
    async with running(MEMORY, archive_config(db_url)) as (service, archive):
        await commit_turns(service, ["Chat-X", "chat-x"], range(2))
        await wait_until(lambda: archive.stats.records_written == 4, within=10,
                         what="4 turns archived")
        assert await archived_rows(archive) == expected_rows(["Chat-X", "chat-x"], range(2))


async def test_a_refused_record_is_moved_aside_and_blocks_nothing(db_url: str) -> None:
    async with running(MEMORY, archive_config(db_url, poison_attempts=2)) as (service,
                                                                              archive):
        await commit_turns(service, ["ok"], range(3))
        await commit_turn(service, "bad", 0, role="r" * 40)  # longer than the role column
        await commit_turns(service, ["ok"], range(3, 6))
        await wait_until(lambda: archive.stats.records_written == 6
                         and archive.stats.dead_letters == 1, within=10,
                         what="6 turns archived, 1 moved aside")
        assert await archived_rows(archive) == expected_rows(["ok"], range(6))
        [(rid, reason, size)] = await dead_letters(archive)
        assert rid == request_id("bad", 0) and size > 0
        assert "Data too long" in reason or "CHECK constraint failed" in reason, reason


async def test_a_full_local_queue_refuses_and_counts(tmp_path: Path) -> None:
    config = archive_config(sqlite_url(tmp_path), local_queue_max=3)
    async with running(MEMORY, config, start=False) as (service, archive):
        degraded = await commit_turns(service, ["s"], range(5))
        assert degraded == [False] * 5  # the sessions took every turn
        assert (await service.describe("default", "s")).turns == 5
        assert archive.stats.overflowed == 2 and archive.backlog == 3
        await archive.start()
        await wait_until(lambda: archive.stats.records_written == 3, within=10,
                         what="the 3 queued turns archived")
        assert await archived_rows(archive) == expected_rows(["s"], range(3))


async def test_the_queue_is_written_out_on_close(tmp_path: Path,
                                                 mariadb: MariaDBServer) -> None:
    config = archive_config(mariadb.url)
    async with running(MEMORY, config) as (service, archive):
        await commit_turns(service, [f"c{i}" for i in range(20)], range(3))
    # closed: whatever was queued has been written before close() returned
    assert archive.stats.records_written == 60 and archive.backlog == 0
    rows = mariadb.query(f"SELECT COUNT(*), COUNT(DISTINCT request_id) FROM {config.table}")
    assert rows == "120\t60"


async def test_a_trickle_of_turns_is_gathered_into_one_transaction(tmp_path: Path) -> None:
    config = archive_config(sqlite_url(tmp_path), workers=1, batch_wait_ms=400)
    async with running(MEMORY, config) as (service, archive):
        await commit_turn(service, "trickle", 0)
        # taken from the queue, not written: its reader waits for more (still backlog)
        await wait_until(lambda: archive.backlog == 1 and not len(archive._queue),
                         within=5, what="the first record taken")
        assert archive.stats.records_written == 0
        await commit_turns(service, ["trickle"], range(1, 4))
        await wait_until(lambda: archive.stats.records_written == 4, within=10,
                         what="4 turns archived")
        assert archive.stats.batches_written == 1
        assert await archived_rows(archive) == expected_rows(["trickle"], range(4))


async def test_a_replayed_batch_is_counted_as_duplicates(db_url: str) -> None:
    # rows go to the driver as tuples (executemany): its rowcount still tells them apart
    raws = [encode_record(ArchiveRecord(
        "default", "replay", f"req-{n}", n + 1, 1_000 + n,
        ({"role": "user", "content": f"q{n}"},
         {"role": "assistant", "content": [{"type": "text", "text": f"a{n}"}],
          "name": "bot"}), MODEL, BACKEND, 1, n, 1 + n)) for n in range(3)]
    async with running(MEMORY, archive_config(db_url), start=False) as (_service, archive):
        await archive.writer.start()
        await archive.writer.write([pending_of(raw) for raw in raws[:2]])
        await archive.writer.write([pending_of(raw) for raw in raws])
        stats = archive.stats
        assert (stats.rows_inserted, stats.duplicate_rows, stats.batches_written) == (6, 4, 2)
        rows = await archived_rows(archive)
        assert rows[1] == ("default", "replay", "req-0", 1, 1, "assistant",
                           '[{"type":"text","text":"a0"}]', MODEL, BACKEND, 0)
