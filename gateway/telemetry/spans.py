"""The spans of one request, behind small handles the proxy holds.

There are three kinds of request handle, chosen once when the request starts
(:meth:`gateway.telemetry.tracing.Tracing.start_request`):

- :data:`NOOP_REQUEST` when tracing is off: every call returns at once, and
  the client's own ``traceparent`` passes to the backend untouched (header
  hygiene forwards it);
- an unsampled request (most of them, at a ratio of 0.01): the SDK's
  non-recording span only, so the backend still receives the trace id with
  the "not sampled" flag, and no other object is built per attempt;
- a sampled request: a SERVER span, a CLIENT span per attempt, INTERNAL spans
  for session load and save.

Parents are passed explicitly (no context attach/detach): a request's work
runs in several tasks and callbacks, and an explicit parent cannot leak into
another request's context.
"""

from __future__ import annotations

from collections.abc import Mapping, MutableMapping
from types import TracebackType

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.trace import Span, SpanContext, SpanKind, Status, StatusCode
from opentelemetry.util.types import AttributeValue

TRACEPARENT = "traceparent"
TRACESTATE = "tracestate"
_TRACE_HEADERS = (TRACEPARENT, TRACESTATE)

# Attribute keys (OpenTelemetry semantic conventions, then the gateway's own).
GEN_AI_OPERATION = "gen_ai.operation.name"
GEN_AI_REQUEST_MODEL = "gen_ai.request.model"
GEN_AI_RESPONSE_MODEL = "gen_ai.response.model"
GEN_AI_INPUT_TOKENS = "gen_ai.usage.input_tokens"
GEN_AI_OUTPUT_TOKENS = "gen_ai.usage.output_tokens"
GEN_AI_FIRST_TOKEN_EVENT = "gen_ai.first_token"
HTTP_STATUS = "http.response.status_code"
ERROR_TYPE = "error.type"
BACKEND = "gateway.backend"
ATTEMPT = "gateway.attempt"
ATTEMPT_OUTCOME = "gateway.attempt.outcome"
RETRY_WAIT = "gateway.retry.wait_seconds"
RETRY_REASON = "gateway.retry.reason"
BREAKER_STATE = "gateway.breaker.state"
ATTEMPTS = "gateway.attempts"
SESSION_STORE = "gateway.session.store"


def inject_span_context(context: SpanContext, headers: MutableMapping[str, str]) -> None:
    """Write W3C ``traceparent`` (and ``tracestate``) for ``context`` into ``headers``.

    Any spelling of these headers already there (the client's, forwarded by
    header hygiene) is replaced: the backend's parent is the gateway's span.
    """
    # The length test skips almost every header before the lower() (10 and 11
    # are the lengths of "tracestate" and "traceparent").
    inject_traceparent(headers, context.trace_id, context.span_id, int(context.trace_flags),
                       context.trace_state.to_header() if context.trace_state else None)


def inject_traceparent(headers: MutableMapping[str, str], trace_id: int, span_id: int,
                       flags: int, trace_state: str | None = None) -> None:
    """:func:`inject_span_context` from the ids themselves (no ``SpanContext`` needed)."""
    for name in [n for n in headers if len(n) in (10, 11) and n.lower() in _TRACE_HEADERS]:
        del headers[name]
    headers[TRACEPARENT] = f"00-{trace_id:032x}-{span_id:016x}-{flags:02x}"
    if trace_state:
        headers[TRACESTATE] = trace_state


class OperationSpan:
    """A session load or save, or an archive batch. The base class does nothing."""

    __slots__ = ()

    def set(self, key: str, value: AttributeValue) -> None:
        pass

    def set_store(self, store: str) -> None:
        """Which session store answered: redis, cluster, sharded, memory or fallback."""
        self.set(SESSION_STORE, store)

    def end(self, error: str | BaseException | None = None) -> None:
        pass

    def __enter__(self) -> OperationSpan:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.end(exc)


