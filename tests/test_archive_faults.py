"""The archive's faults, each ending with exactly the rows of the turns written.

- MariaDB killed: records wait in the outbox, requests are unaffected, the
  archive says it is degraded; MariaDB back: the backlog drains, no row lost,
  none duplicated.
- Redis killed: turns go to the LRU fallback, and are archived once the
  compensation has replayed them into Redis (the replay adds the record).
- An archiver process SIGKILLed mid-batch: another reader claims what it held.
- A reader that committed but died before acknowledging: the records are
  delivered again, skipped as duplicates, and counted.
"""

from __future__ import annotations

import asyncio
import sys
import time
from pathlib import Path

import sqlalchemy as sa

from gateway.archive.writer import pending_of
from gateway.sessions.keys import KeyScheme
from tests.fixtures_sessions import redis_config
from tests.processes import ROOT
from tests.services import MariaDBServer, RedisServer, redis_command
from tests.test_archive_support import (
    archive_config,
    archived_rows,
    commit_turns,
    expected_rows,
    outbox_lengths,
    pending_count,
    running,
    sqlite_url,
    wait_until,
)

SESSIONS = [f"user-{i}" for i in range(5)]


async def test_database_down_then_back_loses_and_duplicates_nothing(
        redis_url: str, redis_server: RedisServer, mariadb: MariaDBServer) -> None:
    sessions = redis_config(redis_url, buckets=8)
    async with running(sessions, archive_config(mariadb.url)) as (service, archive):
        await commit_turns(service, SESSIONS, range(0, 4))
        await wait_until(lambda: archive.stats.records_written == 20, within=10,
                         what="the first 20 turns archived")
        mariadb.kill()
        try:
            started = time.monotonic()
            degraded = await commit_turns(service, SESSIONS, range(4, 10))
            elapsed = time.monotonic() - started
            assert degraded == [False] * 30 and elapsed < 3.0  # requests unaffected
            await wait_until(lambda: archive.degraded, within=10, what="archive degraded")
            assert archive.degraded_reason == "archive database unavailable"
            assert await archive.sample_backlog() == 30
            assert archive.stats.records_written == 20
        finally:
            await asyncio.to_thread(mariadb.restart)
        await wait_until(lambda: archive.stats.records_written == 50, within=30,
                         what="the backlog drained")
        assert await archived_rows(archive) == expected_rows(SESSIONS, range(10))
        stats = archive.stats
        assert (stats.duplicate_rows, stats.dead_letters, stats.overflowed) == (0, 0, 0)
        await wait_until(lambda: sum(outbox_lengths(redis_server.port, sessions)) == 0,
                         within=5, what="outbox empty")
        await archive.sample_backlog()
        assert not archive.degraded


async def test_turns_taken_by_the_fallback_are_archived_once_replayed(
        redis_url: str, redis_server: RedisServer, tmp_path: Path) -> None:
    sessions = redis_config(redis_url, buckets=8)
    async with running(sessions, archive_config(sqlite_url(tmp_path))) as (service, archive):
        await commit_turns(service, SESSIONS, range(0, 2))
        await wait_until(lambda: archive.stats.records_written == 10, within=10,
                         what="10 turns archived")
        redis_command(redis_server.port, "SAVE")  # the test server persists only on demand
        redis_server.kill()
        try:
            degraded = await commit_turns(service, SESSIONS, range(2, 5))
            assert degraded == [True] * 15  # taken by the LRU fallback
            await wait_until(lambda: archive.degraded_reason == "archive outbox unavailable",
                             within=10, what="archive degraded")
            assert archive.stats.records_written == 10  # nothing to archive yet
        finally:
            await asyncio.to_thread(redis_server.restart)
        await wait_until(lambda: service.stats.backlog == 0, within=15,
                         what="compensation replayed")
        await wait_until(lambda: archive.stats.records_written == 25, within=15,
                         what="the replayed turns archived")
        assert await archived_rows(archive) == expected_rows(SESSIONS, range(5))
        assert archive.stats.duplicate_rows == 0


