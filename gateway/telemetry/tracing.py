"""OpenTelemetry tracing: the provider from ``[telemetry]`` and the request entry point.

:func:`setup_tracing` builds a private SDK ``TracerProvider`` (never the
global one: tests build several, and a library must not hijack the process's
provider) with parent-based ratio sampling: a request whose client sent a
sampled ``traceparent`` is traced, others at ``sample_ratio``. Spans leave
through a ``BatchSpanProcessor`` (a background thread), so exporting never
blocks the event loop.

Off means off: with ``traces_exporter = "none"`` (and no injected processor)
or ``sample_ratio = 0``, :meth:`Tracing.start_request` returns a shared no-op
handle without looking at the headers.

The handles it returns are in :mod:`gateway.telemetry.spans`.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from random import getrandbits

from opentelemetry.context import Context
from opentelemetry.sdk.resources import SERVICE_NAME, Resource
from opentelemetry.sdk.trace import SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter, SpanExporter
from opentelemetry.sdk.trace.id_generator import RandomIdGenerator
from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased
from opentelemetry.trace import SpanKind, Tracer
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
from opentelemetry.util.types import AttributeValue

from gateway.telemetry.settings import TelemetryConfig
from gateway.telemetry.spans import (
    GEN_AI_OPERATION,
    GEN_AI_REQUEST_MODEL,
    NOOP_OPERATION,
    NOOP_REQUEST,
    TRACEPARENT,
    OperationSpan,
    RecordingOperation,
    RecordingRequest,
    RequestTrace,
    UnsampledRequest,
)

__all__ = ["GEN_AI_OPERATIONS", "Tracing", "setup_tracing", "trace_id_from_headers"]

GEN_AI_OPERATIONS = {
    "/v1/chat/completions": "chat",
    "/v1/completions": "text_completion",
    "/v1/embeddings": "embeddings",
}
"""``gen_ai.operation.name`` of each inference route (GenAI semantic conventions)."""

_PROPAGATOR = TraceContextTextMapPropagator()
_TRACEPARENT = re.compile(r"^[0-9a-f]{2}-([0-9a-f]{32})-[0-9a-f]{16}-[0-9a-f]{2}")
_INVALID_TRACE_ID = "0" * 32
_RATIO_BITS = (1 << 64) - 1
"""The bits of a trace id that ``TraceIdRatioBased`` compares with its bound."""
_RANDOM_TRACE_ID = 0x02
"""W3C trace-context level 2 flag the SDK sets on the trace ids it draws (not sampled)."""


class _PresetTraceIds(RandomIdGenerator):
    """Random ids, except the trace id the gateway drew (and sampled) itself, once."""

    def __init__(self) -> None:
        self.preset = 0

    def generate_trace_id(self) -> int:
        trace_id, self.preset = self.preset, 0
        return trace_id or super().generate_trace_id()


class Tracing:
    """The gateway's tracer, or nothing at all when tracing is off.

    A request that arrives without a ``traceparent`` is a root, and the
    sampler's decision for a root depends only on its trace id
    (``TraceIdRatioBased``: its low 64 bits under a bound). At a ratio of 1 %
    that decision is "no" 99 times in 100, and the SDK took ~25 µs per request
    to reach it and build a non-recording span. So the gateway draws the
    trace id itself and applies the same rule: a dropped root gets its ids and
    nothing else; a kept one is handed to the SDK with that trace id (through
    the provider's id generator), where the sampler reaches the same decision.
    Requests with a ``traceparent`` always go through the SDK.
    """

    def __init__(self, provider: TracerProvider | None, *, ratio: float = 1.0,
                 ids: _PresetTraceIds | None = None) -> None:
        self._provider = provider
        self._tracer: Tracer | None = (
            provider.get_tracer("gateway") if provider is not None else None)
        self._ids = ids
        self._bound = TraceIdRatioBased.get_bound_for_rate(ratio)

    @property
    def enabled(self) -> bool:
        return self._tracer is not None

    def start_request(self, headers: Mapping[str, str], *, method: str, route: str,
                      model: str, request_id: str | None = None, stream: bool = False,
                      attributes: Mapping[str, AttributeValue] | None = None
                      ) -> RequestTrace:
        """Start the SERVER span of one request, continuing the client's trace if any.

        ``headers`` are the client's (aiohttp's case-insensitive headers, or a
        dict with lower-case names). ``attributes`` adds more, e.g.
        ``client.address`` or ``user_agent.original``.
        """
        tracer = self._tracer
        if tracer is None:
            return NOOP_REQUEST
        parent: Context | None = None
        if headers.get(TRACEPARENT) is not None:
            parent = _PROPAGATOR.extract(headers)
        elif self._ids is not None:
            trace_id = getrandbits(128) or 1
            if trace_id & _RATIO_BITS >= self._bound:
                return UnsampledRequest(trace_id, getrandbits(64) or 1, _RANDOM_TRACE_ID)
            self._ids.preset = trace_id
        span = tracer.start_span(f"{method} {route}", context=parent, kind=SpanKind.SERVER)
        if not span.is_recording():
            return UnsampledRequest.of(span.get_span_context())
        operation = GEN_AI_OPERATIONS.get(route)
        span.set_attributes({
            "http.request.method": method, "http.route": route, "url.path": route,
            "url.scheme": "http", GEN_AI_REQUEST_MODEL: model, "gateway.stream": stream,
        })
        if operation is not None:
            span.set_attribute(GEN_AI_OPERATION, operation)
        if request_id is not None:
            span.set_attribute("gateway.request_id", request_id)
        if attributes:
            span.set_attributes(attributes)
        return RecordingRequest(tracer, span, operation)

    def archive_batch(self, records: int) -> OperationSpan:
        """A root span for one archive batch (sampled at the configured ratio)."""
        tracer = self._tracer
        if tracer is None:
            return NOOP_OPERATION
        span = tracer.start_span("gateway.archive.batch",
                                 attributes={"gateway.archive.records": records})
        return RecordingOperation(span) if span.is_recording() else NOOP_OPERATION

    def force_flush(self, timeout_millis: int = 5000) -> bool:
        """Export every finished span now (tests; before a planned exit)."""
        return self._provider.force_flush(timeout_millis) if self._provider else True

    def shutdown(self) -> None:
        """Flush and stop the exporter thread (blocking: call it at cleanup)."""
        if self._provider is not None:
            self._provider.shutdown()
            self._provider = None
            self._tracer = None


def setup_tracing(config: TelemetryConfig, *,
                  span_processor: SpanProcessor | None = None) -> Tracing:
    """A :class:`Tracing` for ``config``.

    ``span_processor`` is added besides the configured exporter (tests pass a
    ``SimpleSpanProcessor(InMemorySpanExporter())``); it enables tracing even
    with ``traces_exporter = "none"``. ``sample_ratio = 0`` disables tracing
    whatever the rest says.
    """
    if config.sample_ratio <= 0:
        return Tracing(None)
    exporter = _exporter(config)
    if exporter is None and span_processor is None:
        return Tracing(None)
    ids = _PresetTraceIds()
    provider = TracerProvider(
        sampler=ParentBased(TraceIdRatioBased(config.sample_ratio)),
        resource=Resource.create({SERVICE_NAME: config.service_name}),
        id_generator=ids,
    )
    if exporter is not None:
        provider.add_span_processor(BatchSpanProcessor(exporter))
    if span_processor is not None:
        provider.add_span_processor(span_processor)
    return Tracing(provider, ratio=config.sample_ratio, ids=ids)


def _exporter(config: TelemetryConfig) -> SpanExporter | None:
    if config.traces_exporter == "console":
        return ConsoleSpanExporter(service_name=config.service_name)
    if config.traces_exporter == "otlp":
        # Imported only when used: it pulls in requests and protobuf stubs.
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        return OTLPSpanExporter(endpoint=config.otlp_endpoint)
    return None


def trace_id_from_headers(headers: Mapping[str, str]) -> str | None:
    """The client's trace id from its ``traceparent``, for logs when tracing is off."""
    value = headers.get(TRACEPARENT)
    if value is None:
        return None
    match = _TRACEPARENT.match(value.strip())
    if match is None or match.group(1) == _INVALID_TRACE_ID:
        return None
    return match.group(1)
