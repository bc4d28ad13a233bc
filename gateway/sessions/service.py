"""The session service: what the proxy and the session API call.

It owns the store, the fallback LRU, the compensation log and its replayer.
Nothing here raises for Redis trouble on the request path: a slow or dead
Redis makes a request ``degraded``, never failed. Bad input (a malformed
session id or messages) is a 400 before anything is read or written.
"""

from __future__ import annotations

import asyncio
import logging
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from gateway.http.errors import GatewayError, bad_request
from gateway.sessions.appender import AppendPolicy, Snapshot
from gateway.sessions.binding import SESSION_HEADER, SessionBinding
from gateway.sessions.codec import CODECS_BY_NAME
from gateway.sessions.compensation import CompensationLog, Replayer
from gateway.sessions.factory import build_cache, build_store
from gateway.sessions.fallback import Loaded, ResilientStore
from gateway.sessions.inflight import InflightWrites
from gateway.sessions.keys import KeyScheme, SessionKey
from gateway.sessions.settings import SessionsConfig
from gateway.sessions.state import HistoryLimits, Message, Turn
from gateway.sessions.stats import Counters, SessionStats
from gateway.sessions.store import StoreUnavailable
from gateway.sessions.window import Window

if TYPE_CHECKING:
    from gateway.archive.record import OutboxPolicy

log = logging.getLogger("gateway.sessions")
_SESSION_ID = re.compile(r"^[A-Za-z0-9._:-]{1,128}$")


def parse_session_id(value: str) -> str:
    """A valid session id, or a 400 naming the header."""
    if not _SESSION_ID.match(value):
        raise GatewayError(400, f"{SESSION_HEADER} must be 1-128 characters of "
                           "[A-Za-z0-9._:-]", code="invalid_session_id")
    return value


@dataclass(frozen=True, slots=True)
class SessionView:
    """A stored session as ``GET /v1/sessions/{id}`` shows it."""

    session_id: str
    messages: tuple[Message, ...]
    turns: int
    last_active_ts: int
    degraded: bool


class SessionService:
    """Server-side chat sessions: bind a request, commit its turn, read, delete."""

    def __init__(self, config: SessionsConfig, outbox: OutboxPolicy | None = None) -> None:
        """``outbox``: the archive's (``ArchiveService.outbox_policy``); every stored
        turn then carries its archive record, in the same atomic write."""
        self._config = config
        self._keys = KeyScheme(config.prefix, config.buckets)
        self._window = Window(config.window_max_messages, config.window_max_tokens)
        self._counters = Counters()
        self._log = CompensationLog(config.compensation.max_entries, self._counters)
        self._inflight = InflightWrites()
        self._commits: set[asyncio.Task[bool]] = set()
        self._commit_timeout = config.commit_timeout_ms / 1000
        self._store = build_store(config)
        policy = AppendPolicy(
            limits=HistoryLimits(config.max_stored_messages, config.idempotency_window),
            max_attempts=config.cas_max_attempts, codec=CODECS_BY_NAME[config.codec],
            outbox=outbox)
        self._sessions = ResilientStore(self._store, build_cache(config), self._log, policy,
                                        self._commit_timeout, self._counters, self._wake)
        self._replayer = Replayer(self._log, self._sessions.replay, config.compensation,
                                  self._counters)

    @property
    def config(self) -> SessionsConfig:
        return self._config

    @property
    def keys(self) -> KeyScheme:
        return self._keys

    @property
    def stats(self) -> SessionStats:
        return SessionStats.of(self._counters, len(self._log))

    async def start(self) -> None:
        """Reach the store and start the replayer; a Redis that is down is only logged."""
        try:
            await self._store.ping(self._config.startup_timeout_ms / 1000)
        except StoreUnavailable as exc:
            log.warning("session store %s unavailable at start, running degraded: %s",
                        self._config.store, exc)
        self._replayer.start()

    async def close(self) -> None:
        """Finish running commits, stop the replayer, replay what is pending (bounded),
        close the clients."""
        if self._commits:
            await asyncio.wait(set(self._commits), timeout=self._commit_timeout)
        stopped = await self._replayer.stop()
        budget = self._config.compensation.flush_on_close_ms / 1000
        if len(self._log) and not (stopped and await self._replayer.flush(budget)):
            log.error("closing with %d session writes that Redis never received",
                      len(self._log))
        await self._store.close()

    async def bind(self, tenant: str, session_id: str, body: dict[str, Any]) -> SessionBinding:
        """Join the stored history to a request (a 400 for bad messages; never a 5xx)."""
        request = _request_messages(body)
        key = self._key(tenant, session_id)
        loaded = await self._load(key)
        history = loaded.state.messages if loaded.state is not None else ()
        return SessionBinding(key, body, request, history, degraded=loaded.degraded,
                              window=self._window, committer=self._commit,
                              snapshot=loaded.snapshot)

    async def history(self, tenant: str, session_id: str) -> list[dict[str, Any]] | None:
        """The stored messages; None when this tenant has no such session."""
        view = await self.describe(tenant, session_id)
        return list(view.messages) if view is not None else None

    async def describe(self, tenant: str, session_id: str) -> SessionView | None:
        """The stored session; None when absent, 503 when only Redis could tell."""
        key = self._key(tenant, session_id)
        loaded = await self._load(key)
        state = loaded.state
        if state is None:
            if not loaded.answered:
                raise GatewayError(503, "the session store is unavailable and this gateway "
                                   "has no copy of the session", type="server_error",
                                   code="session_store_unavailable", retry_after=1)
            return None
        return SessionView(session_id, state.messages, state.turns, state.last_active_ts,
                           loaded.degraded)

    async def delete(self, tenant: str, session_id: str) -> bool:
        """Delete the session; whether it existed (True when Redis could not tell)."""
        key = self._key(tenant, session_id)
        await self._inflight.wait(key.redis_key, self._commit_timeout)
        return await self._sessions.delete(key)

    def _key(self, tenant: str, session_id: str) -> SessionKey:
        return self._keys.key(tenant, parse_session_id(session_id))

    async def _load(self, key: SessionKey) -> Loaded:
        await self._inflight.wait(key.redis_key, self._commit_timeout)
        return await self._sessions.load(key)

    async def _commit(self, key: SessionKey, turn: Turn, start: Snapshot | None) -> bool:
        """Store a turn. The write runs as a task of its own: a request cancelled now
        (its client went away after the whole answer) must not lose the turn."""
        done = self._inflight.begin(key.redis_key)  # before any await: later loads wait
        # create_task rather than ensure_future: the same task, without the checks.
        task = asyncio.get_running_loop().create_task(self._append(key, turn, start, done))
        self._commits.add(task)
        task.add_done_callback(self._commits.discard)
        return await asyncio.shield(task)

    async def _append(self, key: SessionKey, turn: Turn, start: Snapshot | None,
                      done: asyncio.Event) -> bool:
        try:
            await self._inflight.wait_turn(key.redis_key, done)  # commits take turns
            return await self._sessions.append(key, turn, start)
        finally:
            self._inflight.end(key.redis_key, done)

    def _wake(self) -> None:
        self._replayer.wake()


def _request_messages(body: dict[str, Any]) -> list[Message]:
    """The request's messages, checked: a session needs chat messages to store."""
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise bad_request("'messages' must be a non-empty array of messages", "invalid_field")
    for index, message in enumerate(messages):
        if not isinstance(message, dict) or not isinstance(message.get("role"), str):
            raise bad_request(f"'messages[{index}]' must be an object with a string 'role'",
                              "invalid_field")
    return messages
