"""One request's view of its session: the body to forward, and the turn to commit.

The proxy creates a binding with :meth:`SessionService.bind`, forwards
:meth:`SessionBinding.request_body`, shows every forwarded SSE run (or the
JSON answer) to the binding, and calls :meth:`SessionBinding.commit` only after
a complete success. A failed or cancelled response commits nothing.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import orjson

from gateway.http.context import DEFAULT_TENANT, TENANT_KEY  # noqa: F401 - re-exported
from gateway.sessions.accumulate import ReplyAccumulator
from gateway.sessions.appender import Snapshot
from gateway.sessions.keys import SessionKey
from gateway.sessions.state import Message, Turn, TurnMeta
from gateway.sessions.window import Window, build_prompt, split_request

SESSION_HEADER = "X-Session-Id"
DEGRADED_HEADER = "X-Gateway-Session"
"""Set to ``degraded`` when the session came from (or goes to) the local fallback."""

Committer = Callable[[SessionKey, Turn, Snapshot | None], Awaitable[bool]]
"""Stores a turn (on top of the snapshot the request loaded); True when degraded."""


class SessionBinding:
    """The history of one session joined to one request."""

    __slots__ = ("_body", "_commit", "_committed", "_data", "_history", "_reply", "_request",
                 "_serialized", "_snapshot", "_window", "degraded", "key")

    def __init__(self, key: SessionKey, body: dict[str, Any], request: Sequence[Message],
                 history: Sequence[Message], *, degraded: bool, window: Window,
                 committer: Committer, snapshot: Snapshot | None = None) -> None:
        self.key = key
        self.degraded = degraded
        """History came from the fallback, or the commit went to it."""
        self._body = body
        self._request = request
        self._history = history
        self._window = window
        self._commit = committer
        self._snapshot = snapshot
        self._reply = ReplyAccumulator()
        self._serialized: bytes | None = None
        self._data: dict[str, Any] | None = None
        self._committed = False

    @property
    def history(self) -> Sequence[Message]:
        """The stored conversation this request continues."""
        return self._history

    @property
    def reply_text(self) -> str:
        """The assistant text observed so far."""
        return self._reply.text

    def request_data(self) -> dict[str, Any]:
        """The body to forward, as JSON data: the windowed history, then the request's messages."""
        if self._data is None:
            messages = build_prompt(self._history, self._request, self._window)
            self._data = {**self._body, "messages": messages}
        return self._data

    def request_body(self) -> bytes:
        """:meth:`request_data`, serialized once."""
        if self._serialized is None:
            self._serialized = orjson.dumps(self.request_data())
        return self._serialized

    def observe_stream_events(self, events: bytes) -> None:
        """Complete SSE events just forwarded to the client (the hot path: cheap)."""
        self._reply.feed_events(events)

    def observe_json(self, body: bytes) -> None:
        """A non-streaming chat completion body."""
        self._reply.feed_json(body)

    async def commit(self, request_id: str, meta: TurnMeta | None = None) -> None:
        """Append the request's new messages and the reply as one turn (id = request id).

        Never raises for Redis trouble: the turn then goes to the fallback and
        ``degraded`` becomes True. A second call does nothing. ``meta`` (model,
        backend, token usage) goes to the turn's archive record only.
        """
        if self._committed:
            return
        self._committed = True
        system, new = split_request(self._request)
        turn = Turn(turn_id=request_id, messages=(*new, self._reply.message()),
                    system=system, ts_ms=int(time.time() * 1000), meta=meta)
        if await self._commit(self.key, turn, self._snapshot):
            self.degraded = True
