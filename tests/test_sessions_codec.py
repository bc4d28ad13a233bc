"""The stored wire format: protobuf + Snappy parts, tagged, and the committed generated code."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterable
from pathlib import Path

import pytest
import snappy
from google.protobuf import descriptor_pb2

from gateway.sessions import session_context_pb2
from gateway.sessions.codec import (
    MESSAGES_PART,
    CorruptSession,
    decode,
    encode,
    read_part,
    with_part,
)
from gateway.sessions.session_context_pb2 import CODEC_SNAPPY, CODEC_ZSTD, SessionContext
from gateway.sessions.state import SessionState

ROOT = Path(__file__).resolve().parent.parent
PROTO = ROOT / "proto" / "session_context.proto"

STATE = SessionState(
    tenant="acme", session_id="s-1", version=7, turns=3, created_ts=1_700_000_000_000,
    last_active_ts=1_700_000_123_456, recent_turn_ids=("r1", "r2", "r3"),
    messages=({"role": "system", "content": "Be brief."},
              {"role": "user", "content": "héllo ✓ " * 50},
              {"role": "assistant", "content": None,
               "tool_calls": [{"id": "c1", "type": "function",
                               "function": {"name": "f", "arguments": "{}"}}]}))


def test_round_trip_keeps_every_field() -> None:
    decoded = decode(encode(STATE))
    assert decoded.messages == STATE.messages
    assert (decoded.tenant, decoded.session_id, decoded.version, decoded.turns) == (
        "acme", "s-1", 7, 3)
    assert decoded.recent_turn_ids == STATE.recent_turn_ids
    assert (decoded.created_ts, decoded.last_active_ts) == (STATE.created_ts,
                                                            STATE.last_active_ts)
    assert decoded.codec == CODEC_SNAPPY


def test_each_part_is_snappy_compressed_and_codec_tagged() -> None:
    state = with_part(STATE, "preferences", b'{"lang": "fr"}' * 20)
    context = SessionContext.FromString(encode(state))
    assert context.codec == CODEC_SNAPPY
    assert set(context.compressed_state) == {MESSAGES_PART, "preferences"}
    assert snappy.decompress(context.compressed_state["preferences"]) == b'{"lang": "fr"}' * 20
    assert len(context.compressed_state[MESSAGES_PART]) < len(b"".join(
        m["content"].encode() for m in STATE.messages if isinstance(m["content"], str)))


def test_application_parts_survive_a_round_trip_unchanged() -> None:
    state = with_part(STATE, "form", b"step=3")
    decoded = decode(encode(state))
    assert read_part(decoded, "form") == b"step=3"
    assert read_part(decoded, "absent") is None
    with pytest.raises(ValueError, match="conversation"):
        with_part(STATE, MESSAGES_PART, b"[]")


@pytest.mark.parametrize("blob,needle", [
    (b"\xff\xff\xff", "not a SessionContext"),
    (SessionContext(codec=CODEC_ZSTD).SerializeToString(), "unknown codec"),
    (SessionContext(codec=0).SerializeToString(), "unknown codec"),
    (SessionContext(codec=CODEC_SNAPPY, compressed_state={MESSAGES_PART: b"junk"})
     .SerializeToString(), "does not decode"),
    (SessionContext(codec=CODEC_SNAPPY, compressed_state={
        MESSAGES_PART: snappy.compress(b'{"not": "a list"}')}).SerializeToString(),
     "JSON array"),
])
def test_unreadable_values_are_refused(blob: bytes, needle: str) -> None:
    with pytest.raises(CorruptSession, match=needle):
        decode(blob)


def test_the_committed_module_matches_the_proto(tmp_path: Path) -> None:
    """Regenerate the descriptor from proto/ and compare it with the committed module's."""
    out = tmp_path / "descriptor.pb"
    done = subprocess.run(
        [sys.executable, "-m", "grpc_tools.protoc", f"-I{PROTO.parent}",
         f"--descriptor_set_out={out}", PROTO.name],
        capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    regenerated = descriptor_pb2.FileDescriptorSet.FromString(out.read_bytes()).file[0]
    _drop_json_names(regenerated.message_type)  # protoc leaves them out of *_pb2.py
    committed = descriptor_pb2.FileDescriptorProto.FromString(
        session_context_pb2.DESCRIPTOR.serialized_pb)
    assert regenerated == committed, (
        "gateway/sessions/session_context_pb2.py is stale: regenerate it (see the .proto)")


def _drop_json_names(messages: Iterable[descriptor_pb2.DescriptorProto]) -> None:
    """Clear the derived ``json_name`` of every field, nested messages included."""
    for message in messages:
        for field in message.field:
            field.ClearField("json_name")
        _drop_json_names(message.nested_type)
