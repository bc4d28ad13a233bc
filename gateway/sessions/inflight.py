"""Coordinating one gateway's own writes to a session.

Read-your-writes: a client that got its answer sends the next message at
once, possibly before the previous turn's commit has reached Redis; without a
wait the next request would be built without that turn. A commit registers
itself (:meth:`InflightWrites.begin`) before its first await, so a load that
starts after the response was sent waits for it.

Queueing: commits of one session in one process take turns, in the order
they began (:meth:`InflightWrites.wait_turn`). Compare-and-set keeps writers
in different gateways correct, but writers that could simply wait for each
other would otherwise collide, retry, and burn their small time budgets on
each other. The registry of running commits is that queue already, so no
lock per key is needed: an ``asyncio.Lock`` per commit behind an
``asynccontextmanager`` cost ~16 µs of a turn's CPU (bench/sessions_cpu.py),
where a commit that has no commit ahead of it now waits for nothing.
"""

from __future__ import annotations

import asyncio
import contextlib


class InflightWrites:
    """Commits in progress per session key."""

    def __init__(self) -> None:
        self._by_key: dict[str, list[asyncio.Event]] = {}

    def begin(self, key: str) -> asyncio.Event:
        """Mark a commit on ``key`` as running (call before the commit's first await)."""
        done = asyncio.Event()
        self._by_key.setdefault(key, []).append(done)
        return done

    def end(self, key: str, done: asyncio.Event) -> None:
        """The commit that :meth:`begin` returned ``done`` for has finished."""
        done.set()
        events = self._by_key[key]
        events.remove(done)
        if not events:
            del self._by_key[key]

    async def wait_turn(self, key: str, done: asyncio.Event) -> None:
        """Wait until the commits on ``key`` that began before the one ``done``
        belongs to have ended (no bound: each of them is bounded by its budget)."""
        events = self._by_key[key]
        if events[0] is done:  # the usual case: nobody ahead
            return
        for event in events[:events.index(done)]:  # a copy: ended ones leave the list
            await event.wait()

    async def wait(self, key: str, timeout_s: float) -> None:
        """Wait until the commits running now on ``key`` end, ``timeout_s`` at most."""
        events = list(self._by_key.get(key, ()))
        if not events:
            return
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout_s):
                for event in events:
                    await event.wait()
