"""Appending a turn: read, merge, compare-and-set, and again on a conflict.

Two requests on one session at once both land: each builds the new value from
the version it read, the store accepts only the one whose version is still
current, and the other retries on the value the store returned with its
refusal. A turn already in the session (same id) is not appended again, which
makes a retry after a lost reply, or a compensation replay, harmless.

With an archive, every attempt carries the turn's archive record, built from
the session as that attempt would write it: the store adds the record exactly
when the attempt applies, so a turn is archived once, with the turn number it
really got, and a duplicate (found already stored) adds no record.
"""

from __future__ import annotations

import asyncio
import random
from dataclasses import dataclass
from typing import TYPE_CHECKING

from gateway.sessions.codec import SNAPPY, Codec, decode, encode
from gateway.sessions.keys import SessionKey
from gateway.sessions.state import HistoryLimits, SessionState, Turn, apply_turn
from gateway.sessions.stats import Counters
from gateway.sessions.store import SessionStore

if TYPE_CHECKING:
    from gateway.archive.record import OutboxPolicy

_BACKOFF_STEP_S = 0.001
_BACKOFF_CAP_S = 0.02


class AppendConflict(Exception):
    """Every compare-and-set attempt lost to another writer."""


class ForeignSession(ValueError):
    """The stored value belongs to another tenant or session id: never merge into it."""


@dataclass(frozen=True, slots=True)
class AppendPolicy:
    limits: HistoryLimits
    max_attempts: int = 100
    codec: Codec = SNAPPY
    outbox: OutboxPolicy | None = None
    """The archive's: each applied append adds the turn's record to the outbox."""


@dataclass(frozen=True, slots=True)
class AppendResult:
    state: SessionState
    """The session as stored after the append."""
    blob: bytes
    """Its encoded bytes (for the write-through cache)."""
    duplicate: bool
    """The turn was already stored; nothing was written."""
    replicated: bool = True
    token: bytes | None = None
    """The token of the stored value (Redis stores), for the write-through cache."""


def decode_for(key: SessionKey, blob: bytes | None) -> SessionState | None:
    """Decode a stored value and check that it is this tenant's session."""
    if blob is None:
        return None
    state = decode(blob)
    if state.tenant != key.tenant or state.session_id != key.session_id:
        raise ForeignSession(f"{key.redis_key} holds session {state.session_id!r} "
                             f"of tenant {state.tenant!r}")
    return state


@dataclass(frozen=True, slots=True)
class Snapshot:
    """A session as it was read (by the request's load), to write on top of."""

    state: SessionState | None
    blob: bytes | None
    token: bytes | None = None
    """The token of the write that stored ``blob`` (None: unknown)."""


async def append_turn(store: SessionStore, key: SessionKey, turn: Turn, policy: AppendPolicy,
                      counters: Counters, start: Snapshot | None = None) -> AppendResult:
    """Append ``turn`` atomically; raises the store's errors and :class:`AppendConflict`.

    With ``start`` the first attempt writes on top of it without reading the
    session again: if it is stale, the refusal carries the current value, so a
    stale start costs what the read would have cost.
    """
    if start is None:
        stored = await store.read(key)
        assert stored is not None  # nothing was held, so the value comes back
        start = Snapshot(decode_for(key, stored.blob), stored.blob, stored.token)
    snapshot = start
    for attempt in range(policy.max_attempts):
        current = snapshot.state
        updated = apply_turn(current, turn, key.tenant, key.session_id, policy.limits)
        if updated is None:
            assert current is not None and snapshot.blob is not None  # a duplicate is stored
            return AppendResult(current, snapshot.blob, duplicate=True, token=snapshot.token)
        new_blob = encode(updated, policy.codec)
        expected = current.version if current is not None else 0
        outbox = policy.outbox.entry(key, updated, turn) if policy.outbox else None
        outcome = await store.compare_and_set(key, expected, new_blob, updated.version,
                                              outbox)
        if outcome.applied:
            if outcome.outbox_refused and policy.outbox is not None:
                policy.outbox.refused(key)
            return AppendResult(updated, new_blob, duplicate=False,
                                replicated=outcome.replicated, token=outcome.token)
        counters.conflicts += 1
        snapshot = Snapshot(decode_for(key, outcome.current), outcome.current, outcome.token)
        if attempt:
            # Lost again: real contention. Exponential backoff with full jitter
            # spreads the writers, so the next round has fewer losers.
            cap = min(_BACKOFF_CAP_S, _BACKOFF_STEP_S * 2 ** min(attempt, 10))
            await asyncio.sleep(random.uniform(0, cap))
    raise AppendConflict(f"{key.redis_key}: {policy.max_attempts} compare-and-set "
                         "attempts lost to concurrent writers")
