"""The ``sharded`` store: several standalone Redis servers, each owning whole buckets.

The configuration maps every bucket to one server. Resharding moves whole
buckets: copy every key matching ``{prefix}{shard_NN}:*`` of the moved
buckets to the new server (``SCAN`` + ``MIGRATE``), then switch the map. A
session never spans servers, so its compare-and-set stays a single-server
script, and the bucket's outbox (issue 5) lives beside its sessions.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from gateway.sessions.keys import SessionKey
from gateway.sessions.redis_store import RedisStore
from gateway.sessions.store import CasOutcome, Held, Stored

if TYPE_CHECKING:
    from gateway.archive.record import OutboxEntry


class ShardedStore:
    """Routes each call to the server that owns the key's bucket."""

    remote = True

    def __init__(self, servers: Sequence[RedisStore], owner: Mapping[int, int]) -> None:
        """``owner`` maps a bucket to an index into ``servers``."""
        self._servers = tuple(servers)
        self._owner = dict(owner)

    def _server(self, key: SessionKey) -> RedisStore:
        return self._servers[self._owner[key.bucket]]

    async def ping(self, budget: float | None = None) -> None:
        for server in self._servers:
            await server.ping(budget)

    async def get(self, key: SessionKey) -> bytes | None:
        return await self._server(key).get(key)

    async def read(self, key: SessionKey, held: Held | None = None) -> Stored | None:
        return await self._server(key).read(key, held)

    async def compare_and_set(self, key: SessionKey, expected_version: int,
                              blob: bytes, new_version: int,
                              outbox: OutboxEntry | None = None) -> CasOutcome:
        """The bucket's outbox lives on the bucket's server: one script there."""
        return await self._server(key).compare_and_set(key, expected_version, blob,
                                                       new_version, outbox)

    async def delete(self, key: SessionKey) -> bool:
        return await self._server(key).delete(key)

    async def ttl_ms(self, key: SessionKey) -> int:
        return await self._server(key).ttl_ms(key)

    async def close(self) -> None:
        for server in self._servers:
            await server.close()
