"""The assistant's reply, collected from what the client received.

For a stream, every run of complete SSE events forwarded to the client passes
through :meth:`ReplyAccumulator.feed_events`: this is the hot path, so lines
are split once and only events carrying a ``delta`` are parsed. The reply is
choice 0's text; tool calls are assembled too (their name and arguments come
in pieces keyed by index), so a stored turn that called a tool stays valid
for the tool result the client sends next.
"""

from __future__ import annotations

from typing import Any

import orjson

from gateway.sessions.state import Message

_DATA = b"data:"
_DONE = b"[DONE]"
_DELTA = b'"delta"'


class ReplyAccumulator:
    """The assistant message of one response, built as the response passes."""

    __slots__ = ("_parts", "_tools", "done")

    def __init__(self) -> None:
        self._parts: list[str] = []
        self._tools: dict[int, dict[str, Any]] = {}
        self.done = False
        """The stream's ``[DONE]`` was seen."""

    def feed_events(self, events: bytes) -> None:
        """Complete SSE events (``data: {...}`` lines, each event ending in a blank line)."""
        for line in events.split(b"\n"):
            if not line.startswith(_DATA):
                continue
            payload = line[len(_DATA):].strip()
            if payload == _DONE:
                self.done = True
            elif _DELTA in payload:
                try:
                    chunk = orjson.loads(payload)
                except orjson.JSONDecodeError:
                    continue  # not ours to judge: the client got it as it was
                self._feed_chunk(chunk)

    def _feed_chunk(self, chunk: Any) -> None:
        choices = chunk.get("choices") if isinstance(chunk, dict) else None
        for choice in choices or ():
            if not isinstance(choice, dict) or choice.get("index", 0) != 0:
                continue
            delta = choice.get("delta")
            if not isinstance(delta, dict):
                continue
            content = delta.get("content")
            if isinstance(content, str):
                self._parts.append(content)
            tool_calls = delta.get("tool_calls")
            if isinstance(tool_calls, list):
                self._feed_tool_calls(tool_calls)

    def _feed_tool_calls(self, deltas: list[Any]) -> None:
        for delta in deltas:
            index = delta.get("index", 0) if isinstance(delta, dict) else None
            if not isinstance(index, int):
                continue  # malformed: the client got it as it was, the store skips it
            call = self._tools.setdefault(index, {
                "id": "", "type": "function", "function": {"name": "", "arguments": ""}})
            if isinstance(delta.get("id"), str):
                call["id"] = delta["id"]
            if isinstance(delta.get("type"), str):
                call["type"] = delta["type"]
            function = delta.get("function")
            if isinstance(function, dict):
                for field in ("name", "arguments"):
                    if isinstance(function.get(field), str):
                        call["function"][field] += function[field]

    def feed_json(self, body: bytes) -> None:
        """A whole (non-streaming) chat completion."""
        try:
            data = orjson.loads(body)
            message = data["choices"][0]["message"]
        except (orjson.JSONDecodeError, KeyError, IndexError, TypeError):
            return
        if isinstance(message, dict):
            if isinstance(message.get("content"), str):
                self._parts.append(message["content"])
            if isinstance(message.get("tool_calls"), list):
                self._tools.update(enumerate(message["tool_calls"]))
        self.done = True

    @property
    def text(self) -> str:
        return "".join(self._parts)

    def message(self) -> Message:
        """The reply as a chat message, ready to store."""
        reply: Message = {"role": "assistant", "content": self.text}
        if self._tools:
            reply["tool_calls"] = [self._tools[i] for i in sorted(self._tools)]
            if not self._parts:
                reply["content"] = None
        return reply
