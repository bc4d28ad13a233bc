"""A minimal pipelined Redis connection for the rate-limit script.

Every request makes one rate-limit call, so its cost is on the hot path.
Measured on this machine (uvloop, hiredis), one ``EVALSHA`` costs ~150 us of
CPU through ``redis.asyncio`` (connection pool, command packing, response
callbacks) and ~25 us as bytes on a socket parsed by hiredis. So this module
speaks RESP itself, for the few commands it needs:

- one connection per process, **pipelined**: concurrent callers write their
  commands back to back and Redis answers in order, so replies are matched to
  callers first-in first-out (a caller that gave up still owns its slot; its
  reply is read and dropped, which keeps the order);
- the admission command of a key never changes, so its bytes are built once;
- ``NOSCRIPT`` (Redis restarted or flushed its scripts) is answered by
  sending the script itself once (``EVAL`` caches it again).

Time bounds are the caller's (``asyncio.timeout``); :meth:`abort` drops a
connection that stopped answering, failing everything pending on it.
"""

from __future__ import annotations

import asyncio
import collections
import hashlib
import ssl
from dataclasses import dataclass
from typing import Any, cast
from urllib.parse import unquote, urlsplit

import hiredis


class RedisUnavailable(ConnectionError):
    """The connection failed or closed, or Redis answered with an error."""


CONNECT_TIMEOUT_S = 2.0
"""Bound of a connection attempt and its handshake, whoever waits for it."""


def _bulk(part: bytes | str | int | float) -> bytes:
    data = part if isinstance(part, bytes) else str(part).encode()
    return b"$%d\r\n%s\r\n" % (len(data), data)


def encode(*parts: bytes | str | int | float) -> bytes:
    """One command in RESP (an array of bulk strings)."""
    return b"*%d\r\n" % len(parts) + b"".join(_bulk(part) for part in parts)


@dataclass(frozen=True, slots=True)
class Endpoint:
    host: str
    port: int
    db: int = 0
    username: str | None = None
    password: str | None = None
    tls: bool = False

    @classmethod
    def from_url(cls, url: str) -> Endpoint:
        """``redis://[user:password@]host[:port][/db]`` or ``rediss://`` (TLS)."""
        parts = urlsplit(url)
        path = parts.path.strip("/")
        return cls(host=parts.hostname or "127.0.0.1", port=parts.port or 6379,
                   db=int(path) if path else 0,
                   username=unquote(parts.username) if parts.username else None,
                   password=unquote(parts.password) if parts.password else None,
                   tls=parts.scheme == "rediss")


