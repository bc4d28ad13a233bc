"""The ``redis`` and ``cluster`` stores: sessions in Redis, every call on a budget.

One class serves both through a :class:`~gateway.sessions.redis_link.Link`
(a lean pool for one server, ``RedisCluster`` for a cluster): the scripts
touch one key (one slot), so they run the same everywhere. Every call runs
under the ``op_timeout`` budget (one shared timer,
:mod:`~gateway.sessions.deadlines`, cancels a call at its deadline), because
the cluster client retries by count, not by time (NOTES.md), and the
standalone link has no socket timeout of its own: whatever Redis does, a
caller waits ``op_timeout`` at most and then gets :class:`StoreUnavailable`.

Scripts are called by SHA (``EVALSHA``). A server that does not know one (it
restarted, or a replica just took over) answers ``NOSCRIPT``; the call is then
made once with the source (``EVAL``), which loads it for the next calls.

Replication is asynchronous, so a write the master acknowledged can vanish in
a failover. With ``wait_replicas > 0`` every applied write is followed by
``WAIT``; a write that too few replicas confirmed is reported (``replicated =
False``) and the service keeps it in the compensation log until a later,
idempotent replay confirms it.
"""

from __future__ import annotations

import asyncio
import binascii
import contextlib
import hashlib
import logging
import os
from collections.abc import Awaitable
from typing import TYPE_CHECKING, Any, TypeVar

from redis.exceptions import NoScriptError, RedisClusterException, RedisError

from gateway.sessions.append_script import (
    APPEND_SCRIPT,
    CONTEXT_FIELD,
    READ_SCRIPT,
    UNCHANGED,
    WRITTEN,
    WRITTEN_OUTBOX_FULL,
)
from gateway.sessions.deadlines import Deadlines
from gateway.sessions.keys import SessionKey
from gateway.sessions.redis_link import Link
from gateway.sessions.store import (
    CasOutcome,
    Held,
    Stored,
    StoreUnavailable,
    reraise_if_cancelled,
)

if TYPE_CHECKING:
    from gateway.archive.record import OutboxEntry

log = logging.getLogger("gateway.sessions")
_FAILURES = (RedisError, RedisClusterException, OSError, TimeoutError)
_T = TypeVar("_T")


class _Script:
    """A script's source and SHA, and the ``EVALSHA`` / ``EVAL`` fallback."""

    def __init__(self, source: str) -> None:
        self.source = source
        self.sha = hashlib.sha1(source.encode()).hexdigest()

    async def run(self, link: Link, keys: list[str], args: list[Any]) -> Any:
        try:
            return await link.call("EVALSHA", self.sha, len(keys), *keys, *args)
        except NoScriptError:
            return await link.call("EVAL", self.source, len(keys), *keys, *args)


_APPEND = _Script(APPEND_SCRIPT)
_READ = _Script(READ_SCRIPT)


def new_token() -> bytes:
    """A write's token: 64 random bits, hex (readable in ``redis-cli``)."""
    return binascii.hexlify(os.urandom(8))


