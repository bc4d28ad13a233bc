"""How the Redis store reaches its server(s): a lean path for one server, redis-py's for a cluster.

Why not ``Redis.execute_command`` for a standalone server: on the session path
each call cost ~200 µs of CPU there (bench/sessions_cpu.py, 16 callers, this
repository's 2-core benchmark machine), against ~60 µs here. Per call it took
the ``BlockingConnectionPool``'s condition, lock, ``can_read`` probe and
observability records; ``asyncio.wait_for`` around every send because of the
socket timeout (a task per call on Python 3.11) and a timer around every read;
a ``Retry`` wrapper with closures; ``AsyncScript`` on top for the script; and
per-argument encoding in ``pack_command``.

:class:`ServerLink` keeps what matters from redis-py — the connection
(``rediss://`` TLS, AUTH and SELECT from the URL), the hiredis reply parser and
the error classes — and replaces the rest: its own bounded LIFO pool, commands
packed by hiredis in C, and no socket timeout. Every call through a link runs
within the caller's budget, which cancels the calling task at its deadline
(:class:`~gateway.sessions.redis_store.RedisStore` does that with one shared
timer, :mod:`~gateway.sessions.deadlines`): the budget, not the socket,
bounds it. A connection whose call did not complete is dropped, so a late
reply can never be read as the next caller's. Callers beyond
``max_connections`` wait for a connection inside their budget, as they did
with the blocking pool.

:class:`ClusterLink` keeps ``RedisCluster``, which follows slot moves and
failovers; its per-node pool fails at once when exhausted (NOTES.md), hence the
larger default limit for the cluster.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Sequence
from typing import Any, Protocol

import hiredis
from redis.asyncio import ConnectionPool, RedisCluster
from redis.asyncio.connection import AbstractConnection
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import ResponseError

Command = tuple[Any, ...]
"""A command and its arguments (str, bytes or int)."""


class Link(Protocol):
    """Commands to Redis; the caller bounds every call (its task is cancelled at the
    deadline: ``asyncio.timeout``, or the store's shared timer)."""

    async def call(self, *args: Any) -> Any:
        """One command's reply; an error reply raises its ``ResponseError``."""
        ...

    async def call_together(self, key: str, commands: Sequence[Command]) -> list[Any]:
        """Several commands sent at once on one connection (the one serving ``key``)."""
        ...

    async def connect(self) -> None:
        """Reach the server (a cluster: learn its slots)."""
        ...

    async def warm(self, count: int) -> list[BaseException]:
        """Open ``count`` connections (per master) now; the failures."""
        ...

    async def aclose(self) -> None:
        ...


class ServerLink:
    """One standalone server, through a bounded pool of redis-py connections."""

    def __init__(self, url: str, max_connections: int, options: dict[str, Any]) -> None:
        """``options``: redis-py connection options; ``socket_timeout`` is not used."""
        options = {**options, "socket_timeout": None}
        # Only a factory: it turns the URL into connection settings, as for any client.
        self._factory = ConnectionPool.from_url(url, **options)
        self._idle: list[AbstractConnection] = []
        self._made: set[AbstractConnection] = set()
        self._slots = asyncio.Semaphore(max_connections)

    async def call(self, *args: Any) -> Any:
        return (await self._exchange(hiredis.pack_command(args), 1))[0]

    async def call_together(self, key: str, commands: Sequence[Command]) -> list[Any]:
        packed = b"".join(hiredis.pack_command(command) for command in commands)
        return await self._exchange(packed, len(commands))

    async def connect(self) -> None:
        await self.call("PING")

    async def warm(self, count: int) -> list[BaseException]:
        """Concurrent PINGs: each takes a connection of its own while none is idle."""
        results = await asyncio.gather(*(self.call("PING") for _ in range(count)),
                                       return_exceptions=True)
        return [r for r in results if isinstance(r, BaseException)]

    async def aclose(self) -> None:
        made, self._made, self._idle = self._made, set(), []
        await asyncio.gather(*(c.disconnect() for c in made), return_exceptions=True)

    async def _exchange(self, packed: bytes, replies: int) -> list[Any]:
        """Send ``packed`` and read ``replies`` replies on one pooled connection.

        A connection that was open before this call may have been closed by
        the server in the meantime (a restart, an idle timeout): the exchange
        is then tried once more on a new connection, as redis-py's one retry
        did. The commands that go through here tolerate that repetition: reads
        and PEXPIRE are idempotent, a repeated DEL can only misreport whether
        the session existed (as with redis-py), and a compare-and-set that did
        apply is refused the second time with the value it wrote, which the
        append loop recognises as its own turn.
        """
        async with self._slots:
            connection = self._idle.pop() if self._idle else self._make()
            try:
                reused = connection.is_connected
                try:
                    result = await self._send_and_read(connection, packed, replies)
                except RedisConnectionError:
                    if not reused:
                        raise
                    result = await self._send_and_read(connection, packed, replies)
            except ResponseError:
                raise  # an error reply: every reply was read, the connection is fine
            except BaseException:
                # Cancelled or failed midway: a reply may still be on its way.
                with contextlib.suppress(Exception):
                    await connection.disconnect(nowait=True)
                raise
            finally:
                self._idle.append(connection)
        return result

    @staticmethod
    async def _send_and_read(connection: AbstractConnection, packed: bytes,
                             replies: int) -> list[Any]:
        """Every reply is read before an error reply is raised: the connection stays
        in step (one reply per command sent)."""
        await connection.send_packed_command(packed, check_health=False)
        results: list[Any] = []
        error: ResponseError | None = None
        for _ in range(replies):
            try:
                results.append(await connection.read_response())
            except ResponseError as exc:
                error = error or exc
                results.append(exc)
        if error is not None:
            raise error
        return results

    def _make(self) -> AbstractConnection:
        connection = self._factory.make_connection()
        self._made.add(connection)
        return connection


class ClusterLink:
    """A Redis Cluster, through ``RedisCluster`` (slot routing, redirects, failover)."""

    def __init__(self, client: RedisCluster) -> None:
        self._client = client

    async def call(self, *args: Any) -> Any:
        """Routed by the command's key (for a script: its first key)."""
        return await self._client.execute_command(*args)

    async def call_together(self, key: str, commands: Sequence[Command]) -> list[Any]:
        """On a connection of the master that serves ``key``."""
        node = self._client.get_node_from_key(key)
        connection = node.acquire_connection()
        try:
            await connection.send_packed_command(connection.pack_commands(commands))
            return [await connection.read_response() for _ in commands]
        except BaseException:
            await connection.disconnect()  # a reply may still be on its way: drop it
            raise
        finally:
            node.release(connection)

    async def connect(self) -> None:
        await self._client.initialize()
        await self._client.ping()

    async def warm(self, count: int) -> list[BaseException]:
        pings = [self._client.ping(target_nodes=RedisCluster.PRIMARIES) for _ in range(count)]
        results = await asyncio.gather(*pings, return_exceptions=True)
        return [r for r in results if isinstance(r, BaseException)]

    async def aclose(self) -> None:
        await self._client.aclose()
