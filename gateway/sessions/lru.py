"""An in-process LRU of encoded sessions, bounded by entries and by bytes.

It is both the ``memory`` store and, in front of Redis, the fallback copy
that is kept write-through. It holds the encoded bytes rather than decoded
objects, so its byte bound is the real size of what it keeps (decoded
messages cost ten times more in Python objects) and a read costs the same
decode as a read from Redis.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

Clock = Callable[[], float]


@dataclass(frozen=True, slots=True)
class CachedBlob:
    blob: bytes
    version: int
    expires_at: float
    """On the cache's clock (seconds)."""


class BlobCache:
    """Least-recently-used map of key → encoded session with an idle TTL."""

    def __init__(self, max_entries: int, max_bytes: int, ttl_seconds: float,
                 clock: Clock = time.monotonic) -> None:
        self._entries: OrderedDict[str, CachedBlob] = OrderedDict()
        self._max_entries = max_entries
        self._max_bytes = max_bytes
        self._ttl = ttl_seconds
        self._clock = clock
        self._bytes = 0

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def size_bytes(self) -> int:
        return self._bytes

    def get(self, key: str) -> CachedBlob | None:
        """The live entry (now most recently used), or None if absent or expired."""
        entry = self._entries.get(key)
        if entry is None:
            return None
        if entry.expires_at <= self._clock():
            self.pop(key)
            return None
        self._entries.move_to_end(key)
        return entry

    def put(self, key: str, blob: bytes, version: int) -> None:
        """Store ``blob`` (its TTL starts again), evicting the least recently used."""
        self.pop(key)
        size = _size(key, blob)
        if size > self._max_bytes:
            return  # a value bigger than the whole cache is not kept at all
        self._entries[key] = CachedBlob(blob, version, self._clock() + self._ttl)
        self._bytes += size
        while len(self._entries) > self._max_entries or self._bytes > self._max_bytes:
            old_key, old = self._entries.popitem(last=False)
            self._bytes -= _size(old_key, old.blob)

    def pop(self, key: str) -> CachedBlob | None:
        entry = self._entries.pop(key, None)
        if entry is not None:
            self._bytes -= _size(key, entry.blob)
        return entry


def _size(key: str, blob: bytes) -> int:
    return len(key) + len(blob)
