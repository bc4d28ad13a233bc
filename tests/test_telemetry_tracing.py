"""Tracing: the span tree of a retried request, W3C context in and out, sampling, export."""

from __future__ import annotations

import gzip
import re
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from multidict import CIMultiDict, CIMultiDictProxy
from opentelemetry import trace
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from gateway.resilience.breaker import BreakerState
from gateway.telemetry.settings import TelemetryConfig
from gateway.telemetry.spans import NOOP_REQUEST
from gateway.telemetry.tracing import Tracing, setup_tracing, trace_id_from_headers

CLIENT_TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
CLIENT_SPAN = "00f067aa0ba902b7"
TRACEPARENT = re.compile(r"^00-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})$")


def sampled_flag(traceparent: str) -> bool:
    """Bit 0 of the flags (the SDK also sets bit 1, "random trace id", W3C level 2)."""
    return bool(int(TRACEPARENT.match(traceparent).group(3), 16) & 1)
CHAT = "/v1/chat/completions"


@pytest.fixture
def exporter() -> InMemorySpanExporter:
    return InMemorySpanExporter()


@pytest.fixture
def tracing(exporter) -> Iterator[Tracing]:
    tracing = setup_tracing(TelemetryConfig(sample_ratio=1.0),
                            span_processor=SimpleSpanProcessor(exporter))
    yield tracing
    tracing.shutdown()


def start(tracing: Tracing, headers: dict[str, str] | None = None):
    client = CIMultiDictProxy(CIMultiDict(headers or {}))
    return tracing.start_request(client, method="POST", route=CHAT, model="m",
                                 request_id="req-1", stream=True)


def by_kind(spans: tuple[ReadableSpan, ...], kind: SpanKind) -> list[ReadableSpan]:
    return sorted((s for s in spans if s.kind is kind),
                  key=lambda s: s.attributes.get("gateway.attempt", 0))


def test_a_retried_request_is_one_server_span_with_two_attempts(tracing, exporter):
    request = start(tracing)
    first = request.attempt("a", 1, model="m", breaker_state=BreakerState.CLOSED,
                            url="http://127.0.0.1:8001/v1/chat/completions")
    sent_first: dict[str, str] = {}
    first.inject(sent_first)
    first.end("http_503", status=503, error="backend a answered 503")
    second = request.attempt("b", 2, model="m", wait_seconds=0.25, retry_reason="http_503",
                             breaker_state=BreakerState.HALF_OPEN)
    sent_second: dict[str, str] = {}
    second.inject(sent_second)
    second.end("success", status=200)
    request.first_token()
    request.finish(200, response_model="m", input_tokens=12, output_tokens=8, attempts=2)

    spans = exporter.get_finished_spans()
    assert len(spans) == 3
    [server] = by_kind(spans, SpanKind.SERVER)
    attempts = by_kind(spans, SpanKind.CLIENT)
    assert server.name == "POST /v1/chat/completions"
    assert server.parent is None
    assert dict(server.attributes) == {
        "http.request.method": "POST", "http.route": CHAT, "url.path": CHAT,
        "url.scheme": "http", "gen_ai.operation.name": "chat", "gen_ai.request.model": "m",
        "gateway.stream": True, "gateway.request_id": "req-1",
        "http.response.status_code": 200, "gen_ai.response.model": "m",
        "gen_ai.usage.input_tokens": 12, "gen_ai.usage.output_tokens": 8,
        "gateway.attempts": 2,
    }
    assert [e.name for e in server.events] == ["gen_ai.first_token"]
    assert server.status.status_code is StatusCode.UNSET

    for attempt in attempts:
        assert attempt.name == "chat m"
        assert attempt.parent.span_id == server.context.span_id
        assert attempt.context.trace_id == server.context.trace_id
    one, two = attempts
    assert one.attributes["gateway.backend"] == "a"
    assert one.attributes["gateway.attempt"] == 1
    assert one.attributes["gateway.attempt.outcome"] == "http_503"
    assert one.attributes["gateway.breaker.state"] == "closed"
    assert one.attributes["http.response.status_code"] == 503
    assert one.attributes["error.type"] == "http_503"
    assert "gateway.retry.reason" not in one.attributes
    assert one.status.status_code is StatusCode.ERROR
    assert two.attributes["gateway.backend"] == "b"
    assert two.attributes["gateway.attempt"] == 2
    assert two.attributes["gateway.attempt.outcome"] == "success"
    assert two.attributes["gateway.retry.wait_seconds"] == 0.25
    assert two.attributes["gateway.retry.reason"] == "http_503"
    assert two.attributes["gateway.breaker.state"] == "half_open"
    assert two.status.status_code is StatusCode.UNSET

    # Each backend got its own attempt span as parent.
    for sent, attempt in ((sent_first, one), (sent_second, two)):
        trace_id, parent_id, _ = TRACEPARENT.match(sent["traceparent"]).groups()
        assert int(trace_id, 16) == server.context.trace_id
        assert int(parent_id, 16) == attempt.context.span_id
        assert sampled_flag(sent["traceparent"])


