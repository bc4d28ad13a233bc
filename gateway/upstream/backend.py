"""One inference backend: its settings, its connection pool, its load."""

from __future__ import annotations

import time
from collections.abc import Callable

import aiohttp

from gateway.config import BackendConfig, Timeouts
from gateway.resilience.breaker import CircuitBreaker

_EWMA_ALPHA = 0.2
"""Weight of the newest outcome: about the last ten calls count."""
_EWMA_HALF_LIFE_S = 5.0
"""Without new calls, the failure ratio halves every this many seconds."""


class Backend:
    """A backend at run time.

    Owns one keep-alive :class:`aiohttp.ClientSession`, created at start-up and
    closed at shutdown (never one per request), and counts the requests it is
    serving, which the pool uses to pick the least loaded backend.
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
        self._timeouts_by_read: dict[float, aiohttp.ClientTimeout] = {}
        self._api_key = config.api_key()
        self._session: aiohttp.ClientSession | None = None

    @property
    def api_key(self) -> str | None:
        return self._api_key

    @property
    def session(self) -> aiohttp.ClientSession:
        if self._session is None:
            raise RuntimeError(f"backend {self.name} is not started")
        return self._session

    def url(self, path: str) -> str:
        return self.config.url + path

    def read_timeout(self, read: float) -> aiohttp.ClientTimeout | None:
        """A per-request timeout with another ``read``; None when it is the session's."""
        if not read or read == self.timeouts.read:
            return None
        timeout = self._timeouts_by_read.get(read)
        if timeout is None:
            timeout = aiohttp.ClientTimeout(total=None, connect=None,
                                            sock_connect=self.timeouts.connect, sock_read=read)
            self._timeouts_by_read[read] = timeout
        return timeout

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
        connector = aiohttp.TCPConnector(
            # The gateway enforces max_concurrency itself; the connector limit is a
            # backstop only, never reached in normal operation (a full connector
            # pool would show up as connect timeouts, see NOTES.md).
            limit=self.config.max_concurrency + 16,
            limit_per_host=0,
            keepalive_timeout=30,
            enable_cleanup_closed=True,
        )
        # total=None: a started stream must never be cut by aiohttp's total
        # timeout; the request's deadline is kept by the caller (NOTES.md).
        timeout = aiohttp.ClientTimeout(
            total=None, connect=None,
            sock_connect=self.timeouts.connect, sock_read=self.timeouts.read,
        )
        self._session = aiohttp.ClientSession(
            connector=connector, timeout=timeout, raise_for_status=False,
            skip_auto_headers=("User-Agent",),
        )

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None
