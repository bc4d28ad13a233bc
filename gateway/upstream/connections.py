"""Keep-alive HTTP/1.1 connections to one backend, and the POST the gateway makes on them.

One :class:`ConnectionPool` per backend, created at start-up and closed at
shutdown (never one per request). Idle connections are reused newest first
(the ones most likely still open) and dropped after ``keepalive`` seconds of
idleness or when the backend closes them. How many connections are busy is
bounded by the backend's ``max_concurrency``, which the gateway's pool
enforces before a request gets here.

A reused connection can have been closed by the backend just as the request
went out (servers close idle keep-alive connections on their own timer:
uvicorn, hence vLLM, after 5 s). When such a connection fails before a single
byte of the response arrived, the request is sent once more on a new
connection, as Go's and Envoy's clients do: the backend never answered, and
an inference call has no side effect beyond its cost.
"""

from __future__ import annotations

import asyncio
import ssl
from collections import deque
from collections.abc import Mapping
from urllib.parse import urlsplit

from gateway.upstream.http1 import (
    ConnectFailed,
    ConnectionBroken,
    ConnectTimedOut,
    DeadlinePassed,
    Http1Connection,
    UpstreamResponse,
)
from gateway.upstream.watchdog import Watchdog


class ConnectionPool:
    """Connections to the backend at ``base_url`` (``http://host:port[/prefix]``)."""

    def __init__(self, base_url: str, *, connect_timeout: float, keepalive: float = 30.0,
                 max_idle: int = 64) -> None:
        parts = urlsplit(base_url)
        secure = parts.scheme == "https"
        self._host = parts.hostname or "localhost"
        self._port = parts.port or (443 if secure else 80)
        self._ssl: ssl.SSLContext | None = ssl.create_default_context() if secure else None
        authority = parts.netloc.rpartition("@")[2]
        self._path_prefix = parts.path.rstrip("/")
        self._host_line = f" HTTP/1.1\r\nHost: {authority}\r\n"
        self._connect_timeout = connect_timeout
        self._keepalive = keepalive
        self._max_idle = max_idle
        self._idle: deque[Http1Connection] = deque()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._watchdog: Watchdog | None = None
        self._closed = False

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._watchdog = Watchdog(loop)
        self._closed = False

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        if self._loop is None:
            raise RuntimeError("the connection pool is not started")
        return self._loop

    @property
    def idle_count(self) -> int:
        return len(self._idle)

    async def post(self, path: str, body: bytes, headers: Mapping[str, str], *,
                   read: float, deadline: float | None) -> UpstreamResponse:
        """POST ``body``; return once the response's head is in.

        ``read`` bounds silence (seconds), ``deadline`` (loop time) the wait for
        the head, connecting included. Raises an
        :class:`~gateway.upstream.http1.UpstreamError`. The caller must
        ``release()`` the response.
        """
        message = self._encode(path, body, headers)
        connection = self._take_idle()
        if connection is not None:
            try:
                return await _exchange(connection, message, read, deadline)
            except ConnectionBroken as broken:
                if not broken.nothing_received:
                    raise
        connection = await self._connect(deadline)
        return await _exchange(connection, message, read, deadline)

    def close(self) -> None:
        """Close the idle connections; busy ones close when their exchange ends."""
        self._closed = True
        while self._idle:
            self._idle.pop().close()
        if self._watchdog is not None:
            self._watchdog.close()

    def _encode(self, path: str, body: bytes, headers: Mapping[str, str]) -> list[bytes]:
        lines = "".join([f"{name}: {value}\r\n" for name, value in headers.items()])
        if lines.count("\n") != len(headers) or lines.count("\r") != len(headers):
            raise ValueError("a header for the backend contains a line break")
        head = (f"POST {self._path_prefix}{path}{self._host_line}{lines}"
                f"Content-Length: {len(body)}\r\n\r\n")
        # Client header values were decoded by aiohttp as UTF-8 with surrogateescape.
        return [head.encode("utf-8", "surrogateescape"), body]

    def _take_idle(self) -> Http1Connection | None:
        idle = self._idle
        now = self.loop.time()
        while idle:
            connection = idle.pop()
            if connection.is_open and now - connection.idle_since < self._keepalive:
                return connection
            connection.close()
        return None

    def _keep(self, connection: Http1Connection) -> None:
        """A connection whose exchange ended cleanly: keep it for the next request."""
        idle = self._idle
        if self._closed or len(idle) >= self._max_idle:
            connection.close()
            return
        idle.append(connection)
        oldest_allowed = connection.idle_since - self._keepalive
        while idle and (not idle[0].is_open or idle[0].idle_since < oldest_allowed):
            idle.popleft().close()

    async def _connect(self, deadline: float | None) -> Http1Connection:
        loop, watchdog = self.loop, self._watchdog
        assert watchdog is not None
        limit = self._connect_timeout
        by_deadline = deadline is not None and deadline - loop.time() < limit
        if by_deadline:
            limit = max(0.0, deadline - loop.time())  # type: ignore[operator]
        try:
            async with asyncio.timeout(limit):
                _, connection = await loop.create_connection(
                    lambda: Http1Connection(loop, self._keep, watchdog), self._host, self._port,
                    ssl=self._ssl)
        except TimeoutError:
            if by_deadline:
                raise DeadlinePassed("no connection before the deadline") from None
            raise ConnectTimedOut(f"no connection within {self._connect_timeout:g} s") from None
        except OSError as exc:
            raise ConnectFailed(f"cannot connect: {exc}", exc) from None
        return connection


async def _exchange(connection: Http1Connection, message: list[bytes], read: float,
                    deadline: float | None) -> UpstreamResponse:
    response = connection.send(message, read, deadline)
    try:
        return await response.started()
    except BaseException:
        response.release()  # incomplete: the connection closes
        raise