def test_the_clients_trace_is_continued(tracing, exporter):
    request = start(tracing, {"Traceparent": f"00-{CLIENT_TRACE}-{CLIENT_SPAN}-01",
                              "tracestate": "vendor=abc"})
    assert request.trace_id == CLIENT_TRACE
    attempt = request.attempt("a", 1, model="m")
    # Header hygiene forwarded the client's headers as it spelled them.
    upstream = {"Traceparent": f"00-{CLIENT_TRACE}-{CLIENT_SPAN}-01", "TraceState": "vendor=abc",
                "X-Request-Id": "req-1"}
    attempt.inject(upstream)
    attempt.end("success", status=200)
    request.finish(200)

    [server] = by_kind(exporter.get_finished_spans(), SpanKind.SERVER)
    assert f"{server.context.trace_id:032x}" == CLIENT_TRACE
    assert f"{server.parent.span_id:016x}" == CLIENT_SPAN
    assert server.parent.is_remote
    assert sorted(upstream) == ["X-Request-Id", "traceparent", "tracestate"]
    assert upstream["tracestate"] == "vendor=abc"
    context = TraceContextTextMapPropagator().extract(upstream)
    extracted = trace.get_current_span(context).get_span_context()
    assert f"{extracted.trace_id:032x}" == CLIENT_TRACE
    assert extracted.span_id != int(CLIENT_SPAN, 16)  # the gateway's span, not the client's


def test_an_unsampled_parent_propagates_without_recording(tracing, exporter):
    request = start(tracing, {"traceparent": f"00-{CLIENT_TRACE}-{CLIENT_SPAN}-00"})
    assert not request.sampled
    assert request.trace_id == CLIENT_TRACE
    attempt = request.attempt("a", 1)
    assert request.attempt("b", 2) is attempt  # nothing built per attempt
    headers: dict[str, str] = {}
    attempt.inject(headers)
    trace_id, _, _ = TRACEPARENT.match(headers["traceparent"]).groups()
    assert trace_id == CLIENT_TRACE
    assert not sampled_flag(headers["traceparent"])
    attempt.end("success")
    request.first_token()
    request.session("load").end()
    request.finish(200)
    assert exporter.get_finished_spans() == ()


def test_ratio_zero_records_nothing_and_touches_nothing(exporter):
    tracing = setup_tracing(TelemetryConfig(traces_exporter="console", sample_ratio=0.0),
                            span_processor=SimpleSpanProcessor(exporter))
    assert not tracing.enabled
    request = start(tracing, {"traceparent": f"00-{CLIENT_TRACE}-{CLIENT_SPAN}-01"})
    assert request is NOOP_REQUEST
    headers = {"traceparent": "client's own"}
    request.attempt("a", 1).inject(headers)
    assert headers == {"traceparent": "client's own"}
    request.finish(200)
    assert tracing.archive_batch(10).end() is None
    assert exporter.get_finished_spans() == ()


def test_no_exporter_means_no_tracing():
    assert not setup_tracing(TelemetryConfig(sample_ratio=1.0)).enabled


