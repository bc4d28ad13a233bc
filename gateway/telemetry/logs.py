"""JSON logs: one object per line, and one line per request.

:func:`configure_logging` makes every log record of the process a single JSON
object (``ts``, ``level``, ``logger``, ``message`` and any ``extra`` fields),
which log pipelines ingest without parsing rules. :func:`log_request` writes
the per-request line that answers "what happened to request X": who asked,
which backend served, after how many attempts and why, and where the time went.

No secrets in logs, whoever logs: values under secret-looking keys
(``authorization``, ``api_key``, ``*_key``, ``cookie``...) are replaced, and
bearer tokens and ``sk-`` keys are masked inside any message. Message contents
(prompts, replies) are user data: they reach the log only with
``redact_content = false``.
"""

from __future__ import annotations

import asyncio
import logging
import operator
import re
import sys
import time
from dataclasses import dataclass
from typing import Any, TextIO

import orjson

from gateway.telemetry.settings import TelemetryConfig
from gateway.telemetry.timing import RequestTimings

__all__ = ["REQUEST_LOGGER", "JsonFormatter", "RequestLog", "configure_logging",
           "flush_request_lines", "log_request"]

REQUEST_LOGGER = "gateway.requests"
REDACTED = "[redacted]"
_LEVELS = {"debug": logging.DEBUG, "info": logging.INFO, "warning": logging.WARNING,
           "error": logging.ERROR}

# Looked up once: a logger lookup per request takes a lock in the logging module.
_request_log = logging.getLogger(REQUEST_LOGGER)
_redact_content = True  # set by configure_logging; safe until then

# Attributes every LogRecord has: anything else on a record is an ``extra`` field.
_STANDARD = frozenset(vars(logging.LogRecord("", 0, "", 0, "", None, None))) | {
    "message", "asctime", "taskName"}

_SECRET_KEYS = frozenset({
    "authorization", "proxy-authorization", "api_key", "api-key", "apikey", "x-api-key",
    "cookie", "set-cookie", "password", "secret", "token", "access_token", "refresh_token",
})
_SECRET_SUFFIXES = ("_key", "-key", "_secret", "_password", "_token")
_SECRET_TEXT = re.compile(
    r"(?i)((?:api[_-]?key|authorization)[\"']?\s*[:=]\s*[\"']?(?:(?:bearer|basic)\s+)?)"
    r"[^\s\"',;)}]+"
    r"|(bearer\s+)[A-Za-z0-9._~+/=-]+"
    r"|\bsk-[A-Za-z0-9_-]{8,}")


_secret_key_cache: dict[str, bool] = {}


def _is_secret_key(key: str) -> bool:
    """Whether values under ``key`` are secrets (cached: the same few keys recur)."""
    secret = _secret_key_cache.get(key)
    if secret is None:
        lower = key.lower()
        secret = lower in _SECRET_KEYS or lower.endswith(_SECRET_SUFFIXES)
        if len(_secret_key_cache) < 1024:
            _secret_key_cache[key] = secret
    return secret


def _mask(match: re.Match[str]) -> str:
    prefix = match.group(1) or match.group(2) or ""
    return prefix + REDACTED


def scrub(text: str) -> str:
    """``text`` with bearer tokens, ``sk-`` keys and ``api_key=...`` values masked."""
    return _SECRET_TEXT.sub(_mask, text)


def _redact(key: str, value: Any, depth: int = 0) -> Any:
    """A field's value fit for a log: secrets replaced, nested mappings checked too."""
    if _is_secret_key(key):
        return REDACTED
    if isinstance(value, str):
        return scrub(value)
    if isinstance(value, dict) and depth < 3:
        return {str(k): _redact(str(k), v, depth + 1) for k, v in value.items()}
    return value


class JsonFormatter(logging.Formatter):
    """One JSON object per record: ts, level, logger, message, then extra fields."""

    def __init__(self) -> None:
        super().__init__()
        self._second = -1
        self._second_text = ""

    def _timestamp(self, created: float) -> str:
        """ISO 8601 UTC with milliseconds; the seconds part is formatted once a second."""
        second = int(created)
        if second != self._second:
            self._second = second
            self._second_text = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(second))
        return f"{self._second_text}.{int((created - second) * 1000):03d}Z"

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "ts": self._timestamp(record.created),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": scrub(record.getMessage()),
        }
        fields = record.__dict__
        trusted = isinstance(record, _RequestRecord)
        for key in fields.keys() - _STANDARD:
            entry[key] = fields[key] if trusted else _redact(key, fields[key])
        if record.exc_info:
            entry["exception"] = scrub(self.formatException(record.exc_info))
        if record.stack_info:
            entry["stack"] = scrub(record.stack_info)
        return orjson.dumps(entry, default=str).decode()


def configure_logging(config: TelemetryConfig, stream: TextIO | None = None) -> logging.Handler:
    """Make the root logger write JSON lines to ``stream`` (stderr by default).

    Replaces the root logger's handlers: call it once per process at start-up
    (in each worker). The request log follows ``log_requests``, not
    ``log_level``: ``log_level = "warning"`` quiets the chatter, not the
    request lines.
    """
    global _redact_content, _request_sink
    target = stream if stream is not None else sys.stderr
    flush_request_lines()  # a sink being replaced writes what it holds first
    _request_sink = _LineSink(target)
    handler = logging.StreamHandler(target)
    handler.setFormatter(JsonFormatter())
    root = logging.getLogger()
    for existing in list(root.handlers):
        root.removeHandler(existing)
    root.addHandler(handler)
    root.setLevel(_LEVELS[config.log_level])
    _request_log.setLevel(logging.INFO if config.log_requests else logging.CRITICAL + 1)
    _redact_content = config.redact_content
    return handler


