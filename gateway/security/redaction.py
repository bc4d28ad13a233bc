"""Keeping credentials out of logs.

The gateway never logs a key on purpose (it logs a key's name or a 32-bit
fingerprint of its digest), but other code may: aiohttp logs a malformed
request with the start of the offending header line (``Bearer sk-...`` when
the ``Authorization`` header was too long), and an exception's text can carry
a header. :func:`install_log_redaction` rewrites every log record when it is
created, message and traceback text alike, so no handler or formatter added
later can bypass it. The cost is paid per emitted record, never per request.
"""

from __future__ import annotations

import logging
import re
import traceback
from collections.abc import Callable
from typing import Any

REDACTED = "[redacted]"
_SCHEME = re.compile(r"(?i)\b(bearer|basic)(\s+)[^\s'\",;]+")
_NAMED = re.compile(r"(?i)\b(x-api-key|api[-_]?key|authorization)(['\"]?\s*[:=]\s*['\"]?)"
                    r"(?!bearer\b|basic\b)[^\s'\",;}&]+")
_SK = re.compile(r"\bsk-[A-Za-z0-9_\-]{8,}")


def redact(text: str) -> str:
    """The text with bearer tokens, ``api-key`` values and ``sk-...`` keys replaced."""
    if not text:
        return text
    text = _SCHEME.sub(rf"\1\2{REDACTED}", text)
    text = _NAMED.sub(rf"\1\2{REDACTED}", text)
    return _SK.sub(f"sk-{REDACTED}", text)


def redact_record(record: logging.LogRecord) -> None:
    """Redact a record in place: its message (args merged in) and its traceback."""
    try:
        message = record.getMessage()
    except Exception:  # a broken format string is the handler's problem, not ours
        return
    clean = redact(message)
    if clean != message:
        record.msg, record.args = clean, None
    if record.exc_info and record.exc_info[0] is not None and not record.exc_text:
        text = "".join(traceback.format_exception(*record.exc_info)).rstrip("\n")
        record.exc_text = redact(text)
    if record.stack_info:
        record.stack_info = redact(record.stack_info)


def install_log_redaction() -> Callable[[], None]:
    """Redact every log record of the process from now on; returns an undo function.

    Installing twice is harmless (the second call does nothing).
    """
    previous = logging.getLogRecordFactory()
    if getattr(previous, "gateway_redacting", False):
        return lambda: None

    def factory(*args: Any, **kwargs: Any) -> logging.LogRecord:
        record = previous(*args, **kwargs)
        redact_record(record)
        return record

    factory.gateway_redacting = True  # type: ignore[attr-defined]
    logging.setLogRecordFactory(factory)

    def uninstall() -> None:
        if logging.getLogRecordFactory() is factory:
            logging.setLogRecordFactory(previous)

    return uninstall
