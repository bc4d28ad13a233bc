"""Which backend serves a request: least outstanding requests, weights respected.

A pool is the set of backends serving one model. It admits a request to a
backend whose breaker admits a call and which is under its
``max_concurrency``; when none is free it lets the request wait a little for
a slot (``max_queue`` waiters, ``max_queue_delay_ms`` each, as Triton's
scheduler does) and then sheds it: never an unbounded queue, never a hang.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections import deque
from collections.abc import Collection, Iterable

from gateway.resilience.deadline import Deadline
from gateway.resilience.settings import SheddingConfig
from gateway.upstream.backend import Backend


class Pool:
    """The backends that serve one model.

    The pick is the least loaded backend among those that admit a call, ties
    broken at random in proportion to weight (so an idle pool spreads traffic
    by weight). A backend's load is ``(in flight + 1) / weight``, divided by
    the square of its recent success ratio: a backend that fails fast has
    nothing in flight and would otherwise draw every request (the "black hole"
    of least-request balancing) until its breaker opens, and one that fails
    half its calls would cost a retry for every other request it gets.
    """

    def __init__(self, model: str, backends: Iterable[Backend],
                 shedding: SheddingConfig) -> None:
        self.model = model
        self.backends: tuple[Backend, ...] = tuple(backends)
        self.shedding = shedding
        self.active_requests = 0
        self._waiters: deque[asyncio.Future[None]] = deque()
        for backend in self.backends:
            backend.on_release(self._wake_one)

    def detach(self) -> None:
        """Stop listening to the backends' releases (the pool was replaced by a reload)."""
        for backend in self.backends:
            backend.remove_release_listener(self._wake_one)

    def pick(self, avoid: Collection[Backend] = (),
             exclude: Collection[Backend] = ()) -> Backend | None:
        """The backend to try next, preferring one not in ``avoid``, never one in ``exclude``."""
        if len(self.backends) == 1:  # the common case of one engine per model, without lists
            only = self.backends[0]
            return only if only.admits() and only not in exclude else None
        admitting = [b for b in self.backends if b.admits() and b not in exclude]
        fresh = [b for b in admitting if b not in avoid]
        return _least_loaded(fresh or admitting)

    def any_admits(self) -> bool:
        return any(b.admits() for b in self.backends)

    def all_refused_by_breakers(self) -> bool:
        """Whether every backend's breaker refuses calls (waiting would not help)."""
        return not any(b.breaker.admits() for b in self.backends)

    def seconds_until_half_open(self) -> float:
        """Time until the first open breaker of this pool lets a probe through."""
        return min(b.breaker.seconds_until_half_open() for b in self.backends)

    async def admit(self, avoid: Collection[Backend], deadline: Deadline,
                    exclude: Collection[Backend] = ()) -> Backend | None:
        """A backend with a slot taken for this request, or None when shed.

        The caller must ``release()`` the backend once the request is done.
        """
        backend = self.pick(avoid, exclude)
        if backend is None and not self.all_refused_by_breakers():
            backend = await self._wait_for_slot(avoid, deadline, exclude)
        if backend is not None:
            backend.in_flight += 1
        return backend

    async def _wait_for_slot(self, avoid: Collection[Backend], deadline: Deadline,
                             exclude: Collection[Backend]) -> Backend | None:
        if len(self._waiters) >= self.shedding.max_queue:
            return None
        loop = asyncio.get_running_loop()
        give_up = loop.time() + min(self.shedding.max_queue_delay_ms / 1000, deadline.remaining())
        while (left := give_up - loop.time()) > 0:
            waiter: asyncio.Future[None] = loop.create_future()
            self._waiters.append(waiter)
            try:
                await asyncio.wait_for(waiter, left)
            except TimeoutError:
                return None
            finally:
                if waiter in self._waiters:
                    self._waiters.remove(waiter)
            if (backend := self.pick(avoid, exclude)) is not None:
                return backend
        return None

    def _wake_one(self) -> None:
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return


def _load(backend: Backend, now: float) -> float:
    success = 1.05 - backend.failure_ratio(now)  # never 0: a dead backend stays pickable
    return (backend.in_flight + 1) / backend.config.weight / (success * success)


def _least_loaded(candidates: list[Backend]) -> Backend | None:
    if len(candidates) <= 1:
        return candidates[0] if candidates else None
    now = time.monotonic()
    loads = [_load(b, now) for b in candidates]
    best = min(loads)
    tied = [b for b, load in zip(candidates, loads, strict=True) if load == best]
    if len(tied) == 1:
        return tied[0]
    return random.choices(tied, weights=[b.config.weight for b in tied])[0]


def build_pools(backends: Iterable[Backend], shedding: SheddingConfig) -> dict[str, Pool]:
    by_model: dict[str, list[Backend]] = {}
    for backend in backends:
        for model in backend.config.models:
            by_model.setdefault(model, []).append(backend)
    return {model: Pool(model, members, shedding) for model, members in by_model.items()}
