"""Redis dies, hangs and comes back: requests keep working, and no turn is lost.

The test server runs without persistence, so a killed Redis would restart
empty. A production Redis keeps what it acknowledged (AOF, RDB or replicas);
the tests model that with ``SAVE`` right before the kill. What the gateway
guarantees is the rest: every write Redis did not acknowledge is replayed.
"""

from __future__ import annotations

import asyncio
import time

from redis.asyncio import Redis

from gateway.sessions.appender import AppendPolicy
from gateway.sessions.codec import decode
from gateway.sessions.compensation import CompensationLog, Replayer
from gateway.sessions.factory import build_cache, build_store
from gateway.sessions.fallback import ResilientStore
from gateway.sessions.keys import KeyScheme
from gateway.sessions.service import SessionService
from gateway.sessions.state import HistoryLimits, Turn
from gateway.sessions.stats import Counters
from tests.fixtures_sessions import (
    chat_body,
    chat_turn,
    completion,
    redis_config,
    running,
    turn_numbers,
    wait_until,
)
from tests.services import RedisServer, redis_command

BUDGET_S = 0.05
"""op_timeout_ms of the tests' services."""


async def redis_copy(url: str, redis_key: str) -> list[int]:
    client = Redis.from_url(url)
    try:
        blob = await client.hget(redis_key, "c")
    finally:
        await client.aclose()
    return turn_numbers(list(decode(blob).messages)) if blob is not None else []


async def degraded_turn(service: SessionService, session_id: str, n: int) -> float:
    """One request while Redis is away: served from the LRU, committed to the log."""
    started = time.monotonic()
    binding = await service.bind("default", session_id, chat_body(f"q{n}"))
    assert binding.degraded
    assert turn_numbers(list(binding.history)) == list(range(n))  # the LRU has it all
    binding.observe_json(completion(f"a{n}"))
    await binding.commit(f"req-{session_id}-{n}")
    assert binding.degraded
    return time.monotonic() - started


async def test_redis_killed_then_restarted_replays_every_pending_write(
        redis_server: RedisServer, redis_url: str) -> None:
    async with running(redis_config(redis_url)) as service:
        key = service.keys.key("default", "outage").redis_key
        for n in range(5):
            assert not await chat_turn(service, "outage", n)
        redis_command(redis_server.port, "SAVE")
        redis_server.kill()

        took = [await degraded_turn(service, "outage", n) for n in range(5, 15)]
        assert max(took) < 10 * BUDGET_S  # a dead Redis never stalls a request
        stats = service.stats
        assert (stats.fallback_writes, stats.backlog, stats.replayed) == (10, 10, 0)
        assert stats.fallback_reads == 10

        await asyncio.to_thread(redis_server.restart)
        await wait_until(lambda: service.stats.backlog == 0, within=10.0,
                         what="the compensation log drained")
        assert service.stats.replayed == 10  # every pending write, counted exactly
        assert await redis_copy(redis_url, key) == list(range(15))  # each turn once, in order

        assert not await chat_turn(service, "outage", 15)  # and Redis serves again
        assert await redis_copy(redis_url, key) == list(range(16))


async def test_a_hanging_redis_costs_a_request_only_its_budget(
        redis_server: RedisServer, redis_url: str) -> None:
    async with running(redis_config(redis_url)) as service:
        key = service.keys.key("default", "paused").redis_key
        for n in range(3):
            await chat_turn(service, "paused", n)
        # Redis accepts connections and commands but answers none of them for 1 s.
        redis_command(redis_server.port, "CLIENT", "PAUSE", 1000, "ALL")
        took = [await degraded_turn(service, "paused", n) for n in range(3, 6)]
        # bind and commit each wait one budget (the commit falls back at its first call)
        assert max(took) < 2 * BUDGET_S + 0.15
        await wait_until(lambda: service.stats.backlog == 0, within=10.0,
                         what="the compensation log drained after the pause")
        assert await redis_copy(redis_url, key) == list(range(6))


def a_turn(n: int) -> Turn:
    return Turn(f"req-merge-{n}", ({"role": "user", "content": f"q{n}"},
                                   {"role": "assistant", "content": f"a{n}"}), None, n)


async def test_replay_never_overwrites_what_another_gateway_wrote(
        redis_server: RedisServer, redis_url: str) -> None:
    """While one gateway is cut off, another appends: the replay merges after it.

    The cut-off gateway is assembled from its parts, so the test decides when
    its compensation log is replayed.
    """
    config = redis_config(redis_url)
    counters = Counters()
    log = CompensationLog(100, counters)
    store = build_store(config)
    cut_off = ResilientStore(store, build_cache(config), log,
                             AppendPolicy(HistoryLimits()), 1.0, counters, wake=lambda: None)
    key = KeyScheme().key("default", "merge")
    try:
        assert not await cut_off.append(key, a_turn(0))
        redis_command(redis_server.port, "SAVE")
        redis_server.kill()
        assert await cut_off.append(key, a_turn(1))  # degraded: kept for the replay
        await asyncio.to_thread(redis_server.restart)
        async with running(config) as other:
            assert not await chat_turn(other, "merge", 2)
        assert await redis_copy(redis_url, key.redis_key) == [0, 2]

        await Replayer(log, cut_off.replay, config.compensation, counters).replay_pass()
        assert (len(log), counters.replayed) == (0, 1)
        assert await redis_copy(redis_url, key.redis_key) == [0, 2, 1]
        loaded = await cut_off.load(key)
        assert loaded.state is not None and not loaded.degraded
        assert turn_numbers(list(loaded.state.messages)) == [0, 2, 1]
    finally:
        await store.close()


async def test_delete_while_redis_is_down_is_replayed(
        redis_server: RedisServer, redis_url: str) -> None:
    async with running(redis_config(redis_url)) as service:
        key = service.keys.key("default", "gone").redis_key
        await chat_turn(service, "gone", 0)
        redis_command(redis_server.port, "SAVE")
        redis_server.kill()
        assert await service.delete("default", "gone")
        binding = await service.bind("default", "gone", chat_body("q1"))
        assert binding.degraded and list(binding.history) == []
        await asyncio.to_thread(redis_server.restart)
        assert turn_numbers(await service.history("default", "gone") or []) == []
        await wait_until(lambda: service.stats.backlog == 0, within=10.0,
                         what="the delete replayed")
        assert await redis_copy(redis_url, key) == []


def test_the_compensation_log_keeps_order_and_its_bound() -> None:
    counters = Counters()
    log = CompensationLog(3, counters)
    first, second = KeyScheme().key("default", "one"), KeyScheme().key("default", "two")
    assert log.add(first, a_turn(0)) and log.add(second, a_turn(1)) and log.add(first, None)
    assert not log.add(second, a_turn(2))  # full: refused and counted
    assert (len(log), counters.dropped) == (3, 1)
    assert log.pending(first) == (a_turn(0), None) and log.has(second)
    oldest = log.oldest()
    assert oldest is not None and oldest.key == first and oldest.turn == a_turn(0)
    log.remove_oldest(oldest)
    assert log.pending(first) == (None,)
