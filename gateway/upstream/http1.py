"""A lean HTTP/1.1 client connection for the hop to a backend.

Why not aiohttp's client: on the gateway's hot path it cost ~165 µs of CPU per
request (a ``ClientRequest`` and ``ClientResponse`` per call, automatic
headers, a task per send, a timer rescheduled per chunk; bench/RESULTS.md).
The backend hop needs much less: POST a JSON body over a keep-alive
connection and read a response, streamed or whole, with three limits. This
module does that on a plain :class:`asyncio.Protocol` with the llhttp parser
(through ``httptools``), and the pool in :mod:`gateway.upstream.connections`
keeps connections alive.

Timeouts follow the gateway's layered model (DESIGN.md): silence longer than
``read`` between received bytes fails with :class:`ReadTimedOut`; the
request's deadline bounds the wait for the response head
(:class:`DeadlinePassed`), and an optional body deadline bounds a whole body.
The pool's :class:`~gateway.upstream.watchdog.Watchdog` checks both for every
exchange in flight a few times a second: a received chunk only records the
time, and no exchange owns a timer.

Back-pressure: body bytes wait in a small buffer; above ``HIGH_WATER`` the
connection stops reading from the socket until the consumer catches up, so a
slow client slows the backend down instead of growing the gateway's memory.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import httptools
from multidict import CIMultiDict, CIMultiDictProxy

from gateway.upstream.watchdog import Watchdog

HIGH_WATER = 256 * 1024
"""Buffered body bytes above which reading from the backend pauses."""
LOW_WATER = 64 * 1024
_MAX_HEAD = 64 * 1024
"""A response head (status line and headers) larger than this is refused."""
LINGER_S = 2.0
"""How long a finished reader's connection waits for the end of its message."""
_LINGER_BYTES = 64 * 1024
"""How much of a finished reader's body may still arrive before the connection is dropped."""


class UpstreamError(Exception):
    """The exchange with a backend failed; the connection is not reused."""


class ConnectFailed(UpstreamError):
    """No connection: refused, unreachable, name not resolved."""

    def __init__(self, message: str, os_error: OSError | None = None) -> None:
        super().__init__(message)
        self.os_error = os_error


class ConnectTimedOut(UpstreamError):
    """No TCP (and TLS) connection within the connect timeout."""


class ReadTimedOut(UpstreamError):
    """Nothing received for longer than the read timeout."""


class DeadlinePassed(UpstreamError):
    """The response (head, or whole body when bounded) did not come in time."""


class ConnectionBroken(UpstreamError):
    """Closed, reset or unreadable before the response was complete."""

    def __init__(self, message: str, *, nothing_received: bool = False) -> None:
        super().__init__(message)
        self.nothing_received = nothing_received
        """No byte of the response arrived: on a reused keep-alive connection this is
        the server having closed it while idle, and a new connection may be tried."""


