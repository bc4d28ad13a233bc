"""Server-side chat sessions (issue 4): a client sends ``X-Session-Id`` and only its
new message, the gateway supplies the history and stores the new turn.

Modules, in reading order:

- ``settings``: the ``[sessions]`` configuration (``SessionsConfig``, ``parse_sessions``)
- ``service``: ``SessionService``, what the proxy and the session API call
- ``binding``: ``SessionBinding``, one request's view of its session
- ``window``, ``accumulate``: the forwarded prompt, and the reply collected from the stream
- ``state``: a session's contents and how a turn changes them (pure functions)
- ``codec``, ``session_context_pb2``: the stored bytes (protobuf, Snappy parts, codec tag)
- ``keys``: ``{prefix}{shard_NN}:{tenant}:{session_id}`` and CRC32 buckets
- ``store``, ``memory_store``, ``redis_store`` (+ ``append_script``), ``sharded_store``,
  ``factory``: the stores behind one interface
- ``appender``: compare-and-set append, retried on conflict, idempotent by turn id
- ``fallback``, ``lru``, ``compensation``: the write-through LRU, the log of writes
  Redis missed, and their replay
- ``inflight``, ``stats``: per-session coordination in one process; counters
- ``deadlines``: one shared timer per budget (Redis calls, commits) instead of
  an ``asyncio.timeout`` each
"""

from gateway.sessions.binding import DEGRADED_HEADER, SESSION_HEADER, TENANT_KEY, SessionBinding
from gateway.sessions.service import SessionService, SessionView, parse_session_id
from gateway.sessions.settings import SessionsConfig, parse_sessions
from gateway.sessions.stats import SessionStats

__all__ = [
    "DEGRADED_HEADER",
    "SESSION_HEADER",
    "TENANT_KEY",
    "SessionBinding",
    "SessionService",
    "SessionStats",
    "SessionView",
    "SessionsConfig",
    "parse_session_id",
    "parse_sessions",
]
