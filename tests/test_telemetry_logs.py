"""JSON logs: one parseable line per record and per request, no secrets, no content."""

from __future__ import annotations

import asyncio
import io
import json
import logging
import time
from collections.abc import Iterator

import pytest

from gateway.telemetry import logs
from gateway.telemetry.logs import RequestLog, configure_logging, log_request
from gateway.telemetry.settings import TelemetryConfig
from gateway.telemetry.timing import RequestTimings

KEY = "sk-live-0123456789abcdef"
PROMPT = "my medical history is private"


@pytest.fixture
def output() -> Iterator[io.StringIO]:
    """Logging configured into a buffer; the process's logging restored afterwards."""
    root = logging.getLogger()
    saved = (list(root.handlers), root.level, logging.getLogger(logs.REQUEST_LOGGER).level,
             logs._redact_content)
    stream = io.StringIO()
    configure_logging(TelemetryConfig(), stream=stream)
    yield stream
    handlers, level, request_level, redact = saved
    for handler in list(root.handlers):
        root.removeHandler(handler)
    for handler in handlers:
        root.addHandler(handler)
    root.setLevel(level)
    logging.getLogger(logs.REQUEST_LOGGER).setLevel(request_level)
    logs._redact_content = redact


def lines(stream: io.StringIO) -> list[dict]:
    return [json.loads(line) for line in stream.getvalue().splitlines()]


def entry(**overrides) -> RequestLog:
    fields = dict(
        request_id="req-1", model="m", status=200, trace_id="4bf92f3577b34da6a3ce929d0e0e4736",
        tenant="acme", route="/v1/chat/completions", stream=True, backend="b", attempts=2,
        retry_reasons=("http_503",), total_ms=812.5, ttft_ms=120.0, upstream_ms=811.9,
        overhead_ms=0.6, input_tokens=12, output_tokens=8,
        content={"messages": [{"role": "user", "content": PROMPT}]})
    fields.update(overrides)
    return RequestLog(**fields)


def test_a_request_is_one_json_line_without_content(output):
    log_request(entry())
    [line] = lines(output)
    assert line["logger"] == "gateway.requests"
    assert line["level"] == "info"
    assert line["message"] == "request"
    assert line["ts"].endswith("Z") and "T" in line["ts"]
    for key, expected in {
        "request_id": "req-1", "trace_id": "4bf92f3577b34da6a3ce929d0e0e4736",
        "tenant": "acme", "model": "m", "backend": "b", "attempts": 2, "status": 200,
        "retry_reasons": ["http_503"], "total_ms": 812.5, "ttft_ms": 120.0,
        "upstream_ms": 811.9, "overhead_ms": 0.6, "stream": True,
    }.items():
        assert line[key] == expected, key
    assert "content" not in line
    assert PROMPT not in output.getvalue()
    assert "served_model" not in line  # None fields are left out


def test_content_is_logged_only_when_not_redacted(output):
    log_request(entry(), redact_content=False)
    [line] = lines(output)
    assert line["content"]["messages"][0]["content"] == PROMPT


def test_configured_redaction_applies(output):
    configure_logging(TelemetryConfig(redact_content=False), stream=output)
    log_request(entry())
    assert PROMPT in output.getvalue()


def test_no_secrets_whoever_logs(output):
    log = logging.getLogger("gateway.upstream")
    log.warning("backend refused Authorization: Bearer %s (api_key=%s)", KEY, KEY,
                extra={"headers": {"Authorization": f"Bearer {KEY}", "X-Request-Id": "req-1"},
                       "api_key": KEY, "backend": "a"})
    log.error("retrying with key %s", KEY)
    text = output.getvalue()
    assert KEY not in text
    first, second = lines(output)
    assert first["headers"] == {"Authorization": "[redacted]", "X-Request-Id": "req-1"}
    assert first["api_key"] == "[redacted]"
    assert first["backend"] == "a"
    assert "Bearer [redacted]" in first["message"]
    assert second["message"] == "retrying with key [redacted]"


def test_exceptions_are_one_line_too(output):
    try:
        raise ValueError(f"bad key {KEY}")
    except ValueError:
        logging.getLogger("gateway").exception("failed")
    [line] = lines(output)
    assert "ValueError" in line["exception"]
    assert KEY not in output.getvalue()


def test_levels_and_the_request_switch(output):
    configure_logging(TelemetryConfig(log_level="warning"), stream=output)
    logging.getLogger("gateway").info("chatter")
    log_request(entry())  # request lines do not follow log_level
    assert [line["message"] for line in lines(output)] == ["request"]
    configure_logging(TelemetryConfig(log_requests=False), stream=output)
    log_request(entry())
    assert len(lines(output)) == 1


def test_durations_from_timings():
    timings = RequestTimings(started=10.0)
    timings.upstream = 0.75
    timings.first_token = 10.2
    timings.ended = 11.0
    record = entry(total_ms=None, ttft_ms=None, upstream_ms=None, overhead_ms=None)
    record.set_timings(timings)
    assert (record.total_ms, record.ttft_ms, record.upstream_ms, record.overhead_ms) == \
        (1000.0, 200.0, 750.0, 250.0)


def test_request_fields_never_shadow_record_attributes():
    assert not set(RequestLog.__slots__) & logs._STANDARD


async def test_request_lines_are_written_in_batches(output):
    for _ in range(3):
        log_request(entry())
    assert output.getvalue() == ""  # held for the batch, not a write each
    logs.flush_request_lines()
    assert len(lines(output)) == 3


async def test_a_buffered_line_goes_out_within_the_flush_interval(output):
    started = time.monotonic()
    log_request(entry())
    async with asyncio.timeout(2):
        # The sink's timer has no event to await: poll, bounded by the timeout.
        while not output.getvalue():  # noqa: ASYNC110
            await asyncio.sleep(0.005)
    assert time.monotonic() - started < logs.FLUSH_AFTER_S + 0.5
    assert len(lines(output)) == 1


async def test_a_full_batch_is_written_at_once(output):
    for _ in range(logs.FLUSH_AT_LINES):
        log_request(entry())
    assert len(lines(output)) == logs.FLUSH_AT_LINES
