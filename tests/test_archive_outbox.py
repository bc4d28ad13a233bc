"""The archive with Redis: records travel through the bucket outbox streams.

Real Redis (standalone, Cluster, sharded) and the real MariaDB: the record is
added in the session's compare-and-set script, readers in a consumer group
write it and acknowledge (and delete) it after the commit, so a drained
outbox is empty. Bad records are moved aside; a full outbox refuses and counts.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from gateway.archive.outbox import OutboxReader
from gateway.archive.outbox_redis import OutboxOps, build_partitions
from gateway.archive.stats import ArchiveCounters
from gateway.sessions.keys import KeyScheme
from gateway.sessions.settings import SessionsConfig, ShardConfig
from tests.fixtures_sessions import (  # noqa: F401 - fixtures
    cluster_config,
    redis_config,
    second_redis_server,
    second_redis_url,
)
from tests.services import MariaDBServer, RedisCluster, RedisServer, redis_command
from tests.test_archive_support import (
    archive_config,
    archived_rows,
    commit_turn,
    commit_turns,
    database_url,
    dead_letters,
    expected_rows,
    outbox_lengths,
    pending_count,
    request_id,
    running,
    sqlite_url,
    wait_until,
)

SESSIONS = [f"user-{i}" for i in range(8)]


async def test_turns_reach_the_database_through_the_outbox(
        redis_url: str, redis_server: RedisServer, mariadb: MariaDBServer) -> None:
    sessions = redis_config(redis_url, buckets=8)
    async with running(sessions, archive_config(mariadb.url)) as (service, archive):
        degraded = await commit_turns(service, SESSIONS, range(4))
        assert degraded == [False] * 32
        await wait_until(lambda: archive.stats.records_written == 32, within=10,
                         what="32 turns archived")
        assert await archived_rows(archive) == expected_rows(SESSIONS, range(4))
        assert archive.stats.duplicate_rows == 0 and archive.stats.claimed == 0
        # acknowledged records are deleted: the outbox holds only what waits
        await wait_until(lambda: sum(outbox_lengths(redis_server.port, sessions)) == 0,
                         within=5, what="the outbox emptied")
        assert await archive.sample_backlog() == 0


async def test_a_duplicate_append_adds_no_record(redis_url: str, redis_server: RedisServer,
                                                 tmp_path: Path) -> None:
    sessions = redis_config(redis_url, buckets=4)
    async with running(sessions, archive_config(sqlite_url(tmp_path)),
                       start=False) as (service, _archive):
        await commit_turn(service, "twice", 0)
        await commit_turn(service, "twice", 0)  # same request id: the session skips it
        assert sum(outbox_lengths(redis_server.port, sessions)) == 1


async def test_bad_records_are_moved_aside_with_the_reason(
        redis_url: str, redis_server: RedisServer, mariadb: MariaDBServer) -> None:
    sessions = redis_config(redis_url, buckets=4)
    outbox = KeyScheme(sessions.prefix, sessions.buckets).outbox_key(0)
    config = archive_config(mariadb.url, poison_attempts=2)
    async with running(sessions, config) as (service, archive):
        await commit_turns(service, ["fine"], range(2))
        await commit_turn(service, "bad-role", 0, role="x" * 100)
        redis_command(redis_server.port, "XADD", outbox, "*", "r", "{not json")
        redis_command(redis_server.port, "XADD", outbox, "*", "other", "no record field")
        await commit_turns(service, ["fine"], range(2, 4))
        await wait_until(lambda: archive.stats.dead_letters == 3
                         and archive.stats.records_written == 4, within=15,
                         what="4 turns archived and 3 records moved aside")
        assert await archived_rows(archive) == expected_rows(["fine"], range(4))
        letters = await dead_letters(archive)
        assert [rid for rid, _, _ in letters] == [None, None, request_id("bad-role", 0)]
        reasons = sorted(reason for _, reason, _ in letters)
        assert "Data too long for column 'role'" in reasons[0]
        assert reasons[1].startswith("undecodable record: not JSON")
        assert reasons[2].startswith("undecodable record: outbox entry ")
        await wait_until(lambda: sum(outbox_lengths(redis_server.port, sessions)) == 0,
                         within=5, what="the bad records acknowledged too")


async def test_a_full_outbox_refuses_the_record_but_not_the_session_write(
        redis_url: str, redis_server: RedisServer, tmp_path: Path) -> None:
    sessions = redis_config(redis_url, buckets=2)
    config = archive_config(sqlite_url(tmp_path), outbox_max_records=4)  # 2 per bucket
    async with running(sessions, config, start=False) as (service, archive):
        names = [f"s{i}" for i in range(10)]
        assert await commit_turns(service, names, range(1)) == [False] * 10
        lengths = outbox_lengths(redis_server.port, sessions)
        assert lengths == [2, 2]
        assert archive.stats.overflowed == 6
        for name in names:  # every session has its turn
            assert (await service.describe("default", name)).turns == 1
        await archive.start()
        await wait_until(lambda: archive.stats.records_written == 4, within=10,
                         what="the 4 records the outbox took archived")
        assert len(await archived_rows(archive)) == 8


async def test_a_cluster_outbox_is_read_slot_by_slot(redis_cluster: RedisCluster,
                                                     tmp_path: Path) -> None:
    sessions = cluster_config(redis_cluster, buckets=16)
    async with running(sessions, archive_config(sqlite_url(tmp_path))) as (service, archive):
        await commit_turns(service, SESSIONS, range(3))
        await wait_until(lambda: archive.stats.records_written == 24, within=15,
                         what="24 turns archived from the cluster")
        assert await archived_rows(archive) == expected_rows(SESSIONS, range(3))
        await wait_until(lambda: archive.backlog == 0, within=5, what="cluster outbox empty")


async def test_a_sharded_outbox_lives_beside_its_buckets(
        redis_url: str, redis_server: RedisServer, tmp_path: Path,
        request: pytest.FixtureRequest) -> None:
    second_url = request.getfixturevalue("second_redis_url")
    second_server = request.getfixturevalue("second_redis_server")
    sessions = replace(SessionsConfig(store="sharded", buckets=4, shards=(
        ShardConfig(redis_url, (0, 1)), ShardConfig(second_url, (2, 3)))),
        compensation=redis_config(redis_url).compensation)
    async with running(sessions, archive_config(sqlite_url(tmp_path))) as (service, archive):
        await commit_turns(service, SESSIONS, range(2))
        await wait_until(lambda: archive.stats.records_written == 16, within=10,
                         what="16 turns archived from two servers")
        assert await archived_rows(archive) == expected_rows(SESSIONS, range(2))
        first = outbox_lengths(redis_server.port, sessions)
        second = outbox_lengths(second_server.port, sessions)
        # each server holds streams only for its own buckets (and they are drained)
        assert first[2:] == [0, 0] and second[:2] == [0, 0]


@pytest.mark.parametrize("store", ["redis", "cluster"])
async def test_the_outbox_commands_on_a_server_and_on_a_cluster(
        store: str, request: pytest.FixtureRequest) -> None:
    if store == "redis":
        sessions = redis_config(request.getfixturevalue("redis_url"), buckets=4)
    else:
        sessions = cluster_config(request.getfixturevalue("redis_cluster"), buckets=4)
    [partition] = build_partitions(sessions, socket_timeout_s=1.0)
    client, streams = partition.client, partition.streams
    first, second = (OutboxOps(client, streams, "g", name, 1.0) for name in ("a", "b"))
    try:
        await first.ensure_groups()
        await first.ensure_groups()  # again: the groups exist already, nothing is reset
        for n, stream in enumerate(streams * 2):
            await client.xadd(stream, {"r": f"record-{n}".encode()})
        read = await first.read_new(count=10, block_ms=10)
        assert sorted(entry.raw for entry in read) == [f"record-{n}".encode() for n in range(8)]
        assert await first.read_new(count=10, block_ms=10) == []
        await first.touch(read)
        assert await second.claim_stale(min_idle_ms=60_000, count=10) == []  # still held
        claimed = await second.claim_stale(min_idle_ms=0, count=10)
        assert sorted(e.entry_id for e in claimed) == sorted(e.entry_id for e in read)
        assert await second.backlog() == 8
        await second.ack(claimed)
        assert await second.backlog() == 0  # acknowledged means deleted
        assert await second.forget_idle_consumers(idle_ms=0) == len(streams)  # "a" goes
        assert await second.forget_idle_consumers(idle_ms=0) == 0  # never itself
    finally:
        await client.aclose()


@pytest.mark.parametrize("db", ["sqlite", "mariadb"])
async def test_a_trickle_of_turns_is_gathered_into_one_transaction(
        db: str, redis_url: str, redis_server: RedisServer, tmp_path: Path,
        request: pytest.FixtureRequest) -> None:
    # batch_wait_ms: a read of fewer than half a batch waits for more before writing
    mariadb = request.getfixturevalue("mariadb") if db == "mariadb" else None
    sessions = redis_config(redis_url, buckets=4)
    config = archive_config(database_url(db, tmp_path, mariadb), workers=1,
                            batch_wait_ms=400)
    async with running(sessions, config) as (service, archive):
        await commit_turn(service, "trickle", 0)
        await wait_until(lambda: pending_count(redis_server.port, sessions, "archive") == 1,
                         within=5, what="the first record read (and its reader waiting)")
        await commit_turns(service, ["trickle"], range(1, 3))
        await commit_turns(service, ["other"], range(3))
        await wait_until(lambda: archive.stats.records_written == 6, within=10,
                         what="6 turns archived")
        assert archive.stats.batches_written == 1
        assert await archived_rows(archive) == expected_rows(["other", "trickle"], range(3))
        assert archive.stats.duplicate_rows == 0


async def test_only_a_small_read_waits_for_more(redis_url: str,
                                               redis_server: RedisServer) -> None:
    sessions = redis_config(redis_url, buckets=2)
    config = archive_config("sqlite+aiosqlite:///unused.db", batch_size=4, batch_wait_ms=10)
    [partition] = build_partitions(sessions, socket_timeout_s=1.0)
    ops = OutboxOps(partition.client, partition.streams, "g", "a", 1.0)
    reader = OutboxReader(ops, None, config, ArchiveCounters(),  # type: ignore[arg-type]
                          cluster=False)

    def reads() -> int:
        stats = redis_command(redis_server.port, "INFO", "commandstats")
        return int(stats.get("cmdstat_xreadgroup", {}).get("calls", 0))

    try:
        await ops.ensure_groups()
        for n in range(3):  # at least half a batch: written at once, one read
            await partition.client.xadd(partition.streams[n % 2], {"r": b"x"})
        before = reads()
        assert len(await reader._read_batch()) == 3
        assert reads() - before == 1
        await partition.client.xadd(partition.streams[0], {"r": b"y"})
        before = reads()
        assert [e.raw for e in await reader._read_batch()] == [b"y"]
        assert reads() - before == 2  # waited batch_wait_ms, then read again
    finally:
        await partition.client.aclose()
