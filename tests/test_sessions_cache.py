"""The decoded copy in the LRU: used only while Redis confirms that it is current.

A gateway keeps the session it last read or wrote, with the token of that
Redis write, and asks Redis whether it is still current instead of reading it
again. Every test here changes the session behind the copy's back in a way
that keeps or repeats the version number (another gateway, a delete and
rebuild, a writer that does not know tokens) and checks that the next request
still gets Redis's current history.
"""

from __future__ import annotations

from dataclasses import replace

import pytest
from redis.asyncio import Redis

from gateway.sessions.codec import decode, encode
from gateway.sessions.lru import BlobCache, decoded_size
from gateway.sessions.service import SessionService
from gateway.sessions.settings import SessionsConfig
from gateway.sessions.state import SessionState
from tests.fixtures_sessions import (
    chat_body,
    chat_turn,
    cluster_config,
    completion,
    redis_config,
    running,
    turn_numbers,
)
from tests.services import RedisServer, redis_command


def config_for(kind: str, request: pytest.FixtureRequest) -> SessionsConfig:
    """A generous budget: these tests are about which history is served, not timing."""
    if kind == "redis":
        return redis_config(request.getfixturevalue("redis_url"), op_timeout_ms=250)
    return cluster_config(request.getfixturevalue("redis_cluster"), op_timeout_ms=250)


async def history_of(service: SessionService, session_id: str) -> list[int]:
    """What the next request on the session would be sent (turn numbers)."""
    binding = await service.bind("default", session_id, chat_body("next"))
    assert not binding.degraded
    return turn_numbers(list(binding.history))


def script_reads(port: int) -> int:
    """How many times Redis has run HGET (the read script runs it only to send a
    value back; a reader whose copy is current gets nothing)."""
    stats = redis_command(port, "INFO", "commandstats")
    return int(stats.get("cmdstat_hget", {}).get("calls", 0))


@pytest.mark.parametrize("kind", ["redis", "cluster"])
async def test_turns_alternating_between_two_gateways_are_all_kept_in_order(
        kind: str, request: pytest.FixtureRequest) -> None:
    config = config_for(kind, request)
    async with running(config) as first, running(config) as second:
        gateways = (first, second)
        for n in range(12):
            gateway = gateways[n % 2]
            binding = await gateway.bind("default", "pingpong", chat_body(f"q{n}"))
            assert turn_numbers(list(binding.history)) == list(range(n))  # all, in order
            binding.observe_json(completion(f"a{n}"))
            await binding.commit(f"req-pingpong-{n}")
            assert not binding.degraded
        for gateway in gateways:
            assert turn_numbers(await gateway.history("default", "pingpong") or []) == \
                list(range(12))
            assert gateway.stats.conflicts == 0  # each started from the current value


async def test_an_unchanged_session_is_not_sent_again(
        redis_server: RedisServer, redis_url: str) -> None:
    async with running(redis_config(redis_url)) as first, \
            running(redis_config(redis_url)) as second:
        await chat_turn(first, "quiet", 0)
        before = script_reads(redis_server.port)
        assert await history_of(first, "quiet") == [0]  # its own write: still current
        assert script_reads(redis_server.port) == before

        await chat_turn(second, "quiet", 1)  # another gateway wrote: the value comes back
        before = script_reads(redis_server.port)
        assert await history_of(first, "quiet") == [0, 1]
        assert script_reads(redis_server.port) == before + 1
        assert await history_of(first, "quiet") == [0, 1]  # and is kept again
        assert script_reads(redis_server.port) == before + 1


@pytest.mark.parametrize("kind", ["redis", "cluster"])
async def test_a_session_deleted_and_rebuilt_to_the_same_version_is_not_the_cached_one(
        kind: str, request: pytest.FixtureRequest) -> None:
    config = config_for(kind, request)
    async with running(config) as first, running(config) as second:
        for n in range(3):
            await chat_turn(first, "reborn", n)  # first holds version 3
        assert await second.delete("default", "reborn")
        for n in range(10, 13):
            await chat_turn(second, "reborn", n)  # version 3 again, other turns
        assert await history_of(first, "reborn") == [10, 11, 12]


async def test_values_written_without_a_token_are_never_taken_as_current(
        redis_url: str) -> None:
    """Writers that predate tokens (a gateway not yet upgraded) write v and c only."""
    async with running(redis_config(redis_url)) as service:
        for n in range(2):
            await chat_turn(service, "legacy", n)  # cached: version 2 with its token
        redis_key = service.keys.key("default", "legacy").redis_key
        raw = Redis.from_url(redis_url)
        try:
            stored = decode(await raw.hget(redis_key, "c"))
            extra = ({"role": "user", "content": "q7"}, {"role": "assistant", "content": "a7"})
            on_top = replace(stored, messages=stored.messages + extra, version=3)
            await raw.hset(redis_key, mapping={"v": 3, "c": encode(on_top)})  # t stays
            assert await history_of(service, "legacy") == [0, 1, 7]

            rebuilt = replace(stored, messages=extra, version=3)
            await raw.delete(redis_key)
            await raw.hset(redis_key, mapping={"v": 3, "c": encode(rebuilt)})  # no t at all
            assert await history_of(service, "legacy") == [7]
            await chat_turn(service, "legacy", 8)  # and the next write applies on top
            assert await history_of(service, "legacy") == [7, 8]
        finally:
            await raw.aclose()


async def test_the_scripts_are_loaded_again_after_a_script_flush(
        redis_server: RedisServer, redis_url: str) -> None:
    async with running(redis_config(redis_url)) as service:
        await chat_turn(service, "flushed", 0)
        redis_command(redis_server.port, "SCRIPT", "FLUSH")
        assert not await chat_turn(service, "flushed", 1)  # NOSCRIPT, then EVAL: not degraded
        assert await history_of(service, "flushed") == [0, 1]
        assert all(redis_command(redis_server.port, "SCRIPT", "EXISTS", *_script_shas()))


def _script_shas() -> list[str]:
    from gateway.sessions.redis_store import _APPEND, _READ

    return [_APPEND.sha, _READ.sha]


def state_of(text: str) -> SessionState:
    return SessionState(tenant="t", session_id="s", version=1,
                        messages=({"role": "user", "content": text},))


def test_decoded_copies_use_at_most_a_quarter_of_the_lru_and_the_newest_are_kept() -> None:
    cache = BlobCache(max_entries=100, max_bytes=40_000, ttl_seconds=60)
    big = state_of("x" * 1_500)  # about 3.4 kB decoded: two fit in the 10 kB share
    for name in "abc":
        cache.put(name, b"blob", 1, b"token", big)
    a, b, c = (cache.get(name) for name in "abc")
    assert a is not None and a.state is None and a.blob == b"blob"  # the oldest copy went
    assert b is not None and b.state is big and c is not None and c.state is big
    assert cache.size_bytes == 3 * (1 + 4) + 2 * decoded_size(big)

    cache.get("b")  # b is now more recent than c
    cache.put("d", b"blob", 1, b"token", big)
    c_after = cache.get("c")
    assert c_after is not None and c_after.state is None
    cache.pop("b")
    cache.put("huge", b"blob", 1, b"token", state_of("y" * 20_000))  # over the share
    huge = cache.get("huge")
    assert huge is not None and huge.state is None  # kept, without its copy
    assert cache.size_bytes == 3 * (1 + 4) + (4 + 4) + decoded_size(big)  # a, c, d; huge
