"""One periodic check of every backend exchange in flight, instead of a timer each.

An exchange's limits (silence longer than ``read``, a deadline) are seconds
long and need no millisecond precision, but a timer per exchange costs a
timer handle, a heap insertion and a cancellation on every request. The
watchdog keeps the exchanges in flight in a set and looks at them every
``TICK_S`` while there are any: a limit is noticed at most ``TICK_S`` late,
and an exchange costs a set insertion and removal.
"""

from __future__ import annotations

import asyncio
from typing import Protocol

TICK_S = 0.05


class Watched(Protocol):
    def check_time(self, now: float) -> None:
        """Fail the exchange if one of its limits has passed at loop time ``now``."""


class Watchdog:
    """The exchanges of one event loop whose limits are being watched."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._watched: set[Watched] = set()
        self._tick: asyncio.TimerHandle | None = None

    def watch(self, item: Watched) -> None:
        self._watched.add(item)
        if self._tick is None:
            self._tick = self._loop.call_later(TICK_S, self._check)

    def forget(self, item: Watched) -> None:
        self._watched.discard(item)

    def close(self) -> None:
        if self._tick is not None:
            self._tick.cancel()
            self._tick = None

    def _check(self) -> None:
        self._tick = None
        now = self._loop.time()
        for item in list(self._watched):  # a check may forget its item
            item.check_time(now)
        if self._watched:
            self._tick = self._loop.call_later(TICK_S, self._check)
