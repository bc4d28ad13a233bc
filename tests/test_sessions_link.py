"""The standalone link: its own pool of redis-py connections, kept in step with the server.

Replies on a connection come back in the order commands were sent; a caller
that gives up midway (its budget ran out) must not leave a reply behind for
the next caller of that connection. These tests use a pool of one connection,
so the next call can only run on the connection the previous one used.
"""

from __future__ import annotations

import asyncio

import pytest
from redis.exceptions import ResponseError

from gateway.sessions.redis_link import ServerLink
from tests.services import RedisServer, redis_command


def link(url: str, max_connections: int = 1, name: str = "link-test") -> ServerLink:
    return ServerLink(f"{url}?client_name={name}", max_connections,
                      {"socket_connect_timeout": 1.0, "decode_responses": False})


def connections_named(port: int, name: str) -> int:
    listing = redis_command(port, "CLIENT", "LIST")  # one line per client: "k=v k=v ..."
    return sum(f" name={name} " in f" {line} " for line in listing.splitlines())


async def test_a_call_cut_off_by_its_budget_leaves_no_reply_for_the_next(
        redis_url: str) -> None:
    one = link(redis_url)
    try:
        with pytest.raises(TimeoutError):
            async with asyncio.timeout(0.05):
                await one.call("BLPOP", "nothing-here", 1)  # answers nil after 1 s
        async with asyncio.timeout(0.5):
            assert await one.call("PING") == b"PONG"  # not the BLPOP's nil
    finally:
        await one.aclose()


async def test_an_error_reply_in_a_batch_keeps_the_connection_in_step(redis_url: str) -> None:
    one = link(redis_url)
    try:
        await one.call("SET", "text", "not a number")
        with pytest.raises(ResponseError):
            await one.call_together("text", [("INCR", "text"), ("SET", "after", "1")])
        assert await one.call("GET", "after") == b"1"  # the batch's second command ran
        assert await one.call("GET", "text") == b"not a number"
    finally:
        await one.aclose()


async def test_callers_beyond_the_limit_wait_for_a_connection(
        redis_server: RedisServer, redis_url: str) -> None:
    two = link(redis_url, max_connections=2, name="bounded")
    try:
        # Each call holds its connection ~20 ms on the server (BLPOP's own timeout).
        results = await asyncio.gather(*(two.call("BLPOP", "nothing-here", 0.02)
                                         for _ in range(6)))
        assert results == [None] * 6
        assert connections_named(redis_server.port, "bounded") == 2
    finally:
        await two.aclose()
    assert connections_named(redis_server.port, "bounded") == 0


async def test_pooled_connections_of_a_restarted_server_are_replaced_on_use(
        redis_server: RedisServer, redis_url: str) -> None:
    pool = link(redis_url, max_connections=4, name="restarted")
    try:
        assert await pool.warm(4) == []
        await asyncio.to_thread(redis_server.restart)
        for _ in range(8):  # every pooled connection is dead: each is retried once
            async with asyncio.timeout(1.0):
                assert await pool.call("PING") == b"PONG"
        assert connections_named(redis_server.port, "restarted") == 1  # LIFO: one reused
    finally:
        await pool.aclose()
