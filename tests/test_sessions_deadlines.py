"""The shared deadline timer of the session layer, and the order commits take.

:class:`Deadlines` replaces an ``asyncio.timeout`` per Redis call: it must
keep what ``asyncio.timeout`` guaranteed (a call cut off at its deadline
raises ``TimeoutError``; someone else's cancellation stays a cancellation;
nested bounds each see their own) and, through the Redis store, that a call
cut off midway leaves its connection unusable for a stale reply.
"""

from __future__ import annotations

import asyncio
import time

import pytest

from gateway.sessions.deadlines import Deadlines
from gateway.sessions.inflight import InflightWrites
from gateway.sessions.keys import KeyScheme
from gateway.sessions.redis_link import ServerLink
from gateway.sessions.redis_store import RedisStore
from gateway.sessions.store import StoreUnavailable
from tests.services import RedisServer, redis_command


async def never() -> None:
    """An awaitable that only a cancellation ends."""
    await asyncio.get_running_loop().create_future()


async def value(result: int) -> int:
    return result


async def test_a_call_past_its_deadline_raises_timeout_error() -> None:
    deadlines = Deadlines(0.02)
    started = time.monotonic()
    with pytest.raises(TimeoutError):
        await deadlines.run(never())
    assert time.monotonic() - started >= 0.02 - 0.002  # a timer may fire a tick early
    assert asyncio.current_task().cancelling() == 0  # type: ignore[union-attr]


async def test_finished_calls_are_never_cut_off_and_leave_the_queue() -> None:
    deadlines = Deadlines(0.02)
    assert [await deadlines.run(value(n)) for n in range(100)] == list(range(100))
    with pytest.raises(TimeoutError):  # the timer passes the 100 finished entries first
        await deadlines.run(never())
    assert deadlines.pending() == 0


async def test_someone_elses_cancellation_stays_a_cancellation() -> None:
    deadlines = Deadlines(10.0)
    waiting = asyncio.Event()

    async def waits() -> None:
        waiting.set()
        await never()

    task = asyncio.ensure_future(deadlines.run(waits()))
    await waiting.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


async def test_a_cancellation_at_the_deadline_is_not_swallowed() -> None:
    """The deadline cancels the task, and in that moment someone else does too."""
    deadlines = Deadlines(0.01)

    async def cancelled_twice() -> None:
        try:
            await never()
        except asyncio.CancelledError:
            asyncio.current_task().cancel()  # type: ignore[union-attr]
            raise

    task = asyncio.ensure_future(deadlines.run(cancelled_twice()))
    with pytest.raises(asyncio.CancelledError):
        await task


async def test_nested_bounds_each_see_their_own() -> None:
    outer, inner = Deadlines(10.0), Deadlines(0.01)

    async def inner_times_out() -> str:
        with pytest.raises(TimeoutError):
            await inner.run(never())
        return "outer goes on"

    assert await outer.run(inner_times_out()) == "outer goes on"

    short_outer, long_inner = Deadlines(0.01), Deadlines(10.0)
    seen: list[type[BaseException]] = []

    async def inner_is_cancelled() -> None:
        try:
            await long_inner.run(never())
        except BaseException as exc:
            seen.append(type(exc))
            raise

    with pytest.raises(TimeoutError):
        await short_outer.run(inner_is_cancelled())
    assert seen == [asyncio.CancelledError]  # the inner bound did not claim it


def test_one_instance_serves_successive_event_loops() -> None:
    deadlines = Deadlines(0.01)

    async def once() -> None:
        assert await deadlines.run(value(1)) == 1
        with pytest.raises(TimeoutError):
            await deadlines.run(never())

    asyncio.run(once())
    asyncio.run(once())


def test_a_duration_must_be_positive() -> None:
    with pytest.raises(ValueError):
        Deadlines(0)


async def test_a_redis_call_cut_off_by_the_budget_drops_its_connection(
        redis_server: RedisServer, redis_url: str) -> None:
    """One connection only: the next call would read the stale reply if it were kept."""
    link = ServerLink(f"{redis_url}?client_name=deadline-test", 1,
                      {"socket_connect_timeout": 1.0, "decode_responses": False})
    store = RedisStore(link, ttl_ms=60_000, op_timeout_ms=50)
    key = KeyScheme().key("default", "cut-off")
    redis_command(redis_server.port, "HSET", key.redis_key, "c", "the value")
    try:
        assert await store.get(key) == b"the value"  # the connection is open
        redis_command(redis_server.port, "CLIENT", "PAUSE", 300, "ALL")
        started = time.monotonic()
        with pytest.raises(StoreUnavailable):
            await store.ttl_ms(key)  # PTTL: its reply would be an integer
        assert time.monotonic() - started < 0.25  # the budget, not the pause
        redis_command(redis_server.port, "PING")  # returns once the pause is over
        assert await store.get(key) == b"the value"  # not the PTTL's integer
    finally:
        await store.close()


async def test_commits_of_one_session_take_turns_in_order() -> None:
    inflight = InflightWrites()
    first, second, third = (inflight.begin("k") for _ in range(3))
    order: list[str] = []

    async def commit(name: str, done: asyncio.Event) -> None:
        await inflight.wait_turn("k", done)
        order.append(name)

    await commit("first", first)  # nobody ahead: no wait
    late = asyncio.ensure_future(commit("third", third))
    middle = asyncio.ensure_future(commit("second", second))
    inflight.end("k", first)
    await middle
    assert order == ["first", "second"] and not late.done()  # third waits for second
    inflight.end("k", second)
    await late
    assert order == ["first", "second", "third"]
    inflight.end("k", third)
    await inflight.wait("k", 1.0)  # nothing left to wait for
