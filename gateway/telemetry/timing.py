"""The clock readings of one request, shared by its metrics and its log line.

"Gateway overhead" is the time a request spent anywhere but waiting on a
backend: parsing, routing, retry bookkeeping, relaying, and event-loop delay.
It is measured by subtraction, so every await that waits on a backend must
be added to :attr:`RequestTimings.upstream`: the attempt until its response
starts (or its whole body, when not streaming), each read of a stream, the
backoff sleep before a retry and the wait for a free backend slot (those two
are the backends' doing, and show in the retry and shedding metrics).

``perf_counter`` throughout: monotonic, and the cheapest clock with
sub-microsecond resolution.
"""

from __future__ import annotations

from time import perf_counter


class RequestTimings:
    """Start, first token, end and backend wait time of one request (seconds)."""

    __slots__ = ("ended", "first_token", "started", "upstream")

    def __init__(self, started: float | None = None) -> None:
        self.started = perf_counter() if started is None else started
        self.upstream = 0.0
        """Seconds spent waiting on backends (see the module docstring)."""
        self.first_token: float | None = None
        self.ended: float | None = None

    def add_upstream_since(self, since: float) -> float:
        """Count ``perf_counter() - since`` as backend wait; returns the reading taken."""
        now = perf_counter()
        self.upstream += now - since
        return now

    def mark_first_token(self) -> None:
        """The first token was written to the client (later calls are ignored)."""
        if self.first_token is None:
            self.first_token = perf_counter()

    def finish(self) -> None:
        """The last byte was sent, or the request failed (later calls are ignored)."""
        if self.ended is None:
            self.ended = perf_counter()

    @property
    def total(self) -> float:
        end = self.ended if self.ended is not None else perf_counter()
        return end - self.started

    @property
    def ttft(self) -> float | None:
        return None if self.first_token is None else self.first_token - self.started

    @property
    def overhead(self) -> float:
        return max(0.0, self.total - self.upstream)