class AttemptTrace:
    """One upstream attempt. The base class does nothing."""

    __slots__ = ()

    def inject(self, headers: MutableMapping[str, str]) -> None:
        """Put this attempt's trace context into the headers sent to the backend."""

    def end(self, outcome: str, *, status: int | None = None,
            error: str | None = None) -> None:
        """``outcome`` as in metrics (``success``, ``read_timeout``, ``http_503``...)."""


class RequestTrace:
    """The spans of one request. The base class (:data:`NOOP_REQUEST`) does nothing."""

    __slots__ = ()
    sampled = False

    @property
    def trace_id(self) -> str | None:
        """The request's trace id, 32 hex digits, for the request log."""
        return None

    def attempt(self, backend: str, number: int, *, model: str | None = None,
                wait_seconds: float = 0.0, retry_reason: str | None = None,
                breaker_state: str | None = None, url: str | None = None) -> AttemptTrace:
        """Start attempt ``number`` (1-based) on ``backend``.

        ``model`` is the model sent to the backend (a fallback's, if so);
        ``wait_seconds`` and ``retry_reason`` say how long the gateway waited
        before this attempt and which outcome of the previous one caused it.
        """
        return NOOP_ATTEMPT

    def first_token(self) -> None:
        """The first token reached the client (an event on the server span)."""

    def set_model(self, model: str, stream: bool) -> None:
        """The body was read: the requested model, and whether it streams."""

    def set_attribute(self, key: str, value: AttributeValue) -> None:
        """Any other attribute of the server span."""

    def session(self, op: str, store: str | None = None) -> OperationSpan:
        """A session ``load`` or ``save`` on behalf of this request."""
        return NOOP_OPERATION

    def finish(self, status: int, *, response_model: str | None = None,
               input_tokens: int | None = None, output_tokens: int | None = None,
               attempts: int | None = None, error_type: str | None = None) -> None:
        """The response ended (last byte sent, or the request failed); ends the span."""


NOOP_OPERATION = OperationSpan()
NOOP_ATTEMPT = AttemptTrace()
NOOP_REQUEST = RequestTrace()


class UnsampledRequest(RequestTrace, AttemptTrace):
    """A request the sampler dropped: only its trace context travels on.

    It is its own attempt handle, so retries build nothing more; the backend
    sees the gateway's (non-recording) span id and the "not sampled" flag.
    """

    __slots__ = ("_flags", "_span_id", "_state", "_trace_id")

    def __init__(self, trace_id: int, span_id: int, flags: int = 0,
                 trace_state: str | None = None) -> None:
        self._trace_id = trace_id
        self._span_id = span_id
        self._flags = flags
        self._state = trace_state

    @classmethod
    def of(cls, context: SpanContext) -> UnsampledRequest:
        return cls(context.trace_id, context.span_id, int(context.trace_flags),
                   context.trace_state.to_header() if context.trace_state else None)

    @property
    def trace_id(self) -> str | None:
        return f"{self._trace_id:032x}"

    def attempt(self, backend: str, number: int, *, model: str | None = None,
                wait_seconds: float = 0.0, retry_reason: str | None = None,
                breaker_state: str | None = None, url: str | None = None) -> AttemptTrace:
        return self

    def inject(self, headers: MutableMapping[str, str]) -> None:
        inject_traceparent(headers, self._trace_id, self._span_id, self._flags, self._state)


class RecordingOperation(OperationSpan):
    __slots__ = ("_span",)

    def __init__(self, span: Span) -> None:
        self._span = span

    def set(self, key: str, value: AttributeValue) -> None:
        self._span.set_attribute(key, value)

    def end(self, error: str | BaseException | None = None) -> None:
        if not self._span.is_recording():
            return  # ended already
        if error is not None:
            kind = error if isinstance(error, str) else type(error).__qualname__
            self._span.set_attribute(ERROR_TYPE, kind)
            self._span.set_status(Status(StatusCode.ERROR, str(error)))
        self._span.end()


