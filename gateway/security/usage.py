"""Reading ``usage.total_tokens`` from answers, for the tokens-per-minute limit.

The answers pass through the gateway anyway; parsing them again would cost
CPU on every request, so both readers first look for the bytes
``"total_tokens"`` and parse only when they are there (OpenAI-compatible
engines put usage in a non-streaming body, and in the last event of a stream
when ``stream_options.include_usage`` is set).
"""

from __future__ import annotations

from typing import Any

import orjson

_MARK = b'"total_tokens"'


def total_tokens(body: bytes) -> int | None:
    """``usage.total_tokens`` of a JSON answer, or None."""
    if _MARK not in body:
        return None
    try:
        return _from_payload(orjson.loads(body))
    except orjson.JSONDecodeError:
        return None


def usage_of(body: bytes) -> dict[str, Any] | None:
    """The ``usage`` object of a JSON answer (for a sampled span), or None."""
    try:
        payload = orjson.loads(body)
    except orjson.JSONDecodeError:
        return None
    usage = payload.get("usage") if type(payload) is dict else None
    return usage if type(usage) is dict else None


def _from_payload(payload: Any) -> int | None:
    if type(payload) is not dict:
        return None
    usage = payload.get("usage")
    if type(usage) is not dict:
        return None
    tokens = usage.get("total_tokens")
    return tokens if type(tokens) is int and tokens >= 0 else None


class StreamUsage:
    """Follows SSE events as they are forwarded; keeps the last ``total_tokens`` seen."""

    __slots__ = ("total",)

    def __init__(self) -> None:
        self.total: int | None = None

    def feed(self, events: bytes) -> None:
        """Complete SSE events (``data: {...}`` lines); cheap when there is no usage."""
        if _MARK not in events:
            return
        for line in events.splitlines():
            if line.startswith(b"data:") and _MARK in line:
                try:
                    tokens = _from_payload(orjson.loads(line[5:]))
                except orjson.JSONDecodeError:
                    continue
                if tokens is not None:
                    self.total = tokens
