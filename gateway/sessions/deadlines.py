"""One timer for all calls bounded by the same duration, not an ``asyncio.timeout`` each.

Why: a session turn makes three bounded calls (the read, the compare-and-set,
and the whole append under the commit budget), and each ``asyncio.timeout``
costs ~10-20 µs of CPU on the benchmark machine (bench/sessions_cpu.py; ~4 µs
here): a ``Timeout`` object, a timer handle pushed on the loop's heap and
cancelled again, ``__aenter__``/``__aexit__`` coroutines.

All calls of one :class:`Deadlines` have the same duration, so their deadlines
come in the order the calls start: a FIFO queue is sorted by deadline for
free. One timer is armed for the oldest call still running. A call that ends
only marks its entry done (no heap removal); when the timer fires it drops
the finished entries at the head, cancels the task of every call whose
deadline has passed, and arms itself again for the next running call. With a
steady stream of calls that is about one timer per duration, whatever the
number of calls.

What a call sees is what ``asyncio.timeout`` gives: its task is cancelled at
the deadline, so whatever it awaits is cancelled where it stands (the Redis
link drops a connection whose exchange was cut off), and the cancellation
comes out as ``TimeoutError``. A cancellation from anyone else still comes
out as ``CancelledError``, also when a deadline passed at the same moment
(the task's cancel count tells them apart, as in ``asyncio.timeout``), and
nested bounds (a Redis call inside the commit budget) each see their own.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Awaitable
from typing import TypeVar

_T = TypeVar("_T")
_SLACK_S = 0.001
"""A timer may fire up to a clock tick early (libuv counts milliseconds): a call
due within this much is cut off now rather than by a timer re-armed to spin."""


class _Call:
    """One bounded call in flight; ``task`` None once it has ended."""

    __slots__ = ("cancelling", "deadline", "expired", "task")

    def __init__(self, deadline: float, task: asyncio.Task[object], cancelling: int) -> None:
        self.deadline = deadline
        self.task: asyncio.Task[object] | None = task
        self.cancelling = cancelling
        self.expired = False


class Deadlines:
    """Bounds awaitables by ``seconds`` each, on the running loop, with one timer."""

    __slots__ = ("_calls", "_loop", "_timer", "seconds")

    def __init__(self, seconds: float) -> None:
        if seconds <= 0:
            raise ValueError(f"seconds must be > 0, got {seconds}")
        self.seconds = seconds
        self._calls: deque[_Call] = deque()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._timer: asyncio.TimerHandle | None = None

    async def run(self, awaitable: Awaitable[_T]) -> _T:
        """``await awaitable``, or ``TimeoutError`` once ``seconds`` have passed."""
        loop = asyncio.get_running_loop()
        if loop is not self._loop:
            self._adopt(loop)
        task = asyncio.current_task()
        if task is None:
            raise RuntimeError("Deadlines.run needs a task, as asyncio.timeout does")
        call = _Call(loop.time() + self.seconds, task, task.cancelling())
        self._calls.append(call)
        if self._timer is None:
            self._timer = loop.call_at(call.deadline, self._expire)
        try:
            result = await awaitable
        except BaseException as exc:
            call.task = None
            if call.expired and task.uncancel() <= call.cancelling \
                    and isinstance(exc, asyncio.CancelledError):
                raise TimeoutError from exc  # our cancellation, and nobody else's
            raise
        call.task = None
        if call.expired:  # cut off, but what it awaited swallowed the cancellation
            task.uncancel()
        return result

    def pending(self) -> int:
        """Entries still queued (running calls, and ended ones the timer has not
        passed yet): for tests."""
        return len(self._calls)

    def _adopt(self, loop: asyncio.AbstractEventLoop) -> None:
        """First use, or a new event loop (tests run one per test): what was queued
        belonged to a loop that no longer runs."""
        if self._timer is not None:
            self._timer.cancel()
        self._loop, self._timer = loop, None
        self._calls.clear()

    def _expire(self) -> None:
        """The timer: cut off the calls that are due, re-arm for the next running one."""
        self._timer = None
        assert self._loop is not None
        calls = self._calls
        due = self._loop.time() + _SLACK_S
        while calls:
            call = calls[0]
            if call.task is None:
                calls.popleft()
            elif call.deadline > due:
                self._timer = self._loop.call_at(call.deadline, self._expire)
                return
            else:
                calls.popleft()
                call.expired = True
                call.task.cancel()
