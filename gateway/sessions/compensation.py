"""Writes Redis missed, kept in order until a background task replays them.

When Redis fails, a turn is appended to the local LRU copy and to this log;
a delete goes to the log as ``None``. Entries of one session stay in order,
and a session with entries in the log is written only through the log, so a
later turn never overtakes an earlier one. The replayer re-applies each entry
with the normal compare-and-set append: on top of whatever Redis holds now
(never overwriting a newer copy), skipping a turn Redis already has (never
duplicating it). Failed passes back off exponentially with jitter.

The log is in memory: a gateway that stops while Redis is down loses it,
after ``close()`` tried to flush it for ``flush_on_close_ms``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from gateway.sessions.keys import SessionKey
from gateway.sessions.settings import CompensationConfig
from gateway.sessions.state import Turn
from gateway.sessions.stats import Counters
from gateway.sessions.store import reraise_if_cancelled

log = logging.getLogger("gateway.sessions")
_STOP_TIMEOUT_S = 10.0


@dataclass(frozen=True, slots=True)
class PendingWrite:
    key: SessionKey
    turn: Turn | None
    """The turn to append, or None for a delete."""


class ReplayFailed(Exception):
    """Redis is still unavailable: keep the entry and back off."""


class CompensationLog:
    """Pending writes per session, in arrival order, bounded in total."""

    def __init__(self, max_entries: int, counters: Counters) -> None:
        self._by_key: dict[str, deque[PendingWrite]] = {}
        self._size = 0
        self._max = max_entries
        self._counters = counters

    def __len__(self) -> int:
        return self._size

    def add(self, key: SessionKey, turn: Turn | None) -> bool:
        """Keep a write for replay; False (and counted as dropped) when the log is full."""
        if self._size >= self._max:
            self._counters.dropped += 1
            log.error("session compensation log is full (%d): dropping a write to %s",
                      self._max, key.redis_key)
            return False
        self._by_key.setdefault(key.redis_key, deque()).append(PendingWrite(key, turn))
        self._size += 1
        return True

    def has(self, key: SessionKey) -> bool:
        return key.redis_key in self._by_key

    def pending(self, key: SessionKey) -> tuple[Turn | None, ...]:
        return tuple(entry.turn for entry in self._by_key.get(key.redis_key, ()))

    def oldest(self) -> PendingWrite | None:
        """The first entry of the session that has waited longest."""
        for entries in self._by_key.values():
            return entries[0]
        return None

    def remove_oldest(self, entry: PendingWrite) -> None:
        """Drop ``entry``, which :meth:`oldest` returned and which is now in Redis."""
        entries = self._by_key[entry.key.redis_key]
        if entries[0] is not entry:
            raise RuntimeError("compensation entries were replayed out of order")
        entries.popleft()
        self._size -= 1
        if not entries:
            del self._by_key[entry.key.redis_key]


Replay = Callable[[PendingWrite], Awaitable[bool]]
"""Writes one entry to Redis: True when done, False when it can never be (dropped);
raises :class:`ReplayFailed` while Redis is unavailable."""


class Replayer:
    """The background task that empties the log into Redis."""

    def __init__(self, log_: CompensationLog, replay: Replay, config: CompensationConfig,
                 counters: Counters) -> None:
        self._log = log_
        self._replay = replay
        self._config = config
        self._counters = counters
        self._wakeup = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._failures = 0

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="session-compensation")

    def wake(self) -> None:
        """New entries: replay them now unless a failed pass is backing off."""
        self._wakeup.set()

    async def stop(self) -> bool:
        """Cancel the task and wait for it (``_STOP_TIMEOUT_S`` at most); stopped?

        While it has not stopped, nothing else may replay: entries would be
        written twice at once, out of order.
        """
        if self._task is not None:
            self._task.cancel()
            done, _ = await asyncio.wait({self._task}, timeout=_STOP_TIMEOUT_S)
            if not done:
                log.error("session compensation: the replayer did not stop within %.0f s",
                          _STOP_TIMEOUT_S)
                return False
            self._task = None
        return True

    async def flush(self, budget_s: float) -> bool:
        """Replay what is pending (without backoff) for ``budget_s`` at most; all done?"""
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(budget_s):
                while len(self._log):
                    try:
                        await self.replay_pass()
                    except ReplayFailed:
                        await asyncio.sleep(self._config.backoff_initial_ms / 1000)
        return not len(self._log)

    async def _run(self) -> None:
        """Replay whenever woken; after a failure, back off and try again."""
        while True:
            await self._wakeup.wait()
            self._wakeup.clear()
            try:
                await self.replay_pass()
                self._failures = 0
                continue
            except ReplayFailed as exc:
                reraise_if_cancelled()
                reason = repr(exc)
            except Exception:  # a bug must not end the task: the log would never drain
                reraise_if_cancelled()
                log.exception("session compensation: unexpected failure")
                reason = "unexpected failure"
            self._failures += 1
            delay = self._backoff()
            log.warning("session compensation: %d pending, retrying in %.2f s (%s)",
                        len(self._log), delay, reason)
            await asyncio.sleep(delay)
            self._wakeup.set()

    async def replay_pass(self) -> None:
        """Replay entries, oldest session first, until the log is empty."""
        for _ in range(len(self._log)):  # entries added meanwhile wait for the next pass
            entry = self._log.oldest()
            if entry is None:
                return
            written = await self._replay(entry)
            self._log.remove_oldest(entry)
            if written:
                self._counters.replayed += 1
            else:
                self._counters.dropped += 1
        if len(self._log):
            self._wakeup.set()

    def _backoff(self) -> float:
        """Capped exponential backoff with full jitter, in seconds."""
        initial = self._config.backoff_initial_ms / 1000
        cap = self._config.backoff_max_ms / 1000
        return random.uniform(initial / 2, min(cap, initial * 2 ** min(self._failures, 30)))
