"""A session's contents, and the one way they change: appending a turn.

Everything here is a pure function of values, so the compare-and-set loop,
the fallback cache and the compensation replay all merge turns the same way:
a turn whose id the session already has is skipped (idempotence), a turn's
system message replaces the stored one, and the stored history is compacted to
``max_stored_messages`` so a session's value cannot grow without bound.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

Message = dict[str, Any]
"""One OpenAI chat message (``{"role": ..., "content": ...}``), as JSON decodes it."""

SYSTEM = "system"
_EMPTY_PARTS: Mapping[str, bytes] = MappingProxyType({})


@dataclass(frozen=True, slots=True)
class TurnMeta:
    """What the archive records about the request behind a turn (issue 5).

    The session itself never reads it: it travels with the turn only so that
    the archive record, written in the same atomic step, can carry it.
    """

    model: str | None = None
    """The model that served (the requested one or a fallback)."""
    backend: str | None = None
    """The backend that served."""
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    total_tokens: int | None = None
    started_ms: int | None = None
    """When the gateway received the request (unix ms)."""

    @classmethod
    def of(cls, model: str | None, backend: str | None, usage: Any = None,
           started_ms: int | None = None) -> TurnMeta:
        """From an OpenAI ``usage`` object as the backend sent it (anything else: no usage)."""
        usage = usage if isinstance(usage, Mapping) else {}

        def tokens(name: str) -> int | None:
            value = usage.get(name)
            is_count = isinstance(value, int) and not isinstance(value, bool) and value >= 0
            return value if is_count else None

        return cls(model, backend, tokens("prompt_tokens"), tokens("completion_tokens"),
                   tokens("total_tokens"), started_ms)


@dataclass(frozen=True, slots=True)
class Turn:
    """What one successful request adds to its session."""

    turn_id: str
    """The request id: appending the same turn twice stores it once."""
    messages: tuple[Message, ...]
    """The client's new non-system messages, then the assistant's reply."""
    system: Message | None
    """The client's system message, if it sent one: it replaces the stored one."""
    ts_ms: int
    """When the turn was committed (unix ms)."""
    meta: TurnMeta | None = None
    """Model, backend, token usage, for the archive; not stored in the session."""


@dataclass(frozen=True, slots=True)
class HistoryLimits:
    """Bounds on what one stored session keeps."""

    max_stored_messages: int = 1000
    """Oldest non-system messages beyond this are dropped when a turn is appended."""
    idempotency_window: int = 64
    """How many recent turn ids are remembered to recognise a repeated turn."""


@dataclass(frozen=True, slots=True)
class SessionState:
    """A decoded session: the conversation plus the bookkeeping of the wire format."""

    tenant: str
    session_id: str
    messages: tuple[Message, ...] = ()
    """The stored conversation; the system message, if any, is first."""
    version: int = 0
    turns: int = 0
    created_ts: int = 0
    last_active_ts: int = 0
    recent_turn_ids: tuple[str, ...] = ()
    codec: int = 0
    """Codec tag of the stored copy (0: not stored yet, the configured codec applies)."""
    other_parts: Mapping[str, bytes] = field(default_factory=lambda: _EMPTY_PARTS)
    """Parts other than "messages", still compressed with ``codec``: carried unchanged."""

    def has_turn(self, turn_id: str) -> bool:
        return turn_id in self.recent_turn_ids


def apply_turn(current: SessionState | None, turn: Turn, tenant: str, session_id: str,
               limits: HistoryLimits) -> SessionState | None:
    """The session after ``turn``, or None when the turn is already in it."""
    base = current if current is not None else SessionState(
        tenant=tenant, session_id=session_id, created_ts=turn.ts_ms)
    if base.has_turn(turn.turn_id):
        return None
    system, past = split_system(base.messages)
    if turn.system is not None:
        system = turn.system
    kept = compact([*past, *turn.messages], limits.max_stored_messages)
    messages = ((system,) if system is not None else ()) + tuple(kept)
    recent = (*base.recent_turn_ids, turn.turn_id)[-limits.idempotency_window:]
    # The constructor, not dataclasses.replace: once per turn, and replace costs
    # twice as much (it walks the fields by name).
    return SessionState(
        tenant=base.tenant, session_id=base.session_id, messages=messages,
        version=base.version + 1, turns=base.turns + 1, created_ts=base.created_ts,
        last_active_ts=max(base.last_active_ts, turn.ts_ms), recent_turn_ids=recent,
        codec=base.codec, other_parts=base.other_parts)


def apply_turns(current: SessionState | None, turns: Sequence[Turn | None], tenant: str,
                session_id: str, limits: HistoryLimits) -> SessionState | None:
    """Apply writes in order; ``None`` is a delete (the session starts over after it)."""
    state = current
    for turn in turns:
        if turn is None:
            state = None
            continue
        state = apply_turn(state, turn, tenant, session_id, limits) or state
    return state


def split_system(messages: Sequence[Message]) -> tuple[Message | None, list[Message]]:
    """The leading system message (if any) and the rest."""
    if messages and messages[0].get("role") == SYSTEM:
        return messages[0], list(messages[1:])
    return None, list(messages)


def compact(messages: list[Message], max_messages: int) -> list[Message]:
    """Keep the newest ``max_messages``, starting at a user message.

    A history that starts with an assistant reply or a tool result (whose
    request was cut away) confuses models and is rejected by some backends.
    """
    if len(messages) <= max_messages:
        return messages
    return drop_orphan_replies(messages[len(messages) - max_messages:])


def drop_orphan_replies(messages: list[Message]) -> list[Message]:
    """Drop leading messages until the first user message."""
    for index, message in enumerate(messages):
        if message.get("role") == "user":
            return messages[index:]
    return []
