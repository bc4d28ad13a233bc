"""Relaying a started stream to the client, across resumed backends.

Once the first byte has gone to the client the request can no longer be
retried, and its ``total`` deadline no longer applies: each upstream stream
("leg") is bounded by the model's streaming policy (first event, silence,
minimum rate, duration). A leg that breaks may be followed by a continuation
on another backend (see :mod:`gateway.upstream.resume`), spliced into the
same client stream. The client's stream ends either with ``[DONE]`` after a
complete answer or with an explicit SSE error event, never with a silent cut.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import aiohttp
from aiohttp import web

from gateway.upstream.http1 import ConnectionBroken, ReadTimedOut, UpstreamResponse
from gateway.upstream.resume import Splice
from gateway.upstream.sse import EventBuffer, ends_with_done, error_event
from gateway.upstream.stream_policy import StreamPolicy, Violation

EventsObserver = Callable[[bytes], None]
BeforeDone = Callable[[], Awaitable[None]]
_MIN_RATE_WINDOW_S = 1.0


@dataclass(slots=True)
class LegOutcome:
    """How one upstream stream ended."""

    completed: bool = False
    """The backend sent ``[DONE]``, and it was forwarded."""
    violation: str | None = None
    """A :class:`Violation` name when the leg ended early."""
    message: str = ""
    client_gone: bool = False


class ClientStream:
    """The client's side of a streamed response: one ``StreamResponse``, many legs."""

    def __init__(self, request: web.Request, headers: dict[str, str], *,
                 keep_events: bool, on_events: EventsObserver | None = None,
                 before_done: BeforeDone | None = None,
                 on_first: Callable[[], None] | None = None) -> None:
        self._request = request
        self.response = _EventStreamResponse(status=200, headers=headers)
        self.emitted = bytearray()
        """Every event forwarded, when ``keep_events`` (needed to resume). One buffer
        rather than a list of runs: a paced stream forwards its events one by one,
        and a bytes object each costs ~50 bytes more than its content."""
        self._keep_events = keep_events
        self._on_events = on_events
        self._before_done = before_done
        self._on_first = on_first
        """Called once, when the first event goes out (time to first token)."""
        """Awaited before ``[DONE]`` is written: a session turn is stored by then."""
        self.resumes = 0
        self.client_gone = False
        self._tail = b""
        """The final events, sent together with the end of the response (one write)."""

    async def open(self) -> bool:
        try:
            await self.response.prepare(self._request)
        except (ConnectionResetError, aiohttp.ClientConnectionResetError):
            self.client_gone = True
        return not self.client_gone

    async def relay(self, upstream: UpstreamResponse, backend_name: str,
                    policy: StreamPolicy, limits: tuple[float, float],
                    splice: Splice | None = None) -> LegOutcome:
        """Forward one leg's events until ``[DONE]`` or a violation of the policy.

        ``limits`` are the leg's effective (read, max_duration) in seconds.
        """
        outcome = LegOutcome()
        try:
            await self._pump(upstream, backend_name, policy, limits, splice, outcome)
        except (ConnectionResetError, aiohttp.ClientConnectionResetError):
            outcome.client_gone = self.client_gone = True
        finally:
            upstream.release(finished=outcome.completed)
        return outcome

    async def fail(self, outcome: LegOutcome) -> None:
        """End the stream with the error event that says why."""
        await self._safe_write(error_event(outcome.message, type="upstream_error",
                                           code=outcome.violation or "upstream_error"))

    async def finish_done(self) -> bool:
        """Send the ``[DONE]`` a backend left out after a complete answer."""
        if self._before_done is not None:
            await self._before_done()
        await self._safe_write(b"data: [DONE]\n\n")
        return not self.client_gone

    async def close(self) -> None:
        if not self.client_gone:
            try:
                await self.response.write_eof(self._tail)
            except (ConnectionResetError, aiohttp.ClientConnectionResetError):
                self.client_gone = True

    async def _safe_write(self, data: bytes) -> None:
        if self.client_gone:
            return
        try:
            await self.response.write(data)
        except (ConnectionResetError, aiohttp.ClientConnectionResetError):
            self.client_gone = True

    async def _pump(self, upstream: UpstreamResponse, backend: str, policy: StreamPolicy,
                    limits: tuple[float, float], splice: Splice | None,
                    outcome: LegOutcome) -> None:
        read, max_duration = limits
        loop = asyncio.get_running_loop()
        started = loop.time()
        first_limit = min(x for x in (policy.ttft_timeout, max_duration, float("inf")) if x)
        events = EventBuffer()
        rate = _RateCheck(policy, loop) if policy.min_tokens_per_second else None
        seen = 0
        try:
            async with asyncio.timeout_at(_at(started, first_limit)) as limit:
                async for chunk in upstream:
                    complete = events.feed(chunk)
                    if not complete:
                        continue
                    if not seen:
                        limit.reschedule(_at(started, max_duration))
                    seen += complete.count(b"data:")
                    if await self._forward(complete, splice):
                        outcome.completed = True
                        return
                    if rate is not None and rate.too_slow(seen):
                        _violated(outcome, Violation.MIN_THROUGHPUT, f"backend {backend} sent "
                                  f"fewer than {policy.min_tokens_per_second:g} tokens/s")
                        return
        except ReadTimedOut:
            _violated(outcome, Violation.READ, f"backend {backend} sent nothing for {read:g} s")
            return
        except TimeoutError:
            if not seen and policy.ttft_timeout and policy.ttft_timeout <= (max_duration or 1e18):
                _violated(outcome, Violation.TTFT, f"backend {backend} sent no token within "
                          f"ttft_timeout = {policy.ttft_timeout:g} s")
            else:
                _violated(outcome, Violation.MAX_DURATION,
                          f"the stream exceeded its maximum duration of {max_duration:g} s")
            return
        except ConnectionBroken:
            # Writing to a client that went away raises ConnectionResetError,
            # which is none of these and reaches relay().
            _violated(outcome, Violation.DISCONNECTED,
                      f"backend {backend} closed the connection mid-stream")
            return
        _violated(outcome, Violation.INCOMPLETE, f"backend {backend} ended the stream "
                  "without [DONE]")

    async def _forward(self, complete: bytes, splice: Splice | None) -> bool:
        """Write a run of events; True when it ended with ``[DONE]``."""
        if splice is not None:
            complete = splice.rewrite(complete)
        done = ends_with_done(complete)
        if done and self.resumes:
            cut = complete.rfind(b"data:")
            complete = (complete[:cut] + f": gateway-resumes={self.resumes}\n\n".encode()
                        + complete[cut:])
        if self._on_first is not None:
            self._on_first()
            self._on_first = None
        if self._keep_events:
            self.emitted += complete
        if self._on_events is not None:
            self._on_events(complete)
        if done and self._before_done is not None:
            cut = complete.rfind(b"data:")
            await self.response.write(complete[:cut])
            await self._before_done()
            complete = complete[cut:]
        if done:
            self._tail = complete  # nothing can follow [DONE]: close() sends it
        else:
            await self.response.write(complete)
        return done


