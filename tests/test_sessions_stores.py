"""Every store behind one interface: get, compare-and-set, delete, idle TTL."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from redis.asyncio import Redis

from gateway.sessions.codec import encode
from gateway.sessions.factory import build_store
from gateway.sessions.keys import KeyScheme
from gateway.sessions.lru import BlobCache
from gateway.sessions.memory_store import MemoryStore
from gateway.sessions.settings import SessionsConfig, ShardConfig
from gateway.sessions.sharded_store import ShardedStore
from gateway.sessions.state import SessionState
from gateway.sessions.store import Held, SessionStore, Stored
from tests.fixtures_sessions import (  # noqa: F401 - fixtures until conftest imports them
    cluster_config,
    redis_config,
    second_redis_server,
    second_redis_url,
    unique_prefix,
)
from tests.services import redis_command

KEYS = KeyScheme(buckets=4)


def blob(version: int, session_id: str = "s1") -> bytes:
    return encode(SessionState(tenant="default", session_id=session_id, version=version,
                               messages=({"role": "user", "content": f"v{version}"},)))


def sharded_config(first: str, second: str) -> SessionsConfig:
    return SessionsConfig(store="sharded", buckets=4, shards=(
        ShardConfig(first, (0, 1)), ShardConfig(second, (2, 3))))


@pytest.fixture(params=["memory", "redis", "cluster", "sharded"])
async def store(request: pytest.FixtureRequest) -> AsyncIterator[SessionStore]:
    kind = request.param
    if kind == "memory":
        config = SessionsConfig(buckets=4)
    elif kind == "redis":
        config = redis_config(request.getfixturevalue("redis_url"), buckets=4)
    elif kind == "cluster":
        config = cluster_config(request.getfixturevalue("redis_cluster"), buckets=4)
    else:
        config = sharded_config(request.getfixturevalue("redis_url"),
                                request.getfixturevalue("second_redis_url"))
    built = build_store(config)
    await built.ping(5.0)
    yield built
    await built.close()


async def test_compare_and_set_writes_only_on_the_expected_version(
        store: SessionStore) -> None:
    key = KEYS.key("default", f"s1-{unique_prefix()}")
    assert await store.get(key) is None
    assert (await store.compare_and_set(key, 0, blob(1), 1)).applied
    assert await store.get(key) == blob(1)

    stale = await store.compare_and_set(key, 0, blob(1), 1)  # a writer that read "absent"
    assert not stale.applied and stale.current == blob(1)
    assert (await store.compare_and_set(key, 1, blob(2), 2)).applied
    lost = await store.compare_and_set(key, 1, blob(2), 2)  # a writer that read version 1
    assert not lost.applied and lost.current == blob(2)
    assert await store.get(key) == blob(2)


async def test_read_sends_nothing_back_only_while_the_held_value_is_current(
        store: SessionStore) -> None:
    key = KEYS.key("default", f"s3-{unique_prefix()}")
    absent = await store.read(key)
    assert absent is not None and absent.blob is None and absent.token is None
    first = await store.compare_and_set(key, 0, blob(1), 1)
    read = await store.read(key)
    assert read is not None and read.blob == blob(1) and read.token == first.token
    if not store.remote:
        return  # the memory store has no tokens: every read returns the value
    assert first.token is not None
    assert await store.read(key, Held(1, first.token)) is None  # current: nothing sent
    second = await store.compare_and_set(key, 1, blob(2), 2)
    assert second.token not in (None, first.token)
    assert await store.read(key, Held(1, first.token)) == Stored(blob(2), second.token)
    assert await store.read(key, Held(2, first.token)) is not None  # same version, other write
    lost = await store.compare_and_set(key, 1, blob(2), 2)
    assert (lost.current, lost.token) == (blob(2), second.token)  # a conflict names the token


async def test_delete_reports_whether_the_session_existed(store: SessionStore) -> None:
    key = KEYS.key("default", f"s2-{unique_prefix()}")
    assert not await store.delete(key)
    assert (await store.compare_and_set(key, 0, blob(1), 1)).applied
    assert await store.delete(key)
    assert await store.get(key) is None
    gone = await store.compare_and_set(key, 1, blob(2), 2)  # its writer read version 1
    assert not gone.applied and gone.current is None


async def test_tenants_are_isolated_in_every_store(store: SessionStore) -> None:
    session_id = f"shared-{unique_prefix()}"
    mine, theirs = KEYS.key("acme", session_id), KEYS.key("globex", session_id)
    assert (await store.compare_and_set(mine, 0, blob(1), 1)).applied
    assert await store.get(theirs) is None
    assert not await store.delete(theirs)


async def test_redis_keeps_a_hash_and_every_write_restarts_the_idle_ttl(
        redis_url: str) -> None:
    store = build_store(redis_config(redis_url, ttl_seconds=600))
    raw = Redis.from_url(redis_url)
    key = KEYS.key("default", "ttl")
    try:
        assert (await store.compare_and_set(key, 0, blob(1), 1)).applied
        assert await raw.hget(key.redis_key, "v") == b"1"
        assert 599_000 < await raw.pttl(key.redis_key) <= 600_000
        await raw.pexpire(key.redis_key, 5_000)
        assert (await store.compare_and_set(key, 1, blob(2), 2)).applied
        assert 599_000 < await raw.pttl(key.redis_key) <= 600_000
        await raw.pexpire(key.redis_key, 5_000)
        assert not (await store.compare_and_set(key, 1, blob(2), 2)).applied
        assert await raw.pttl(key.redis_key) <= 5_000  # a refused write touches nothing
    finally:
        await raw.aclose()
        await store.close()


async def test_memory_sessions_expire_after_the_idle_ttl() -> None:
    now = [1000.0]
    store = MemoryStore(BlobCache(100, 1 << 20, ttl_seconds=60, clock=lambda: now[0]))
    key = KEYS.key("default", "idle")
    assert (await store.compare_and_set(key, 0, blob(1), 1)).applied
    now[0] += 59
    assert (await store.compare_and_set(key, 1, blob(2), 2)).applied  # restarts the TTL
    now[0] += 59
    assert await store.get(key) == blob(2)
    now[0] += 1
    assert await store.get(key) is None


def test_the_lru_is_bounded_by_entries_and_by_bytes() -> None:
    cache = BlobCache(max_entries=3, max_bytes=1_000, ttl_seconds=60)
    for name in "abcd":
        cache.put(name, b"x" * 10, 1)
    assert len(cache) == 3 and cache.get("a") is None  # the oldest went
    cache.get("b")  # b is now the most recently used
    cache.put("big", b"y" * 950, 1)
    assert cache.get("b") is not None and cache.get("c") is None
    assert cache.size_bytes <= 1_000
    cache.put("huge", b"z" * 2_000, 1)  # larger than the whole cache: not kept
    assert cache.get("huge") is None and cache.size_bytes <= 1_000


async def test_sharded_store_puts_each_bucket_on_its_server(
        redis_url: str, request: pytest.FixtureRequest) -> None:
    second_url = request.getfixturevalue("second_redis_url")
    store = build_store(sharded_config(redis_url, second_url))
    assert isinstance(store, ShardedStore)
    keys = [KEYS.key("default", f"spread-{i}") for i in range(40)]
    try:
        for key in keys:
            assert (await store.compare_and_set(key, 0, blob(1, key.session_id), 1)).applied
            assert await store.ttl_ms(key) > 0
    finally:
        await store.close()
    for url, owned in ((redis_url, {0, 1}), (second_url, {2, 3})):
        port = int(url.rsplit(":", 1)[1].split("/")[0])
        stored = {k.decode() if isinstance(k, bytes) else k
                  for k in redis_command(port, "KEYS", "*")}
        assert stored == {k.redis_key for k in keys if k.bucket in owned}
