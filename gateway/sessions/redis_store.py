"""The ``redis`` and ``cluster`` stores: sessions in Redis, every call on a budget.

One class serves both: ``redis.asyncio.Redis`` and ``RedisCluster`` take the
same commands, and the compare-and-set script touches one key (one slot).
Every call runs under ``asyncio.timeout(op_timeout)`` on top of the clients'
small socket timeouts (see :mod:`gateway.sessions.factory`), because the
cluster client retries by count, not by time (NOTES.md): whatever Redis does,
a caller waits ``op_timeout`` at most and then gets :class:`StoreUnavailable`.

Replication is asynchronous, so a write the master acknowledged can vanish in
a failover. With ``wait_replicas > 0`` every applied write is followed by
``WAIT``; a write that too few replicas confirmed is reported (``replicated =
False``) and the service keeps it in the compensation log until a later,
idempotent replay confirms it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING

from redis.asyncio import Redis, RedisCluster
from redis.exceptions import RedisClusterException, RedisError

from gateway.sessions.append_script import (
    APPEND_SCRIPT,
    CONTEXT_FIELD,
    WRITTEN,
    WRITTEN_OUTBOX_FULL,
)
from gateway.sessions.keys import SessionKey
from gateway.sessions.store import CasOutcome, StoreUnavailable, reraise_if_cancelled

if TYPE_CHECKING:
    from gateway.archive.record import OutboxEntry

log = logging.getLogger("gateway.sessions")
RedisClient = Redis | RedisCluster
_FAILURES = (RedisError, RedisClusterException, OSError, TimeoutError)



class RedisStore:
    """A :class:`~gateway.sessions.store.SessionStore` on one Redis or one cluster."""

    remote = True

    def __init__(self, client: RedisClient, *, ttl_ms: int, op_timeout_ms: int,
                 wait_replicas: int = 0, warm_connections: int = 0) -> None:
        self._client = client
        self._warm = warm_connections
        self._script = client.register_script(APPEND_SCRIPT)
        self._ttl_ms = ttl_ms
        self._timeout = op_timeout_ms / 1000
        self._wait_replicas = wait_replicas
        # WAIT blocks on the server: leave room for the round trip inside the budget.
        self._wait_ms = max(1, op_timeout_ms * 4 // 5)

    @asynccontextmanager
    async def _bounded(self, what: str, budget: float | None = None) -> AsyncIterator[None]:
        """Run one Redis call within the budget; any failure is :class:`StoreUnavailable`."""
        try:
            async with asyncio.timeout(budget or self._timeout):
                yield
        except _FAILURES as exc:
            reraise_if_cancelled()
            raise StoreUnavailable(f"redis {what} failed: {exc!r}") from exc

    async def ping(self, budget: float | None = None) -> None:
        """Reach the server (a cluster: learn its slots), then warm the pool up."""
        client = self._client
        async with self._bounded("ping", budget):
            if isinstance(client, RedisCluster):
                await client.initialize()
            await client.ping()
        await self._warm_up(budget or self._timeout)

    async def _warm_up(self, budget: float) -> None:
        """Open ``warm_connections`` (per master) now rather than inside a request's
        budget. Best effort: a connection that cannot be opened now is opened later."""
        client = self._client
        if isinstance(client, RedisCluster):
            pings = [client.ping(target_nodes=RedisCluster.PRIMARIES)
                     for _ in range(self._warm)]
        else:
            pings = [client.ping() for _ in range(self._warm)]
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(budget):
                failures = [r for r in await asyncio.gather(*pings, return_exceptions=True)
                            if isinstance(r, BaseException)]
                if failures:
                    log.info("session store: %d of %d warm-up connections failed: %r",
                             len(failures), len(pings), failures[0])

    async def get(self, key: SessionKey) -> bytes | None:
        async with self._bounded("get"):
            return await self._client.hget(key.redis_key, CONTEXT_FIELD)

    async def compare_and_set(self, key: SessionKey, expected_version: int,
                              blob: bytes, new_version: int,
                              outbox: OutboxEntry | None = None) -> CasOutcome:
        keys = [key.redis_key]
        args: list[int | bytes | str] = [expected_version, new_version, blob, self._ttl_ms]
        if outbox is not None:  # same hash tag, same slot: one atomic script
            keys.append(outbox.stream)
            args += [outbox.max_len, outbox.record]
        async with self._bounded("compare-and-set"):
            reply = await self._script(keys=keys, args=args)
        if reply in (WRITTEN, WRITTEN_OUTBOX_FULL):
            return CasOutcome(applied=True, replicated=await self._replicated(key),
                              outbox_refused=reply == WRITTEN_OUTBOX_FULL)
        return CasOutcome(applied=False, current=reply[1] if len(reply) > 1 else None)

    async def delete(self, key: SessionKey) -> bool:
        async with self._bounded("delete"):
            return bool(await self._client.delete(key.redis_key))

    async def ttl_ms(self, key: SessionKey) -> int:
        """Milliseconds until the session expires (-2: absent); for tests and tools."""
        async with self._bounded("pttl"):
            return int(await self._client.pttl(key.redis_key))

    async def close(self) -> None:
        """Close the connections; a server that is gone cannot make this fail."""
        try:
            async with asyncio.timeout(1.0):
                await self._client.aclose()
        except _FAILURES as exc:
            log.warning("closing the session store's connections: %r", exc)

    async def _replicated(self, key: SessionKey) -> bool:
        """Whether ``wait_replicas`` replicas have the write just made (WAIT).

        WAIT counts the writes of the connection it is sent on, and a pool hands
        out any connection: so WAIT follows a ``PEXPIRE`` of the same key on one
        connection. That write comes after ours in the master's replication
        stream, so once it is acknowledged, ours is too.
        """
        if self._wait_replicas == 0:
            return True
        try:
            async with self._bounded("wait"):
                acked = await self._touch_and_wait(key)
        except StoreUnavailable:
            return False
        return acked >= self._wait_replicas

    async def _touch_and_wait(self, key: SessionKey) -> int:
        commands = (("PEXPIRE", key.redis_key, self._ttl_ms),
                    ("WAIT", self._wait_replicas, self._wait_ms))
        if isinstance(self._client, Redis):
            pipe = self._client.pipeline(transaction=False)
            for command in commands:
                pipe.execute_command(*command)
            return int((await pipe.execute())[1])
        node = self._client.get_node_from_key(key.redis_key)
        connection = node.acquire_connection()
        try:
            await connection.send_packed_command(connection.pack_commands(commands))
            await connection.read_response()
            return int(await connection.read_response())
        except BaseException:
            await connection.disconnect()  # a reply may still be on its way: drop it
            raise
        finally:
            node.release(connection)
