"""A minimal SSE reader for tests: events with their arrival times."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import orjson


@dataclass
class StreamRecord:
    status: int
    headers: dict[str, str]
    events: list[bytes] = field(default_factory=list)
    arrivals: list[float] = field(default_factory=list)
    """Seconds since the request was sent, one per event."""
    ended_by: str = "eof"
    comments: list[str] = field(default_factory=list)
    """SSE comment lines (``: ...``), e.g. the gateway's resume report."""

    @property
    def payloads(self) -> list[Any]:
        return [orjson.loads(e) for e in self.events if e != b"[DONE]"]

    @property
    def done_count(self) -> int:
        return self.events.count(b"[DONE]")

    @property
    def errors(self) -> list[dict[str, Any]]:
        return [p["error"] for p in self.payloads if isinstance(p, dict) and "error" in p]

    def text(self) -> str:
        parts = []
        for payload in self.payloads:
            for choice in payload.get("choices", []):
                delta = choice.get("delta") or {}
                parts.append(delta.get("content") or choice.get("text") or "")
        return "".join(parts)


async def stream(session: aiohttp.ClientSession, url: str, body: dict[str, Any],
                 headers: dict[str, str] | None = None, limit_s: float = 10.0) -> StreamRecord:
    start = time.monotonic()
    client_timeout = aiohttp.ClientTimeout(total=limit_s)
    async with session.post(url, json=body, headers=headers, timeout=client_timeout) as response:
        record = StreamRecord(response.status, dict(response.headers))
        buffer = b""
        try:
            async for chunk in response.content.iter_any():
                buffer += chunk
                while b"\n\n" in buffer:
                    event, buffer = buffer.split(b"\n\n", 1)
                    for line in event.splitlines():
                        if line.startswith(b"data:"):
                            record.events.append(line[5:].strip())
                            record.arrivals.append(time.monotonic() - start)
                        elif line.startswith(b":"):
                            record.comments.append(line[1:].strip().decode())
        except aiohttp.ClientPayloadError:
            record.ended_by = "payload_error"
        if buffer.strip():
            record.ended_by = "partial_event"
    return record
