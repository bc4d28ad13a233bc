"""The archive record of one turn, and how a session write hands it to the outbox.

The record is built by the session append from the session *as written*
(its turn number comes from the compare-and-set that succeeded) and travels
with that write: the Redis stores add it to the bucket's outbox stream inside
the compare-and-set script, the memory store puts it on the local queue in
the same event-loop step. So a turn is in the outbox exactly when it is in the
session, and a duplicate append (same turn id) writes neither.

This module is imported by the session layer on every append, so it is kept
light: no SQLAlchemy, no Redis.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import orjson

from gateway.sessions.keys import KeyScheme, SessionKey
from gateway.sessions.state import Message, SessionState, Turn

log = logging.getLogger("gateway.archive")
FORMAT_VERSION = 1
_LOG_EVERY = 1000


class BadRecord(ValueError):
    """Bytes from the outbox that are not an archive record this gateway can write."""


@dataclass(frozen=True, slots=True)
class ArchiveRecord:
    """One turn as the archive stores it: one row per message."""

    tenant: str
    session_id: str
    request_id: str
    """The turn id (the request id): with the session, the record's identity."""
    turn_seq: int
    """The session's turn counter once this turn was appended (1 for the first)."""
    ts_ms: int
    """When the turn was committed (unix ms): the lag is measured from here."""
    messages: tuple[Message, ...]
    """The turn's system message if it sent one, its new messages, then the reply."""
    model: str | None = None
    backend: str | None = None
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    total_tokens: int | None = None
    started_ms: int | None = None


def record_of(key: SessionKey, state: SessionState, turn: Turn) -> ArchiveRecord:
    """The record of ``turn`` appended to ``key``, which is now ``state``."""
    messages = ((turn.system,) if turn.system is not None else ()) + turn.messages
    meta = turn.meta
    if meta is None:
        return ArchiveRecord(key.tenant, key.session_id, turn.turn_id, state.turns,
                             turn.ts_ms, messages)
    return ArchiveRecord(key.tenant, key.session_id, turn.turn_id, state.turns, turn.ts_ms,
                         messages, _name(meta.model), _name(meta.backend),
                         _tokens(meta.prompt_tokens), _tokens(meta.completion_tokens),
                         _tokens(meta.total_tokens), _tokens(meta.started_ms))


def _tokens(value: Any) -> int | None:
    """A count as the record keeps it: whatever a backend sent that is not one, None
    (a malformed ``usage`` must not make the whole turn unarchivable)."""
    is_count = isinstance(value, int) and not isinstance(value, bool) and value >= 0
    return value if is_count else None


def _name(value: Any) -> str | None:
    return value if isinstance(value, str) and value else None


def encode_record(record: ArchiveRecord) -> bytes:
    return orjson.dumps({
        "v": FORMAT_VERSION, "tenant": record.tenant, "session": record.session_id,
        "request": record.request_id, "seq": record.turn_seq, "ts": record.ts_ms,
        "messages": record.messages, "model": record.model, "backend": record.backend,
        "prompt_tokens": record.prompt_tokens, "completion_tokens": record.completion_tokens,
        "total_tokens": record.total_tokens, "started": record.started_ms})


def decode_record(raw: bytes) -> ArchiveRecord:
    """Parse and check a record; :class:`BadRecord` names what is wrong."""
    try:
        data = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise BadRecord(f"not JSON: {exc}") from None
    if not isinstance(data, dict) or data.get("v") != FORMAT_VERSION:
        raise BadRecord(f"not an archive record of format {FORMAT_VERSION}")
    messages = data.get("messages")
    if not isinstance(messages, list) or not all(
            isinstance(m, dict) and isinstance(m.get("role"), str) for m in messages):
        raise BadRecord("'messages' is not a list of messages with a string role")
    return ArchiveRecord(
        tenant=_text(data, "tenant"), session_id=_text(data, "session"),
        request_id=_text(data, "request"), turn_seq=_count(data, "seq"),
        ts_ms=_count(data, "ts"), messages=tuple(messages),
        model=_text(data, "model", optional=True),
        backend=_text(data, "backend", optional=True),
        prompt_tokens=_count(data, "prompt_tokens", optional=True),
        completion_tokens=_count(data, "completion_tokens", optional=True),
        total_tokens=_count(data, "total_tokens", optional=True),
        started_ms=_count(data, "started", optional=True))


def _text(data: dict[str, Any], name: str, *, optional: bool = False) -> Any:
    value = data.get(name)
    if (value is None and optional) or (isinstance(value, str) and value):
        return value
    raise BadRecord(f"{name!r} is not a non-empty string: {value!r}"[:200])


def _count(data: dict[str, Any], name: str, *, optional: bool = False) -> Any:
    value = data.get(name)
    if value is None and optional:
        return None
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return value
    raise BadRecord(f"{name!r} is not a count: {value!r}"[:200])


LocalSink = Callable[[bytes], bool]
"""Takes a record for the local queue; False when the queue is full."""


@dataclass(frozen=True, slots=True)
class OutboxEntry:
    """The record a compare-and-set adds to the outbox when (and only when) it applies."""

    stream: str
    """The bucket's outbox stream, ``{prefix}{shard_NN}:outbox`` (the session's slot)."""
    max_len: int
    """Records the stream may hold; a record that finds it full is refused and counted."""
    record: bytes
    local: LocalSink
    """Where a store without Redis (``memory``) puts the record instead."""


class OutboxPolicy:
    """How the session layer builds outbox entries, and counts refused ones.

    One per :class:`~gateway.archive.service.ArchiveService`; the session
    service passes it to every append (``AppendPolicy.outbox``).
    """

    def __init__(self, keys: KeyScheme, max_records: int, local: LocalSink,
                 on_refused: Callable[[], None]) -> None:
        """``max_records`` bounds all buckets together: each gets its share."""
        self._keys = keys
        self._per_bucket = max(1, -(-max_records // keys.buckets))
        self._local = local
        self._on_refused = on_refused
        self._refused = 0

    @property
    def per_bucket(self) -> int:
        return self._per_bucket

    def entry(self, key: SessionKey, state: SessionState, turn: Turn) -> OutboxEntry:
        record = encode_record(record_of(key, state, turn))
        return OutboxEntry(self._keys.outbox_key(key.bucket), self._per_bucket, record,
                           self._local)

    def refused(self, key: SessionKey) -> None:
        """The session was written but its outbox was full: this turn is not archived."""
        self._on_refused()
        self._refused += 1
        if self._refused % _LOG_EVERY == 1:
            log.error("archive outbox full (%d records per bucket): the turn of %s is not "
                      "archived (%d refused so far)", self._per_bucket, key.redis_key,
                      self._refused)