@dataclass(slots=True)
class RequestLog:
    """What the request log line says about one request (None fields are left out)."""

    request_id: str
    model: str
    """The model the client asked for."""
    status: int
    trace_id: str | None = None
    tenant: str | None = None
    route: str | None = None
    stream: bool | None = None
    served_model: str | None = None
    """The model that answered, when a fallback did."""
    backend: str | None = None
    attempts: int = 0
    retry_reasons: tuple[str, ...] | None = None
    """Outcome of each attempt that was retried, in order (``read_timeout``, ``http_503``);
    None when nothing was retried."""
    retry_stop: str | None = None
    """Why retrying stopped: attempts, deadline, budget, no_backend."""
    error_code: str | None = None
    total_ms: float | None = None
    ttft_ms: float | None = None
    upstream_ms: float | None = None
    overhead_ms: float | None = None
    input_tokens: int | None = None
    output_tokens: int | None = None
    session_id: str | None = None
    content: Any = None
    """Messages and reply; logged only when content is not redacted."""

    def set_timings(self, timings: RequestTimings) -> None:
        """Fill the durations (milliseconds) from the request's clock readings."""
        total = timings.total
        self.total_ms = _ms(total)
        ttft = timings.ttft
        self.ttft_ms = None if ttft is None else _ms(ttft)
        self.upstream_ms = _ms(timings.upstream)
        self.overhead_ms = _ms(max(0.0, total - timings.upstream))


def _ms(seconds: float) -> float:
    """Milliseconds with three decimals (``round()`` costs three times as much)."""
    return int(seconds * 1_000_000 + 0.5) / 1000


_FIELDS = RequestLog.__slots__
_values_of = operator.attrgetter(*_FIELDS)


class _RequestRecord(logging.LogRecord):
    """A request line: its fields come from :class:`RequestLog`, which has no field
    that can hold a credential, so the formatter skips the per-field redaction."""


def log_request(entry: RequestLog, *, redact_content: bool | None = None) -> None:
    """Write the request's JSON line (a no-op when ``log_requests`` is off).

    ``redact_content`` overrides the configured setting (tests). The record is
    built directly rather than through ``Logger.info``, which would walk the
    stack to find the caller on every request. No field of :class:`RequestLog`
    is named like a standard record attribute, so none is overwritten.
    """
    if not _request_log.isEnabledFor(logging.INFO):
        return
    redact = _redact_content if redact_content is None else redact_content
    fields = {name: value for name, value in zip(_FIELDS, _values_of(entry), strict=True)
              if value is not None}
    if redact:
        fields.pop("content", None)
    sink = _request_sink
    if sink is not None:
        # The hot path: no LogRecord, no Formatter, one write per batch of lines.
        now = time.time()
        line = {"ts": sink.timestamp(now), "level": "info", "logger": REQUEST_LOGGER,
                "message": "request", **fields}
        sink.write(orjson.dumps(line, default=str).decode())
        return
    record = _RequestRecord(REQUEST_LOGGER, logging.INFO, __file__, 0, "request", (), None)
    record.__dict__.update(fields)
    _request_log.handle(record)


FLUSH_AFTER_S = 0.05
FLUSH_AT_LINES = 256


class _LineSink:
    """Request lines, written in batches: at most every ``FLUSH_AFTER_S``, or at
    ``FLUSH_AT_LINES`` lines, and on :func:`flush_request_lines`.

    A ``write`` system call per request cost more than building the line, and
    even one per event-loop cycle cost ~40 µs per request under load (the
    reader of the pipe pays too). Access logs are buffered the same way by
    nginx (``access_log ... buffer= flush=``): a line reaches the log at most
    ``FLUSH_AFTER_S`` late, and the server flushes at shutdown. Without a
    running loop a line is written at once.
    """

    def __init__(self, stream: TextIO) -> None:
        self._stream = stream
        self._pending: list[str] = []
        self._clock = JsonFormatter()
        self._timer: asyncio.TimerHandle | None = None

    def timestamp(self, now: float) -> str:
        return self._clock._timestamp(now)

    def write(self, line: str) -> None:
        self._pending.append(line)
        if len(self._pending) >= FLUSH_AT_LINES:
            self.flush()
        elif self._timer is None:
            try:
                self._timer = asyncio.get_running_loop().call_later(FLUSH_AFTER_S, self.flush)
            except RuntimeError:
                self.flush()

    def flush(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        lines, self._pending = self._pending, []
        if lines:
            self._stream.write("\n".join(lines) + "\n")
            self._stream.flush()


def flush_request_lines() -> None:
    """Write the request lines still buffered (at shutdown, or before reading a log)."""
    if _request_sink is not None:
        _request_sink.flush()


_request_sink: _LineSink | None = None
"""Set by :func:`configure_logging`; until then request lines go through ``logging``."""