class RedisStore:
    """A :class:`~gateway.sessions.store.SessionStore` on one Redis or one cluster."""

    remote = True

    def __init__(self, link: Link, *, ttl_ms: int, op_timeout_ms: int,
                 wait_replicas: int = 0, warm_connections: int = 0) -> None:
        self._link = link
        self._warm = warm_connections
        self._ttl_ms = ttl_ms
        self._timeout = op_timeout_ms / 1000
        self._deadlines = Deadlines(self._timeout)
        self._wait_replicas = wait_replicas
        # WAIT blocks on the server: leave room for the round trip inside the budget.
        self._wait_ms = max(1, op_timeout_ms * 4 // 5)

    async def ping(self, budget: float | None = None) -> None:
        """Reach the server (a cluster: learn its slots), then warm the pool up."""
        try:
            async with asyncio.timeout(budget or self._timeout):
                await self._link.connect()
        except _FAILURES as exc:
            raise _unavailable("ping", exc) from exc
        await self._warm_up(budget or self._timeout)

    async def _warm_up(self, budget: float) -> None:
        """Open ``warm_connections`` (per master) now rather than inside a request's
        budget. Best effort: a connection that cannot be opened now is opened later."""
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(budget):
                failures = await self._link.warm(self._warm)
                if failures:
                    log.info("session store: %d of %d warm-up connections failed: %r",
                             len(failures), self._warm, failures[0])

    async def get(self, key: SessionKey) -> bytes | None:
        """The stored value (``HGET``; for tests and tools: the service uses :meth:`read`)."""
        return await self._bounded("get", self._link.call("HGET", key.redis_key,
                                                          CONTEXT_FIELD))

    async def read(self, key: SessionKey, held: Held | None = None) -> Stored | None:
        """One script call: nothing comes back when ``held`` is still current."""
        args = [held.version, held.token] if held is not None else [0, b""]
        reply = await self._bounded("read", _READ.run(self._link, [key.redis_key], args))
        if reply == UNCHANGED:
            return None
        return Stored(reply[0], reply[1])

    async def compare_and_set(self, key: SessionKey, expected_version: int,
                              blob: bytes, new_version: int,
                              outbox: OutboxEntry | None = None) -> CasOutcome:
        keys = [key.redis_key]
        token = new_token()
        args: list[Any] = [expected_version, new_version, blob, self._ttl_ms, token]
        if outbox is not None:  # same hash tag, same slot: one atomic script
            keys.append(outbox.stream)
            args += [outbox.max_len, outbox.record]
        reply = await self._bounded("compare-and-set", _APPEND.run(self._link, keys, args))
        if reply in (WRITTEN, WRITTEN_OUTBOX_FULL):
            return CasOutcome(applied=True, replicated=await self._replicated(key),
                              outbox_refused=reply == WRITTEN_OUTBOX_FULL, token=token)
        return CasOutcome(applied=False, current=_item(reply, 1), token=_item(reply, 2))

    async def delete(self, key: SessionKey) -> bool:
        return bool(await self._bounded("delete", self._link.call("DEL", key.redis_key)))

    async def ttl_ms(self, key: SessionKey) -> int:
        """Milliseconds until the session expires (-2: absent); for tests and tools."""
        return int(await self._bounded("pttl", self._link.call("PTTL", key.redis_key)))

    async def close(self) -> None:
        """Close the connections; a server that is gone cannot make this fail."""
        try:
            async with asyncio.timeout(1.0):
                await self._link.aclose()
        except _FAILURES as exc:
            log.warning("closing the session store's connections: %r", exc)

    async def _bounded(self, what: str, call: Awaitable[_T]) -> _T:
        """Await one Redis call within the budget; any failure is :class:`StoreUnavailable`.

        A plain coroutine rather than a context manager, and one shared timer
        (:class:`~gateway.sessions.deadlines.Deadlines`) rather than an
        ``asyncio.timeout`` per call: this runs twice per request, and each of
        those costs a generator, frames, or a timer handle more.
        """
        try:
            return await self._deadlines.run(call)
        except _FAILURES as exc:
            raise _unavailable(what, exc) from exc

    async def _replicated(self, key: SessionKey) -> bool:
        """Whether ``wait_replicas`` replicas have the write just made (WAIT).

        WAIT counts the writes of the connection it is sent on, and a pool hands
        out any connection: so WAIT follows a ``PEXPIRE`` of the same key on one
        connection. That write comes after ours in the master's replication
        stream, so once it is acknowledged, ours is too.
        """
        if self._wait_replicas == 0:
            return True
        commands = (("PEXPIRE", key.redis_key, self._ttl_ms),
                    ("WAIT", self._wait_replicas, self._wait_ms))
        try:
            replies = await self._bounded("wait",
                                          self._link.call_together(key.redis_key, commands))
        except StoreUnavailable:
            return False
        return int(replies[1]) >= self._wait_replicas


def _item(reply: list[Any], index: int) -> Any:
    """An element of a script's array reply (None past its end)."""
    return reply[index] if len(reply) > index else None


def _unavailable(what: str, exc: BaseException) -> StoreUnavailable:
    reraise_if_cancelled()
    return StoreUnavailable(f"redis {what} failed: {exc!r}")