class RecordingAttempt(AttemptTrace):
    __slots__ = ("_span",)

    def __init__(self, span: Span) -> None:
        self._span = span

    def inject(self, headers: MutableMapping[str, str]) -> None:
        inject_span_context(self._span.get_span_context(), headers)

    def end(self, outcome: str, *, status: int | None = None,
            error: str | None = None) -> None:
        span = self._span
        if not span.is_recording():
            return
        span.set_attribute(ATTEMPT_OUTCOME, outcome)
        if status is not None:
            span.set_attribute(HTTP_STATUS, status)
        if outcome != "success":
            span.set_attribute(ERROR_TYPE, outcome)
            span.set_status(Status(StatusCode.ERROR, error or outcome))
        span.end()


class RecordingRequest(RequestTrace):
    """A sampled request: its SERVER span and the children started from it."""

    __slots__ = ("_operation", "_parent", "_saw_first_token", "_span", "_tracer")
    sampled = True

    def __init__(self, tracer: trace.Tracer, span: Span, operation: str | None) -> None:
        self._tracer = tracer
        self._span = span
        self._parent: Context = trace.set_span_in_context(span)
        self._operation = operation
        self._saw_first_token = False

    @property
    def trace_id(self) -> str | None:
        return f"{self._span.get_span_context().trace_id:032x}"

    def attempt(self, backend: str, number: int, *, model: str | None = None,
                wait_seconds: float = 0.0, retry_reason: str | None = None,
                breaker_state: str | None = None, url: str | None = None) -> AttemptTrace:
        attributes: dict[str, AttributeValue] = {BACKEND: backend, ATTEMPT: number,
                                                 "http.request.method": "POST"}
        if self._operation is not None:
            attributes[GEN_AI_OPERATION] = self._operation
        if model is not None:
            attributes[GEN_AI_REQUEST_MODEL] = model
        if number > 1 or retry_reason is not None:
            attributes[RETRY_WAIT] = wait_seconds
        if retry_reason is not None:
            attributes[RETRY_REASON] = retry_reason
        if breaker_state is not None:
            attributes[BREAKER_STATE] = str(breaker_state)
        if url is not None:
            attributes["url.full"] = url
        name = " ".join(p for p in (self._operation, model) if p) or f"attempt {backend}"
        span = self._tracer.start_span(name, context=self._parent, kind=SpanKind.CLIENT,
                                       attributes=attributes)
        return RecordingAttempt(span)

    def set_attribute(self, key: str, value: AttributeValue) -> None:
        self._span.set_attribute(key, value)

    def set_model(self, model: str, stream: bool) -> None:
        self._span.set_attribute(GEN_AI_REQUEST_MODEL, model)
        self._span.set_attribute("gateway.stream", stream)

    def first_token(self) -> None:
        if not self._saw_first_token:
            self._saw_first_token = True
            self._span.add_event(GEN_AI_FIRST_TOKEN_EVENT)

    def session(self, op: str, store: str | None = None) -> OperationSpan:
        attributes = {SESSION_STORE: store} if store is not None else None
        span = self._tracer.start_span(f"gateway.session.{op}", context=self._parent,
                                       attributes=attributes)
        return RecordingOperation(span)

    def finish(self, status: int, *, response_model: str | None = None,
               input_tokens: int | None = None, output_tokens: int | None = None,
               attempts: int | None = None, error_type: str | None = None) -> None:
        span = self._span
        if not span.is_recording():
            return  # finished already
        values: Mapping[str, AttributeValue | None] = {
            HTTP_STATUS: status, GEN_AI_RESPONSE_MODEL: response_model,
            GEN_AI_INPUT_TOKENS: input_tokens, GEN_AI_OUTPUT_TOKENS: output_tokens,
            ATTEMPTS: attempts,
        }
        span.set_attributes({k: v for k, v in values.items() if v is not None})
        if status >= 500:  # a server span's 4xx is the client's error, not ours
            span.set_attribute(ERROR_TYPE, error_type or str(status))
            span.set_status(Status(StatusCode.ERROR))
        elif error_type is not None:
            span.set_attribute(ERROR_TYPE, error_type)
        span.end()