class _EventStreamResponse(web.StreamResponse):
    """A streamed response whose head goes out with its first events, in one write.

    aiohttp sends a ``StreamResponse``'s head on ``prepare()`` by default (a
    write of its own); ``Response`` opts out of that, and so does this. A
    client sees the head when the first token is ready, which for SSE is when
    it has anything to read.
    """

    _send_headers_immediately = False


class _RateCheck:
    """Tokens per second, measured after the first ``min_rate_after_tokens``."""

    def __init__(self, policy: StreamPolicy, loop: asyncio.AbstractEventLoop) -> None:
        self._policy = policy
        self._loop = loop
        self._from: tuple[float, int] | None = None

    def too_slow(self, seen: int) -> bool:
        if seen < self._policy.min_rate_after_tokens:
            return False
        now = self._loop.time()
        if self._from is None:
            self._from = (now, seen)
            return False
        elapsed = now - self._from[0]
        if elapsed < _MIN_RATE_WINDOW_S:
            return False
        return (seen - self._from[1]) / elapsed < self._policy.min_tokens_per_second


def _at(start: float, seconds: float) -> float | None:
    return start + seconds if seconds and seconds != float("inf") else None


def _violated(outcome: LegOutcome, violation: str, message: str) -> None:
    outcome.violation = violation
    outcome.message = message