class _Protocol(asyncio.Protocol):
    """Writes commands, reads replies in order, resolves the callers' futures."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.pending: collections.deque[asyncio.Future[Any]] = collections.deque()
        self.reader = hiredis.Reader()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is not a subclass

    def data_received(self, data: bytes) -> None:
        self.reader.feed(data)
        while (reply := self.reader.gets()) is not False:
            if not self.pending:  # a reply nobody asked for: the stream is out of step
                self.abort(RedisUnavailable("unexpected reply from Redis"))
                return
            future = self.pending.popleft()
            if not future.done():
                future.set_result(reply)

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = None
        error = RedisUnavailable(f"connection to Redis lost: {exc!r}")
        while self.pending:
            future = self.pending.popleft()
            if not future.done():
                future.set_exception(error)

    def send(self, command: bytes) -> asyncio.Future[Any]:
        if self.transport is None or self.transport.is_closing():
            raise RedisUnavailable("not connected to Redis")
        future = asyncio.get_running_loop().create_future()
        self.pending.append(future)
        self.transport.write(command)
        return future

    def abort(self, error: Exception) -> None:
        if self.transport is not None:
            self.transport.abort()  # connection_lost fails what is pending
        self.connection_lost(error)


class ScriptClient:
    """Runs one Lua script on one Redis, pipelined, reconnecting when needed."""

    def __init__(self, url: str, script: str) -> None:
        self._endpoint = Endpoint.from_url(url)
        self._script = script.encode()
        self.sha = hashlib.sha1(self._script).hexdigest().encode()
        self._protocol: _Protocol | None = None
        self._connecting: asyncio.Task[_Protocol] | None = None

    def command(self, keys: list[str], args: list[Any]) -> bytes:
        """The ``EVALSHA`` bytes for these keys and arguments (callers may cache them)."""
        return encode(b"EVALSHA", self.sha, len(keys), *keys, *args)

    async def call(self, command: bytes) -> Any:
        """Send a command built by :meth:`command`; its reply, or RedisUnavailable."""
        reply = await (await self._connected()).send(command)
        if isinstance(reply, hiredis.ReplyError) and str(reply).startswith("NOSCRIPT"):
            reply = await (await self._connected()).send(self._with_script(command))
        if isinstance(reply, hiredis.ReplyError):
            raise RedisUnavailable(f"Redis answered: {reply}")
        return reply

    def _with_script(self, command: bytes) -> bytes:
        """The ``EVAL`` twin of an ``EVALSHA`` command: the script instead of its sha."""
        header_end = command.index(b"\r\n") + 2
        tail = command[header_end + len(_bulk(b"EVALSHA") + _bulk(self.sha)):]
        return command[:header_end] + _bulk(b"EVAL") + _bulk(self._script) + tail

    async def ping(self) -> None:
        reply = await (await self._connected()).send(encode(b"PING"))
        if isinstance(reply, hiredis.ReplyError):
            raise RedisUnavailable(f"Redis answered: {reply}")

    def abort(self) -> None:
        """Drop the connection (it stopped answering); the next call reconnects."""
        if self._protocol is not None:
            self._protocol.abort(RedisUnavailable("connection dropped after a timeout"))
            self._protocol = None

    async def close(self) -> None:
        if self._connecting is not None:
            self._connecting.cancel()
        if self._protocol is not None and self._protocol.transport is not None:
            self._protocol.transport.close()
        self._protocol = None

    async def _connected(self) -> _Protocol:
        protocol = self._protocol
        if protocol is not None and protocol.transport is not None:
            return protocol
        if self._connecting is None or self._connecting.done():
            task = asyncio.get_running_loop().create_task(self._connect())
            # Callers that timed out no longer wait: their failure must not go unread.
            task.add_done_callback(lambda t: t.cancelled() or t.exception())
            self._connecting = task
        # Shielded: a caller that times out does not cancel the others' connection.
        return await asyncio.shield(self._connecting)

    async def _connect(self) -> _Protocol:
        try:
            async with asyncio.timeout(CONNECT_TIMEOUT_S):
                return await self._open()
        except TimeoutError as exc:
            raise RedisUnavailable("connecting to Redis timed out") from exc

    async def _open(self) -> _Protocol:
        endpoint = self._endpoint
        loop = asyncio.get_running_loop()
        try:
            _, protocol = await loop.create_connection(
                _Protocol, endpoint.host, endpoint.port,
                ssl=ssl.create_default_context() if endpoint.tls else None)
        except OSError as exc:
            raise RedisUnavailable(f"cannot connect to Redis: {exc!r}") from exc
        try:
            await self._handshake(protocol)
        except BaseException:
            protocol.abort(RedisUnavailable("handshake failed"))
            raise
        self._protocol = protocol
        return protocol

    async def _handshake(self, protocol: _Protocol) -> None:
        """Credentials, database, and the script (so ``EVALSHA`` finds it)."""
        endpoint = self._endpoint
        commands = []
        if endpoint.password is not None:
            commands.append(encode(b"AUTH", endpoint.username, endpoint.password)
                            if endpoint.username else encode(b"AUTH", endpoint.password))
        if endpoint.db:
            commands.append(encode(b"SELECT", endpoint.db))
        commands.append(encode(b"SCRIPT", b"LOAD", self._script))
        replies = await asyncio.gather(*(protocol.send(command) for command in commands))
        errors = [reply for reply in replies if isinstance(reply, hiredis.ReplyError)]
        if errors:
            raise RedisUnavailable(f"Redis refused the handshake: {errors[0]}")
