"""Relaying a started stream from a backend to the client.

Once the first byte has gone to the client the request can no longer be
retried, and its ``total`` deadline no longer applies: the stream is bounded by
``read`` (silence between chunks, enforced by the backend session's socket
timeout) and ``stream_max``. A stream ends either with the backend's
``[DONE]`` or with an explicit SSE error event, never with a silent cut.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass

import aiohttp
from aiohttp import web

from gateway.upstream.backend import Backend
from gateway.upstream.sse import EventBuffer, ends_with_done, error_event

EventsObserver = Callable[[bytes], None]
_BACKEND_FAULTS = frozenset({"stream_read_timeout", "upstream_disconnected",
                             "upstream_incomplete"})


@dataclass(slots=True)
class StreamOutcome:
    """How a relayed stream ended."""

    completed: bool = False
    """The backend sent ``[DONE]`` and the client received it."""
    error_code: str | None = None
    """Why the stream was ended with an error event (None when completed)."""
    client_gone: bool = False

    @property
    def backend_failed(self) -> bool:
        """Whether the backend is to blame (for its breaker): it stalled, broke or cut short."""
        return self.error_code in _BACKEND_FAULTS


async def relay_stream(request: web.Request, upstream: aiohttp.ClientResponse,
                       backend: Backend, headers: dict[str, str],
                       on_events: EventsObserver | None = None) -> tuple[web.StreamResponse,
                                                                          StreamOutcome]:
    """Forward SSE events from ``upstream`` to the client as they arrive."""
    response = web.StreamResponse(status=upstream.status, headers=headers)
    outcome = StreamOutcome()
    try:
        await response.prepare(request)
        code, message = await _pump(upstream, response, backend, outcome, on_events)
        if code is not None:
            outcome.error_code = code
            await response.write(error_event(message, type="upstream_error", code=code))
        await response.write_eof()
    except (ConnectionResetError, aiohttp.ClientConnectionResetError):
        outcome.client_gone = True
    finally:
        upstream.release()
    return response, outcome


async def _pump(upstream: aiohttp.ClientResponse, response: web.StreamResponse,
                backend: Backend, outcome: StreamOutcome,
                on_events: EventsObserver | None) -> tuple[str | None, str]:
    """Copy whole events until ``[DONE]``; on failure return (code, message)."""
    events = EventBuffer()
    stream_max = backend.timeouts.stream_max
    try:
        async with asyncio.timeout(stream_max or None):
            async for chunk in upstream.content.iter_any():
                complete = events.feed(chunk)
                if not complete:
                    continue
                if on_events is not None:
                    on_events(complete)
                await response.write(complete)
                if ends_with_done(complete):
                    outcome.completed = True
                    return None, ""
    except aiohttp.SocketTimeoutError:
        return "stream_read_timeout", (
            f"backend {backend.name} sent nothing for {backend.timeouts.read:g} s")
    except TimeoutError:
        return "stream_max_exceeded", (
            f"the stream exceeded stream_max = {stream_max:g} s")
    except (aiohttp.ClientPayloadError, aiohttp.ServerDisconnectedError,
            aiohttp.ClientOSError):
        # Writing to a client that went away raises ConnectionResetError, which
        # is none of these and reaches relay_stream.
        return "upstream_disconnected", (
            f"backend {backend.name} closed the connection mid-stream")
    return "upstream_incomplete", (
        f"backend {backend.name} ended the stream without [DONE]")
