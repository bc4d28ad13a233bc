"""The stored bytes of a session: a ``SessionContext`` protobuf with compressed parts.

Each named part of ``compressed_state`` is compressed on its own, so a reader
can decompress only the part it needs, and parts written by others (an
application's preferences, say) are carried through an append without being
touched. The context names its codec, so a second codec (zstd, with or without
a trained dictionary) can be added to :data:`CODECS` later and old values stay
readable. Only the ``messages`` part is decoded by the gateway.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from types import MappingProxyType

import orjson
import snappy
from google.protobuf.message import DecodeError

from gateway.sessions.session_context_pb2 import CODEC_SNAPPY, SessionContext
from gateway.sessions.state import SessionState

MESSAGES_PART = "messages"


class CorruptSession(ValueError):
    """Stored bytes that are not a session this gateway can read."""


@dataclass(frozen=True, slots=True)
class Codec:
    """A compression scheme for the parts, under the tag stored with them."""

    tag: int
    name: str
    compress: Callable[[bytes], bytes]
    decompress: Callable[[bytes], bytes]


SNAPPY = Codec(CODEC_SNAPPY, "snappy", snappy.compress, snappy.decompress)
CODECS: Mapping[int, Codec] = MappingProxyType({SNAPPY.tag: SNAPPY})
CODECS_BY_NAME: Mapping[str, Codec] = MappingProxyType({c.name: c for c in CODECS.values()})


def encode(state: SessionState, default_codec: Codec = SNAPPY) -> bytes:
    """Serialize ``state``; a new session gets ``default_codec``, a stored one keeps its own."""
    codec = CODECS[state.codec] if state.codec else default_codec
    context = SessionContext(
        session_id=state.session_id, last_active_ts=state.last_active_ts,
        version=state.version, tenant=state.tenant, codec=codec.tag,  # type: ignore[arg-type]
        turns=state.turns, recent_turn_ids=state.recent_turn_ids,
        created_ts=state.created_ts)
    if state.other_parts:  # the generic Mapping update costs more than it does here
        context.compressed_state.update(state.other_parts)
    context.compressed_state[MESSAGES_PART] = codec.compress(orjson.dumps(state.messages))
    return context.SerializeToString(deterministic=True)


def decode(blob: bytes) -> SessionState:
    """Parse stored bytes; :class:`CorruptSession` if they are not a readable session."""
    try:
        context = SessionContext.FromString(blob)
    except DecodeError as exc:
        raise CorruptSession(f"not a SessionContext: {exc}") from None
    codec = CODECS.get(context.codec)
    if codec is None:
        raise CorruptSession(f"unknown codec tag {context.codec}")
    parts = dict(context.compressed_state)
    raw = parts.pop(MESSAGES_PART, None)
    messages = _messages(codec, raw) if raw is not None else ()
    return SessionState(
        tenant=context.tenant, session_id=context.session_id, messages=messages,
        version=context.version, turns=context.turns, created_ts=context.created_ts,
        last_active_ts=context.last_active_ts,
        recent_turn_ids=tuple(context.recent_turn_ids), codec=codec.tag,
        other_parts=MappingProxyType(parts))


def _messages(codec: Codec, raw: bytes) -> tuple[dict, ...]:
    try:
        messages = orjson.loads(codec.decompress(raw))
    except Exception as exc:  # each codec library raises its own error types
        raise CorruptSession(f"the messages part does not decode: {exc}") from None
    if not isinstance(messages, list) or not all(isinstance(m, dict) for m in messages):
        raise CorruptSession("the messages part is not a JSON array of objects")
    return tuple(messages)


def read_part(state: SessionState, name: str) -> bytes | None:
    """An application part, decompressed (None when the session has no such part)."""
    raw = state.other_parts.get(name)
    return None if raw is None else CODECS[state.codec].decompress(raw)


def with_part(state: SessionState, name: str, data: bytes,
              default_codec: Codec = SNAPPY) -> SessionState:
    """``state`` with part ``name`` set to ``data`` (compressed with the state's codec)."""
    if name == MESSAGES_PART:
        raise ValueError(f"the {MESSAGES_PART!r} part is the conversation: append turns instead")
    codec = CODECS[state.codec] if state.codec else default_codec
    parts = {**state.other_parts, name: codec.compress(data)}
    return replace(state, codec=codec.tag, other_parts=MappingProxyType(parts))
