"""Fifty requests finishing at once on one session: every turn lands exactly once.

The writers run in one gateway (its commits of one session queue in-process)
and spread over five gateways sharing Redis (they collide, and compare-and-set
makes the losers retry on the winner's value).
"""

from __future__ import annotations

import asyncio
from contextlib import AsyncExitStack

import pytest
from redis.asyncio import Redis, RedisCluster
from redis.asyncio.cluster import ClusterNode

from gateway.sessions.codec import decode
from gateway.sessions.service import SessionService
from gateway.sessions.settings import SessionsConfig
from tests.fixtures_sessions import (
    chat_body,
    cluster_config,
    completion,
    redis_config,
    running,
    turn_numbers,
)

WRITERS = 50


async def commit_concurrently(services: list[SessionService], session_id: str) -> None:
    """Bind 50 requests (round robin over the gateways), then let all commits race."""
    bindings = [await services[i % len(services)].bind("default", session_id,
                                                       chat_body(f"q{i}"))
                for i in range(WRITERS)]
    for i, binding in enumerate(bindings):
        binding.observe_json(completion(f"a{i}"))
    await asyncio.gather(*(b.commit(f"req-{i}") for i, b in enumerate(bindings)))


def assert_every_turn_once(messages: list[dict]) -> None:
    assert sorted(turn_numbers(messages)) == list(range(WRITERS))
    assert len(messages) == 2 * WRITERS
    for question, answer in zip(messages[::2], messages[1::2], strict=True):
        assert (question["role"], answer["role"]) == ("user", "assistant")
        assert question["content"][1:] == answer["content"][1:]  # each answer after its question


async def stored_copy(config: SessionsConfig, redis_key: str) -> list[dict]:
    """The session as Redis holds it, read with a client of the test's own."""
    if config.store == "cluster":
        nodes = [ClusterNode(*node.rsplit(":", 1)) for node in config.nodes]
        client: Redis | RedisCluster = RedisCluster(startup_nodes=nodes)
    else:
        client = Redis.from_url(config.url)
    try:
        state = decode(await client.hget(redis_key, "c"))
    finally:
        await client.aclose()
    assert state.turns == WRITERS and state.version == WRITERS
    return list(state.messages)


def config_for(kind: str, request: pytest.FixtureRequest) -> SessionsConfig:
    """A generous call budget: this test is about compare-and-set, not about timing,
    and a busy two-core CI machine can hold a 50 ms call back by itself."""
    if kind == "memory":
        return SessionsConfig()
    if kind == "redis":
        return redis_config(request.getfixturevalue("redis_url"), op_timeout_ms=250)
    return cluster_config(request.getfixturevalue("redis_cluster"), op_timeout_ms=250)


@pytest.mark.parametrize("kind,gateways", [
    ("memory", 1), ("redis", 1), ("redis", 5), ("cluster", 1), ("cluster", 5)])
async def test_50_concurrent_writers_lose_no_turn_and_double_none(
        kind: str, gateways: int, request: pytest.FixtureRequest) -> None:
    config = config_for(kind, request)
    async with AsyncExitStack() as stack:
        services = [await stack.enter_async_context(running(config))
                    for _ in range(gateways)]
        await commit_concurrently(services, "busy")
        history = await services[0].history("default", "busy")
        assert history is not None
        assert_every_turn_once(history)
        for stats in (service.stats for service in services):
            assert (stats.fallback_writes, stats.backlog, stats.unreplicated) == (0, 0, 0)
        if gateways > 1:  # the gateways did collide, and retried
            assert sum(service.stats.conflicts for service in services) > 0
        if config.remote:
            key = services[0].keys.key("default", "busy").redis_key
            assert_every_turn_once(await stored_copy(config, key))

        await commit_concurrently(services, "busy")  # the same 50 request ids again
        assert await services[-1].history("default", "busy") == history


async def test_a_commit_finishes_even_if_its_request_is_cancelled_and_is_read_back(
        redis_url: str) -> None:
    """The client has the whole answer; losing the turn because it hung up is not allowed.
    And a load that starts while the commit runs waits for it (read-your-writes)."""
    async with running(redis_config(redis_url)) as service:
        binding = await service.bind("default", "hangup", chat_body("q0"))
        binding.observe_json(completion("a0"))
        request = asyncio.create_task(binding.commit("req-0"))
        await asyncio.sleep(0)  # one loop turn: the commit registers and starts its write
        request.cancel()
        following = await service.bind("default", "hangup", chat_body("q1"))
        assert turn_numbers(list(following.history)) == [0]
        assert request.cancelled()
