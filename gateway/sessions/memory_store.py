"""The ``memory`` store: sessions in this process only (the embedded default).

Nothing survives a restart and replicas do not share sessions: fine for one
process and for tests, use ``redis`` or ``cluster`` in production. Every call
completes without awaiting, so it is atomic on the event loop.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from gateway.sessions.keys import SessionKey
from gateway.sessions.lru import BlobCache
from gateway.sessions.store import CasOutcome, Held, Stored

if TYPE_CHECKING:
    from gateway.archive.record import OutboxEntry


class MemoryStore:
    """A :class:`~gateway.sessions.store.SessionStore` over a :class:`BlobCache`."""

    remote = False

    def __init__(self, cache: BlobCache) -> None:
        self._cache = cache

    async def ping(self, budget: float | None = None) -> None:
        return None

    async def get(self, key: SessionKey) -> bytes | None:
        entry = self._cache.get(key.redis_key)
        return entry.blob if entry is not None else None

    async def read(self, key: SessionKey, held: Held | None = None) -> Stored:
        """Always the value: this store is the process's own memory, nothing to save."""
        return Stored(await self.get(key))

    async def compare_and_set(self, key: SessionKey, expected_version: int,
                              blob: bytes, new_version: int,
                              outbox: OutboxEntry | None = None) -> CasOutcome:
        """No await between the check and the writes: atomic on the event loop."""
        entry = self._cache.get(key.redis_key)
        current_version = entry.version if entry is not None else 0
        if current_version != expected_version:
            return CasOutcome(applied=False, current=entry.blob if entry else None)
        self._cache.put(key.redis_key, blob, new_version)
        refused = outbox is not None and not outbox.local(outbox.record)
        return CasOutcome(applied=True, outbox_refused=refused)

    async def delete(self, key: SessionKey) -> bool:
        return self._cache.pop(key.redis_key) is not None

    async def close(self) -> None:
        return None
