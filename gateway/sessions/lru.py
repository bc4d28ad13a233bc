"""An in-process LRU of encoded sessions, bounded by entries and by bytes.

It is both the ``memory`` store and, in front of Redis, the fallback copy
that is kept write-through. It holds the encoded bytes, so its byte bound is
the real size of what it keeps (decoded messages cost several times more in
Python objects) and a fallback read costs the same decode as a read from Redis.

In front of Redis an entry may also carry the decoded session and the token
of the write that stored it: the next turn then asks Redis only whether that
value is still current, and uses the decoded copy without reading or decoding
the value again (:mod:`gateway.sessions.fallback`). Decoded copies are kept
for the most recently used entries only, within a quarter of the byte bound,
and are counted in it at an estimate of their size, so that the copies never
push out more than a quarter of what the fallback can hold. A decoded copy is
shared by every request that continues the session: nothing may mutate its
messages (nothing does; requests build new lists around them).
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, replace

import orjson

from gateway.sessions.state import SessionState

Clock = Callable[[], float]
STATE_SHARE = 4
"""Decoded copies may use at most 1/STATE_SHARE of the byte bound."""
_MESSAGE_OVERHEAD = 400
"""Bytes of a decoded message beyond its text: the dict, its keys, object headers."""


@dataclass(frozen=True, slots=True)
class CachedBlob:
    blob: bytes
    version: int
    expires_at: float
    """On the cache's clock (seconds)."""
    token: bytes | None = None
    """The token of the Redis write that stored ``blob`` (None: not known to be
    what Redis holds, e.g. a fallback write)."""
    state: SessionState | None = None
    """``blob`` decoded, when kept (see the module's docstring)."""


class BlobCache:
    """Least-recently-used map of key → encoded session with an idle TTL."""

    def __init__(self, max_entries: int, max_bytes: int, ttl_seconds: float,
                 clock: Clock = time.monotonic) -> None:
        self._entries: OrderedDict[str, CachedBlob] = OrderedDict()
        self._states: OrderedDict[str, int] = OrderedDict()
        """Keys whose entry has a decoded copy → its estimated size, oldest first."""
        self._max_entries = max_entries
        self._max_bytes = max_bytes
        self._max_state_bytes = max_bytes // STATE_SHARE
        self._ttl = ttl_seconds
        self._clock = clock
        self._bytes = 0
        self._state_bytes = 0

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
        if entry.state is not None:
            self._states.move_to_end(key)
        return entry

    def put(self, key: str, blob: bytes, version: int, token: bytes | None = None,
            state: SessionState | None = None) -> None:
        """Store ``blob`` (its TTL starts again), evicting the least recently used.

        ``state`` is ``blob`` decoded; it is kept if it fits the decoded share.
        """
        self.pop(key)
        state_size = decoded_size(state) if state is not None else 0
        if state_size > self._max_state_bytes:
            state, state_size = None, 0
        size = _size(key, blob) + state_size
        if size > self._max_bytes:
            return  # a value bigger than the whole cache is not kept at all
        self._entries[key] = CachedBlob(blob, version, self._clock() + self._ttl, token, state)
        self._bytes += size
        if state is not None:
            self._states[key] = state_size
            self._state_bytes += state_size
            while self._state_bytes > self._max_state_bytes:
                self._drop_oldest_state()
        while len(self._entries) > self._max_entries or self._bytes > self._max_bytes:
            old_key, old = self._entries.popitem(last=False)
            self._bytes -= _size(old_key, old.blob) + self._forget_state(old_key)

    def pop(self, key: str) -> CachedBlob | None:
        entry = self._entries.pop(key, None)
        if entry is not None:
            self._bytes -= _size(key, entry.blob) + self._forget_state(key)
        return entry

    def _forget_state(self, key: str) -> int:
        """Stop counting ``key``'s decoded copy; its size (0 if it had none)."""
        size = self._states.pop(key, 0)
        self._state_bytes -= size
        return size

    def _drop_oldest_state(self) -> None:
        """The least recently used entry with a decoded copy keeps only its blob."""
        key, size = self._states.popitem(last=False)
        self._state_bytes -= size
        self._bytes -= size
        self._entries[key] = replace(self._entries[key], state=None)  # keeps its place


def decoded_size(state: SessionState) -> int:
    """An estimate of the memory the decoded messages take: two bytes per character
    of text (what a str takes once it holds any non-Latin-1 character; ASCII takes
    one, emoji four) plus a fixed overhead per message. Cheap: no serialization
    unless a message carries more than text."""
    size = 0
    for message in state.messages:
        content = message.get("content")
        if isinstance(content, str):
            size += 2 * len(content)
        elif content is not None:  # parts (text, images) or anything else: its JSON
            size += 2 * len(orjson.dumps(content))
        if len(message) > 2:  # tool calls, names, ids: rare, measured
            size += 2 * len(orjson.dumps({k: v for k, v in message.items()
                                          if k not in ("role", "content")}))
        size += _MESSAGE_OVERHEAD
    return size


def _size(key: str, blob: bytes) -> int:
    return len(key) + len(blob)
