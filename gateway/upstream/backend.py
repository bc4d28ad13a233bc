"""One inference backend: its settings, its connection pool, its load."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from gateway.config import BackendConfig, Timeouts
from gateway.resilience.breaker import CircuitBreaker
from gateway.upstream.connections import ConnectionPool

_EWMA_ALPHA = 0.2
"""Weight of the newest outcome: about the last ten calls count."""
_EWMA_HALF_LIFE_S = 5.0
"""Without new calls, the failure ratio halves every this many seconds."""


class Backend:
    """A backend at run time.

    Owns one pool of keep-alive connections (:mod:`gateway.upstream.connections`),
    started at start-up and closed at shutdown (never one per request), and
    counts the requests it is serving, which the pool uses to pick the least loaded backend.
    """

    def __init__(self, config: BackendConfig, breaker: CircuitBreaker) -> None:
        self.config = config
        self.name = config.name
        self.timeouts: Timeouts = config.timeouts
        self.breaker = breaker
        self.in_flight = 0
        self._failure_ewma = 0.0
        self._ewma_at = 0.0
        self._release_listeners: list[Callable[[], None]] = []
        self._api_key = config.api_key()
        self.connections = ConnectionPool(config.url, connect_timeout=self.timeouts.connect,
                                          max_idle=config.max_concurrency)

    @property
    def api_key(self) -> str | None:
        return self._api_key

    def url(self, path: str) -> str:
        return self.config.url + path

    def has_capacity(self) -> bool:
        return self.in_flight < self.config.max_concurrency

    def admits(self) -> bool:
        """Whether a request could start here now: a free slot and a willing breaker."""
        return self.in_flight < self.config.max_concurrency and self.breaker.admits()

    def on_release(self, listener: Callable[[], None]) -> None:
        """Call ``listener`` whenever a slot frees up (pools wake their waiters)."""
        self._release_listeners.append(listener)

    def failure_ratio(self, now: float) -> float:
        """Recent failure ratio, for steering traffic away from a failing backend.

        An exponentially weighted average over the last calls that also fades
        with time: a backend that failed once and then got no traffic (because
        it was avoided) is trusted again after a few seconds.
        """
        return self._failure_ewma * 0.5 ** ((now - self._ewma_at) / _EWMA_HALF_LIFE_S)

    def record_outcome(self, *, failed: bool) -> None:
        now = time.monotonic()
        ratio = self.failure_ratio(now)
        self._failure_ewma = ratio + _EWMA_ALPHA * (float(failed) - ratio)
        self._ewma_at = now

    def remove_release_listener(self, listener: Callable[[], None]) -> None:
        if listener in self._release_listeners:
            self._release_listeners.remove(listener)

    def release(self) -> None:
        """Give back the slot a pool took for a request."""
        self.in_flight -= 1
        for listener in self._release_listeners:
            listener()

    async def start(self) -> None:
        self.connections.start(asyncio.get_running_loop())

    async def close(self) -> None:
        self.connections.close()