def test_session_and_archive_spans(tracing, exporter):
    request = start(tracing)
    request.session("load", store="redis").end()
    with pytest.raises(TimeoutError), request.session("save", store="redis") as save:
        save.set_store("fallback")
        raise TimeoutError("redis did not answer")
    request.finish(502, error_type="upstream_error")
    with tracing.archive_batch(25) as batch:
        batch.set("db.system.name", "sqlite")

    spans = {s.name: s for s in exporter.get_finished_spans()}
    server = spans["POST /v1/chat/completions"]
    load, save = spans["gateway.session.load"], spans["gateway.session.save"]
    for span in (load, save):
        assert span.parent.span_id == server.context.span_id
        assert span.kind is SpanKind.INTERNAL
    assert load.attributes["gateway.session.store"] == "redis"
    assert save.attributes["gateway.session.store"] == "fallback"
    assert save.attributes["error.type"] == "TimeoutError"
    assert save.status.status_code is StatusCode.ERROR
    assert server.status.status_code is StatusCode.ERROR
    assert server.attributes["error.type"] == "upstream_error"
    batch = spans["gateway.archive.batch"]
    assert batch.parent is None
    assert batch.attributes["gateway.archive.records"] == 25
    assert batch.attributes["db.system.name"] == "sqlite"


def test_trace_id_from_headers_for_logs():
    assert trace_id_from_headers({"traceparent": f"00-{CLIENT_TRACE}-{CLIENT_SPAN}-01"}) \
        == CLIENT_TRACE
    assert trace_id_from_headers({"traceparent": f"00-{'0' * 32}-{CLIENT_SPAN}-01"}) is None
    assert trace_id_from_headers({"traceparent": "garbage"}) is None
    assert trace_id_from_headers({}) is None


class _Collector(BaseHTTPRequestHandler):
    received: list[tuple[str, str, bytes]] = []

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers["Content-Length"]))
        if self.headers.get("Content-Encoding") == "gzip":
            body = gzip.decompress(body)
        self.received.append((self.path, self.headers["Content-Type"], body))
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


def test_otlp_exports_over_http_protobuf(monkeypatch):
    monkeypatch.setenv("NO_PROXY", "127.0.0.1")
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Collector)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        endpoint = f"http://127.0.0.1:{server.server_port}/v1/traces"
        tracing = setup_tracing(TelemetryConfig(traces_exporter="otlp", otlp_endpoint=endpoint,
                                                sample_ratio=1.0, service_name="gw-test"))
        request = start(tracing)
        request.attempt("a", 1, model="m").end("success", status=200)
        request.finish(200)
        assert tracing.force_flush()
        tracing.shutdown()
    finally:
        server.shutdown()
        server.server_close()
    [(path, content_type, body)] = _Collector.received
    assert (path, content_type) == ("/v1/traces", "application/x-protobuf")
    export = ExportTraceServiceRequest.FromString(body)
    [resource_spans] = export.resource_spans
    service = {a.key: a.value.string_value for a in resource_spans.resource.attributes}
    assert service["service.name"] == "gw-test"
    names = sorted(s.name for scope in resource_spans.scope_spans for s in scope.spans)
    assert names == ["POST /v1/chat/completions", "chat m"]


def test_roots_are_sampled_as_the_sdk_samples_them(exporter):
    """Roots are decided by the gateway (trace id under the ratio's bound) without
    the SDK; the ones it keeps are the SDK's spans with the very same trace id."""
    ratio = 0.25
    tracing = setup_tracing(TelemetryConfig(sample_ratio=ratio),
                            span_processor=SimpleSpanProcessor(exporter))
    bound = round(ratio * (1 << 64))
    kept, dropped = set(), set()
    for _ in range(2000):
        request = start(tracing)
        headers: dict[str, str] = {}
        request.attempt("b", 1).inject(headers)
        trace_id, _, flags = TRACEPARENT.match(headers["traceparent"]).groups()
        assert trace_id == request.trace_id
        (kept if request.sampled else dropped).add(trace_id)
        assert sampled_flag(headers["traceparent"]) == request.sampled
        assert int(flags, 16) & 2  # a random trace id, as the SDK flags its own
        request.finish(200)
    tracing.shutdown()
    assert 350 < len(kept) < 650  # 500 expected
    servers = {f"{s.context.trace_id:032x}" for s in exporter.get_finished_spans()
               if s.kind is SpanKind.SERVER}
    assert servers == kept
    assert all(int(t, 16) & ((1 << 64) - 1) < bound for t in kept)
    assert all(int(t, 16) & ((1 << 64) - 1) >= bound for t in dropped)