class UpstreamResponse:
    """A backend's response: status and headers at once, the body as it arrives.

    Iterate it (``async for chunk in response``) for the body as it comes,
    or ``await read()`` for all of it. Call :meth:`release` when done: a
    complete response hands its connection back for reuse, an incomplete one
    closes it.
    """

    __slots__ = ("_buffered", "_chunks", "_complete", "_connection", "_deadline", "_error",
                 "_last_data", "_lingering", "_loop", "_paused", "_read", "_released",
                 "_waiter", "_watchdog", "_whole",
                 "headers", "status")

    def __init__(self, connection: Http1Connection, read: float, deadline: float | None) -> None:
        self._connection = connection
        self._loop = connection.loop
        self._read = read
        self._deadline = deadline
        self._last_data = self._loop.time()
        self._watchdog = connection.watchdog
        self._waiter: asyncio.Future[None] | None = None
        self._chunks = connection.body  # filled by the parser, emptied by the reader
        self._buffered = 0
        self._complete = False
        self._paused = False
        self._released = False
        self._lingering = False
        self._whole = False
        """The reader takes the whole body at once: holding the backend back would
        only stall it (a large non-streaming answer must not wait on itself)."""
        self._error: UpstreamError | None = None
        self.status = 0
        self.headers: CIMultiDictProxy[str] = _NO_HEADERS

    @property
    def content_type(self) -> str:
        value = self.headers.get("Content-Type", "")
        return value.partition(";")[0].strip().lower()

    @property
    def complete(self) -> bool:
        return self._complete

    @property
    def buffered(self) -> int:
        """Body bytes received and not yet taken by the reader."""
        return self._buffered

    @property
    def reading_paused(self) -> bool:
        """Whether the backend is being held back because the reader is behind."""
        return self._paused

    async def started(self) -> UpstreamResponse:
        """Wait until the status and headers are in (bounded by the request's deadline)."""
        while not self.status:
            await self._wait()
        return self

    async def read(self, within: float = 0.0) -> bytes:
        """The whole body; ``within`` seconds at most when set (else only silence is bounded)."""
        if within:
            self._deadline = self._loop.time() + within
        self._whole = True
        if self._paused:
            self._paused = False
            self._connection.resume_reading()
        while not self._complete:
            await self._wait()
        body = b"".join(self._chunks)
        self._chunks.clear()
        self._buffered = 0
        return body

    def __aiter__(self) -> UpstreamResponse:
        return self

    async def __anext__(self) -> bytes:
        while not self._chunks:
            if self._complete:
                raise StopAsyncIteration
            await self._wait()
        chunks = self._chunks
        data = chunks[0] if len(chunks) == 1 else b"".join(chunks)
        chunks.clear()
        self._buffered = 0
        if self._paused:
            self._paused = False
            self._last_data = self._loop.time()  # silence counts again from now
            self._connection.resume_reading()
        return data

    def release(self, *, finished: bool = False) -> None:
        """Give the connection back (complete response) or close it (anything else).

        ``finished``: the reader has all it needs (an SSE stream's ``[DONE]``)
        and only the end of the message (a chunked body's last, empty chunk)
        may still be on its way. The connection then waits for it, ``LINGER_S``
        at most, and is reused instead of being closed and opened again.
        """
        if self._released:
            return
        self._released = True
        if finished and not self._complete and self._error is None:
            self._lingering = True
            self._chunks.clear()
            self._deadline = self._loop.time() + LINGER_S
            return
        self._watchdog.forget(self)
        self._connection.exchange_done(self, reusable=self._complete and self._error is None)

    async def _wait(self) -> None:
        if self._error is not None:
            raise self._error
        self._waiter = waiter = self._loop.create_future()
        try:
            await waiter
        finally:
            self._waiter = None
        if self._error is not None:
            raise self._error

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    # Called by the connection.

    def head_received(self, status: int, headers: CIMultiDict[str]) -> None:
        self.status = status
        self.headers = CIMultiDictProxy(headers)
        self._deadline = None  # the request's deadline ends when the response starts
        self._wake()

    def data_arrived(self, size: int) -> None:
        """``size`` bytes were read from the socket (body bytes, if any, are in)."""
        self._last_data = self._loop.time()
        if self._lingering:
            self._chunks.clear()
            self._buffered += size
            if self._buffered > _LINGER_BYTES:
                self._connection.abort(self, ConnectionBroken("more body than expected"))
            return
        if self._chunks:
            self._buffered += size  # framing included: a watermark needs no precision
            if self._buffered > HIGH_WATER and not self._paused and not self._whole:
                self._paused = True
                self._connection.pause_reading()
        self._wake()

    def completed(self) -> None:
        self._complete = True
        self._watchdog.forget(self)
        if self._lingering:
            self._connection.exchange_done(self, reusable=True)
        self._wake()

    def failed(self, error: UpstreamError) -> None:
        if self._complete or self._error is not None:
            return
        self._error = error
        self._watchdog.forget(self)
        if self._lingering:
            self._connection.exchange_done(self, reusable=False)
        self._wake()

    def check_time(self, now: float) -> None:
        """The watchdog's periodic look: fail the exchange if a limit has passed."""
        if self._complete or self._error is not None:
            self._watchdog.forget(self)
            return
        if self._deadline is not None and now >= self._deadline:
            self._connection.abort(self, DeadlinePassed("the response did not come in time"))
            return
        if self._read and not self._paused and now - self._last_data >= self._read:
            self._connection.abort(self, ReadTimedOut(f"nothing received for {self._read:g} s"))
            return
        if self._paused:
            self._last_data = now  # a slow client is not a silent backend


