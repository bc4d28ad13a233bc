"""Sharing breaker trips between gateway replicas through Redis pub/sub.

Each replica keeps its own breakers (the state machine must answer without a
network round-trip on every request). With ``breaker.shared = true``, a
replica whose breaker trips publishes ``(backend, open_seconds)``; every other
replica opens its breaker for that backend for the same time, so a dead
backend is taken out of the whole fleet by the first replica that sees it.
Only trips travel: half-open probing and closing stay local, so each replica
checks for itself that the backend is back.

Redis down: publishing fails silently (logged), the subscriber reconnects
with backoff, and each replica keeps working on its local state.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import Callable

import orjson
import redis.asyncio as redis

from gateway.resilience.breaker import BreakerState, CircuitBreaker

log = logging.getLogger("gateway.breakers")

CHANNEL = "gateway:breaker-trips"
BreakerLookup = Callable[[str], CircuitBreaker | None]
"""The current breaker of a backend by name (None: no such backend any more)."""
_OP_TIMEOUT_S = 0.2
_RECONNECT_MAX_S = 5.0
_POLL_S = 0.5


class SharedTrips:
    """Publishes local trips and applies the other replicas' trips."""

    def __init__(self, redis_url: str, breakers: BreakerLookup) -> None:
        self._client = redis.Redis.from_url(redis_url, socket_timeout=_OP_TIMEOUT_S,
                                            socket_connect_timeout=_OP_TIMEOUT_S)
        self._breakers = breakers
        self._origin = f"{os.uname().nodename}:{os.getpid()}:{id(self):x}"
        self._applying_remote = False
        self._stopping = False
        self._subscriber: asyncio.Task[None] | None = None
        self._publishes: set[asyncio.Task[None]] = set()
        self.subscribed = asyncio.Event()

    async def start(self) -> None:
        self._subscriber = asyncio.create_task(self._subscribe_forever(), name="breaker-trips")

    async def close(self) -> None:
        self._stopping = True
        if self._subscriber is not None:
            self._subscriber.cancel()
            # Bounded: redis-py's pub/sub read can swallow a cancellation, and
            # the loop then notices _stopping within its poll interval.
            await asyncio.wait({self._subscriber}, timeout=_POLL_S * 3)
        for task in list(self._publishes):
            task.cancel()
        await self._client.aclose()

    def on_transition(self, name: str, old: BreakerState, new: BreakerState) -> None:
        """Breaker hook (runs inline): publish a local trip, in the background."""
        if new is not BreakerState.OPEN or self._applying_remote:
            return
        breaker = self._breakers(name)
        if breaker is None:
            return
        seconds = breaker.seconds_until_half_open()
        task = asyncio.get_running_loop().create_task(self._publish(name, seconds))
        self._publishes.add(task)
        task.add_done_callback(self._publishes.discard)

    async def _publish(self, name: str, seconds: float) -> None:
        message = orjson.dumps({"backend": name, "seconds": seconds, "origin": self._origin})
        try:
            async with asyncio.timeout(_OP_TIMEOUT_S):
                await self._client.publish(CHANNEL, message)
        except (TimeoutError, redis.RedisError, OSError) as exc:
            log.warning("could not share the trip of backend %s: %s", name, exc)

    async def _subscribe_forever(self) -> None:
        delay = 0.1
        while not self._stopping:
            try:
                await self._listen()
            except asyncio.CancelledError:
                raise
            except (redis.RedisError, OSError) as exc:
                if self.subscribed.is_set():
                    delay = 0.1  # it was working: start the backoff over
                self.subscribed.clear()
                log.warning("breaker trip channel lost (%s); retrying in %.1f s", exc, delay)
                await asyncio.sleep(delay)
                delay = min(delay * 2, _RECONNECT_MAX_S)

    async def _listen(self) -> None:
        pubsub = self._client.pubsub(ignore_subscribe_messages=True)
        try:
            await pubsub.subscribe(CHANNEL)
            self.subscribed.set()
            while not self._stopping:
                message = await pubsub.get_message(timeout=_POLL_S)
                if message is not None:
                    self._apply(message["data"])
        finally:
            with contextlib.suppress(Exception):
                await pubsub.aclose()

    def _apply(self, data: bytes) -> None:
        try:
            trip = orjson.loads(data)
            name, seconds, origin = trip["backend"], float(trip["seconds"]), trip["origin"]
        except (orjson.JSONDecodeError, KeyError, TypeError, ValueError):
            log.warning("ignoring a malformed breaker trip message: %r", data[:200])
            return
        breaker = self._breakers(name)
        if origin == self._origin or breaker is None or seconds <= 0:
            return
        if breaker.state is BreakerState.OPEN:
            return
        self._applying_remote = True
        try:
            breaker.force_open(seconds)
        finally:
            self._applying_remote = False
        log.info("backend %s opened by another replica for %.1f s", name, seconds)