def _archiver_config(path: Path, redis_url: str, db_url: str, table: str) -> Path:
    path.write_text(f'[sessions]\nstore = "redis"\nurl = "{redis_url}"\nbuckets = 8\n'
                    f'[archive]\nurl = "{db_url}"\ntable = "{table}"\n'
                    "poll_interval_ms = 20\nwrite_timeout_ms = 60000\n")
    return path


async def test_an_archiver_sigkilled_mid_batch_is_taken_over(
        redis_url: str, redis_server: RedisServer, mariadb: MariaDBServer,
        tmp_path: Path) -> None:
    sessions = redis_config(redis_url, buckets=8)
    config = archive_config(mariadb.url)
    async with running(sessions, config, start=False) as (service, archive):
        await archive.writer.ensure_schema()
        async with archive.writer.engine.connect() as lock:
            # The other archiver's INSERT will wait on this lock: it dies mid-batch.
            await lock.execute(sa.text(f"LOCK TABLES {config.table} WRITE"))
            await commit_turns(service, SESSIONS, range(4))
            argv = [sys.executable, "-m", "gateway.archive", "--config",
                    str(_archiver_config(tmp_path / "a.toml", redis_url, mariadb.url,
                                         config.table))]
            other = await asyncio.create_subprocess_exec(*argv, cwd=ROOT,
                                                         stdout=asyncio.subprocess.DEVNULL,
                                                         stderr=asyncio.subprocess.DEVNULL)
            try:
                await wait_until(lambda: pending_count(redis_server.port, sessions,
                                                       config.consumer_group) == 20,
                                 within=20, what="the other archiver holding all 20 records")
            finally:
                other.kill()
                await other.wait()
            await lock.execute(sa.text("UNLOCK TABLES"))
        await archive.start()
        await wait_until(lambda: archive.stats.records_written == 20, within=15,
                         what="the records claimed and archived")
        assert archive.stats.claimed == 20 and archive.stats.duplicate_rows == 0
        assert await archived_rows(archive) == expected_rows(SESSIONS, range(4))
        await wait_until(lambda: pending_count(redis_server.port, sessions,
                                               config.consumer_group) == 0,
                         within=5, what="nothing pending")


async def test_committed_but_unacknowledged_records_are_skipped_as_duplicates(
        redis_url: str, redis_server: RedisServer, mariadb: MariaDBServer) -> None:
    sessions = redis_config(redis_url, buckets=2)
    config = archive_config(mariadb.url)
    keys = KeyScheme(sessions.prefix, sessions.buckets)
    async with running(sessions, config, start=False) as (service, archive):
        await commit_turns(service, SESSIONS, range(2))
        # A reader that wrote its batch and died before XACK: read as "ghost", commit.
        raws: list[bytes] = []
        for bucket in range(sessions.buckets):
            stream = keys.outbox_key(bucket)
            redis_command(redis_server.port, "XGROUP", "CREATE", stream,
                          config.consumer_group, "0", "MKSTREAM")
            reply = redis_command(redis_server.port, "XREADGROUP", "GROUP",
                                  config.consumer_group, "ghost", "STREAMS", stream, ">")
            raws += [fields["r"].encode() for _, entries in reply for _, fields in entries]
        assert len(raws) == 10
        await archive.writer.start()
        await archive.writer.write([pending_of(raw) for raw in raws])
        assert archive.stats.rows_inserted == 20
        await archive.start()
        await wait_until(lambda: archive.stats.claimed == 10
                         and archive.stats.records_written == 20, within=15,
                         what="the ghost's records claimed and written again")
        assert archive.stats.duplicate_rows == 20 and archive.stats.rows_inserted == 20
        assert await archived_rows(archive) == expected_rows(SESSIONS, range(2))
