"""Redis with a safety net: the write-through LRU and the compensation log.

Normal operation: reads and writes go to Redis, and every value read or
written is also put in the local LRU, decoded and with the token of the Redis
write that stored it. A read then asks Redis whether that value is still
current (one small script call,
:data:`~gateway.sessions.append_script.READ_SCRIPT`): if it is, the decoded
copy is used as it is; if anything changed it (another gateway, a delete, an
expiry), Redis sends the current value in the same round trip. So the history
a backend receives is always Redis's current one, and a session that stays
with one gateway costs neither a transfer nor a decode per turn. Only a copy
known to be what Redis holds carries a token: one changed by a fallback write
never passes for current.

When a Redis call fails or exceeds its budget: a read is answered from the
LRU (``degraded``), a write is applied to the LRU copy and kept in the
compensation log for the replayer. While a session has writes in the log, its
reads are Redis's copy with those writes applied on top, and its new writes
queue behind them.

With the ``memory`` store there is nothing to fall back from: the store is
the LRU, and this layer only runs the append loop.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

from gateway.sessions.appender import (
    AppendConflict,
    AppendPolicy,
    AppendResult,
    ForeignSession,
    Snapshot,
    append_turn,
    decode_for,
)
from gateway.sessions.codec import CorruptSession, encode
from gateway.sessions.compensation import CompensationLog, PendingWrite, ReplayFailed
from gateway.sessions.deadlines import Deadlines
from gateway.sessions.keys import SessionKey
from gateway.sessions.lru import BlobCache, CachedBlob
from gateway.sessions.state import SessionState, Turn, apply_turn, apply_turns
from gateway.sessions.stats import Counters
from gateway.sessions.store import Held, SessionStore, Stored, StoreUnavailable

log = logging.getLogger("gateway.sessions")
_UNAVAILABLE = (StoreUnavailable, AppendConflict, TimeoutError)
_UNREADABLE = (CorruptSession, ForeignSession)


@dataclass(frozen=True, slots=True)
class Loaded:
    state: SessionState | None
    degraded: bool
    """Redis did not answer, or writes it has not seen yet were merged in."""
    answered: bool = True
    """Redis answered (False: ``state`` is only what the local LRU has)."""
    snapshot: Snapshot | None = None
    """What the store returned, when ``state`` is exactly that: a commit can start there."""


class ResilientStore:
    """Loads, appends and deletes sessions; never raises for Redis trouble."""

    def __init__(self, primary: SessionStore, cache: BlobCache | None,
                 log_: CompensationLog, policy: AppendPolicy, commit_timeout_s: float,
                 counters: Counters, wake: Callable[[], None]) -> None:
        """``wake`` tells the replayer that the log has new entries."""
        self._primary = primary
        self._cache = cache if primary.remote else None
        self._log = log_
        self._policy = policy
        self._commit_budget = Deadlines(commit_timeout_s)
        self._counters = counters
        self._wake = wake

    async def load(self, key: SessionKey) -> Loaded:
        entry = self._cache.get(key.redis_key) if self._cache is not None else None
        held = _held(entry)
        try:
            stored = await self._primary.read(key, held)
            hit = stored is None
            if stored is None:  # the decoded copy is still what Redis holds
                assert entry is not None
                stored, state = Stored(entry.blob, entry.token), entry.state
            else:
                state = decode_for(key, stored.blob)
        except StoreUnavailable:
            return self._load_local(key)
        except _UNREADABLE as exc:
            log.error("session %s is unreadable, using the local copy: %s", key.redis_key, exc)
            return self._load_local(key)
        pending = self._log.pending(key)
        if pending:
            merged = apply_turns(state, pending, key.tenant, key.session_id,
                                 self._policy.limits)
            return Loaded(merged, degraded=True)
        if self._cache is not None and not hit:
            if stored.blob is None or state is None:
                self._cache.pop(key.redis_key)
            else:
                self._cache.put(key.redis_key, stored.blob, state.version, stored.token, state)
        return Loaded(state, degraded=False,
                      snapshot=Snapshot(state, stored.blob, stored.token))

    async def append(self, key: SessionKey, turn: Turn, start: Snapshot | None = None) -> bool:
        """Store ``turn`` (on top of ``start`` if given); True when it went to the fallback."""
        if self._cache is None:
            # the memory store: nothing to fall back to
            await self._append_primary(key, turn, start)
            return False
        if not self._log.has(key):
            try:
                result = await self._append_primary(key, turn, start)
            except (*_UNAVAILABLE, *_UNREADABLE) as exc:
                log.warning("session %s: append falls back: %r", key.redis_key, exc)
            else:
                self._cache.put(key.redis_key, result.blob, result.state.version,
                                result.token, result.state)
                if not result.replicated:
                    self._counters.unreplicated += 1
                    self._log.add(key, turn)  # replayed (idempotently) to confirm it
                    self._wake()
                return False
        self._append_local(key, turn)
        return True

    async def _append_primary(self, key: SessionKey, turn: Turn,
                              start: Snapshot | None = None) -> AppendResult:
        """The whole append loop within the commit budget (one shared timer for every
        append: :mod:`~gateway.sessions.deadlines`)."""
        return await self._commit_budget.run(append_turn(
            self._primary, key, turn, self._policy, self._counters, start))

    async def delete(self, key: SessionKey) -> bool:
        """Remove the session; whether it existed (True when Redis could not tell)."""
        if self._cache is None:
            return await self._primary.delete(key)
        self._cache.pop(key.redis_key)
        if not self._log.has(key):
            try:
                return await self._primary.delete(key)
            except StoreUnavailable as exc:
                log.warning("session %s: delete falls back: %r", key.redis_key, exc)
        self._counters.fallback_writes += 1
        if self._log.add(key, None):
            self._wake()
        return True

    async def replay(self, entry: PendingWrite) -> bool:
        """Write one compensation entry to Redis (see :class:`Replayer`)."""
        try:
            if entry.turn is None:
                await self._primary.delete(entry.key)
                return True
            result = await self._append_primary(entry.key, entry.turn)
        except _UNAVAILABLE as exc:
            raise ReplayFailed(repr(exc)) from exc
        except _UNREADABLE as exc:
            log.error("session %s is unreadable; a pending turn is dropped: %s",
                      entry.key.redis_key, exc)
            return False
        if not result.replicated:
            raise ReplayFailed(f"{entry.key.redis_key}: too few replicas acknowledged")
        return True

    def _load_local(self, key: SessionKey) -> Loaded:
        self._counters.fallback_reads += 1
        if self._cache is None:
            return Loaded(None, degraded=True, answered=False)
        return Loaded(self._local_state(key), degraded=True, answered=False)

    def _append_local(self, key: SessionKey, turn: Turn) -> None:
        """Apply ``turn`` to the LRU copy and keep it in the compensation log."""
        assert self._cache is not None
        self._counters.fallback_writes += 1
        if not self._log.add(key, turn):
            return
        self._wake()
        current = self._local_state(key)
        updated = apply_turn(current, turn, key.tenant, key.session_id, self._policy.limits)
        if updated is not None:  # no token: this copy is not what Redis holds
            self._cache.put(key.redis_key, encode(updated, self._policy.codec), updated.version)

    def _local_state(self, key: SessionKey) -> SessionState | None:
        """The LRU's copy, decoded (None when there is none or it is unreadable)."""
        assert self._cache is not None
        entry = self._cache.get(key.redis_key)
        if entry is None:
            return None
        if entry.state is not None:
            return entry.state
        try:
            return decode_for(key, entry.blob)
        except _UNREADABLE:
            return None


def _held(entry: CachedBlob | None) -> Held | None:
    """What a read may skip: a decoded copy of a value as Redis stored it (with the
    token of that write). A copy without a token (a fallback write) never qualifies."""
    if entry is None or entry.token is None or entry.state is None:
        return None
    return Held(entry.version, entry.token)