_NO_HEADERS: CIMultiDictProxy[str] = CIMultiDictProxy(CIMultiDict())


class Http1Connection(asyncio.Protocol):
    """One keep-alive connection to a backend, carrying one exchange at a time."""

    def __init__(self, loop: asyncio.AbstractEventLoop,
                 on_idle: Callable[[Http1Connection], None], watchdog: Watchdog) -> None:
        self.loop = loop
        self.watchdog = watchdog
        self.is_open = False
        self.reused = False
        self.idle_since = 0.0
        self._on_idle = on_idle
        self._transport: asyncio.Transport | None = None
        self._response: UpstreamResponse | None = None
        self._received = 0
        self._raw_headers: list[tuple[str, str]] = []
        self.body: list[bytes] = []
        """Body chunks of the current response, not yet read."""
        # The parser calls on_body once per chunk (an SSE backend sends one per
        # event): a bound list.append costs no Python frame. httptools looks the
        # callbacks up when the parser is created, so this comes first.
        self.on_body = self.body.append
        self._parser = httptools.HttpResponseParser(self)
        self._eof_delimited = False
        self._informational = False
        self._keep_alive = False

    # asyncio.Protocol

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = transport  # type: ignore[assignment]
        self.is_open = True

    def data_received(self, data: bytes) -> None:
        response = self._response
        if response is None:  # unsolicited bytes on an idle connection
            self.close()
            return
        self._received += len(data)
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserError as exc:
            self.abort(response, ConnectionBroken(f"invalid HTTP response: {exc}"))
            return
        if not response.status and self._received > _MAX_HEAD:
            self.abort(response, ConnectionBroken("the response head is too large"))
            return
        response.data_arrived(len(data))

    def connection_lost(self, exc: Exception | None) -> None:
        self.is_open = False
        response = self._response
        if response is None:
            return
        if self._eof_delimited and response.status:
            response.completed()  # a body delimited by the end of the connection
            return
        reason = f": {exc}" if exc else ""
        response.failed(ConnectionBroken(f"the backend closed the connection{reason}",
                                         nothing_received=self._received == 0))

    def pause_reading(self) -> None:
        if self._transport is not None and self.is_open:
            self._transport.pause_reading()

    def resume_reading(self) -> None:
        if self._transport is not None and self.is_open:
            self._transport.resume_reading()

    # httptools callbacks

    def on_header(self, name: bytes, value: bytes) -> None:
        self._raw_headers.append((name.decode("latin-1"), value.decode("latin-1")))

    def on_headers_complete(self) -> None:
        response = self._response
        assert response is not None
        headers: CIMultiDict[str] = CIMultiDict(self._raw_headers)
        self._raw_headers = []
        status = self._parser.get_status_code()
        if status < 200:  # 100 Continue, 103 Early Hints: the real response follows
            self._informational = True
            return
        self._eof_delimited = ("Content-Length" not in headers
                               and "chunked" not in headers.get("Transfer-Encoding", "").lower()
                               and status not in (204, 304))
        response.head_received(status, headers)

    def on_message_complete(self) -> None:
        if self._informational:
            self._informational = False
            return
        assert self._response is not None
        self._keep_alive = self._parser.should_keep_alive()
        self._response.completed()

    # the exchange

    def send(self, request: list[bytes], read: float,
             deadline: float | None) -> UpstreamResponse:
        """Write one request (its parts in one system call); the response fills in as the
        backend answers."""
        assert self._transport is not None and self._response is None
        response = UpstreamResponse(self, read, deadline)
        self._response = response
        self._received = 0
        self._keep_alive = False
        self.body.clear()
        self._transport.writelines(request)
        self.watchdog.watch(response)
        return response

    def exchange_done(self, response: UpstreamResponse, *, reusable: bool) -> None:
        if response is not self._response:
            return
        self._response = None
        if reusable and self.is_open and self._keep_alive:
            self.reused = True
            self.idle_since = self.loop.time()
            self._on_idle(self)
        else:
            self.close()

    def abort(self, response: UpstreamResponse, error: UpstreamError) -> None:
        """Fail the exchange and drop the connection (its state is unknown)."""
        response.failed(error)
        self.close()

    def close(self) -> None:
        self.is_open = False
        if self._transport is not None:
            self._transport.close()
