"""Server-sent events, cut at event boundaries.

The gateway forwards a backend's SSE bytes as they arrive, but only whole
events: if a stream breaks, the client must never be left with half an event
followed by the gateway's error event. Lines are not parsed on the way; a
chunk is scanned once for its last blank line.
"""

from __future__ import annotations

import orjson

_BOUNDARIES = (b"\n\n", b"\r\n\r\n")
_DONE_ENDINGS = (b"data: [DONE]", b"data:[DONE]")


class EventBuffer:
    """Accumulates bytes and releases them up to the last complete event."""

    __slots__ = ("_pending",)

    def __init__(self) -> None:
        self._pending = b""

    def feed(self, chunk: bytes) -> bytes:
        """Add ``chunk``; return the complete events now available (maybe ``b""``)."""
        if not self._pending and chunk.endswith(b"\n\n"):
            return chunk  # the usual case: the backend sent whole events
        data = self._pending + chunk if self._pending else chunk
        end = max(_boundary_end(data, boundary) for boundary in _BOUNDARIES)
        if end <= 0:
            self._pending = data
            return b""
        self._pending = data[end:]
        return data[:end]

    @property
    def pending(self) -> bytes:
        """Bytes of an event that has not been completed yet."""
        return self._pending


def _boundary_end(data: bytes, boundary: bytes) -> int:
    index = data.rfind(boundary)
    return index + len(boundary) if index >= 0 else -1


def ends_with_done(events: bytes) -> bool:
    """Whether the last event in ``events`` is the ``[DONE]`` sentinel."""
    if b"[DONE]" not in events:  # every event but the last: no copy made
        return False
    return events.rstrip().endswith(_DONE_ENDINGS)


def error_event(message: str, *, type: str, code: str) -> bytes:
    """The event that ends a broken stream: explicit, never mistaken for success."""
    payload = orjson.dumps({"error": {"message": message, "type": type, "code": code}})
    return b"data: " + payload + b"\n\n"
