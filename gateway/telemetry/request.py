"""One request's telemetry: its clock, its spans, its metrics and its log line.

The proxy starts a :class:`RequestTelemetry` per request from the process's
:class:`Telemetry`, hands it to the dispatcher as the attempt listener, and
finishes it once, whatever the outcome. Everything here is cheap when a
feature is off: unsampled requests build no span, metrics use cached label
children, the log line is one ``json`` dump.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from time import perf_counter
from typing import Any

from gateway.telemetry.logs import RequestLog, log_request
from gateway.telemetry.metrics import GatewayMetrics, attempt_outcome
from gateway.telemetry.settings import TelemetryConfig
from gateway.telemetry.spans import AttemptTrace, RequestTrace
from gateway.telemetry.timing import RequestTimings
from gateway.telemetry.tracing import Tracing


@dataclass(frozen=True, slots=True)
class Telemetry:
    """The process's telemetry: configuration, tracer, metrics."""

    config: TelemetryConfig
    tracing: Tracing
    metrics: GatewayMetrics

    def start(self, headers: Mapping[str, str], *, method: str, route: str,
              request_id: str, tenant: str) -> RequestTelemetry:
        trace = self.tracing.start_request(headers, method=method, route=route, model="",
                                           request_id=request_id)
        log = RequestLog(request_id=request_id, model="", status=0, tenant=tenant,
                         route=route) if self.config.log_requests else None
        return RequestTelemetry(self, trace, log, "")


class RequestTelemetry:
    """The listener of one request's attempts, and its report when it ends."""

    __slots__ = ("_attempt", "_attempt_started", "_log", "_model", "_parent", "_reasons",
                 "_trace", "attempts", "backend", "error_code", "retry_stop", "served_model",
                 "timings", "usage")

    def __init__(self, parent: Telemetry, trace: RequestTrace, log: RequestLog | None,
                 model: str) -> None:
        self._parent = parent
        self._trace = trace
        self._log = log
        self._model = model
        self._reasons: list[str] = []
        self._attempt: AttemptTrace | None = None
        self._attempt_started = 0.0
        self.timings = RequestTimings()
        self.attempts = 0
        self.backend: str | None = None
        self.served_model: str | None = None
        """The model that answered (a fallback's, when one did)."""
        self.retry_stop: str | None = None
        self.error_code: str | None = None
        self.usage: dict[str, Any] | None = None
        """The answer's ``usage``, read only when the span is sampled."""

    def set_model(self, model: str, stream: bool) -> None:
        """The body was read: the model the client asked for, and whether it streams."""
        self._model = model
        self._trace.set_model(model, stream)
        if self._log is not None:
            self._log.model = model
            self._log.stream = stream

    # -- the dispatcher's attempt listener -------------------------------------------

    def attempt_started(self, backend: str, breaker_state: str, wait: float,
                        headers: dict[str, str]) -> None:
        """An attempt is about to be sent; ``headers`` get the trace context."""
        self.attempts += 1
        reason = self._reasons[-1] if self._reasons else None
        if reason is not None:
            self._parent.metrics.retry_started(self._model, reason)
        self._attempt = self._trace.attempt(backend, self.attempts, model=self._model,
                                            wait_seconds=wait, retry_reason=reason,
                                            breaker_state=breaker_state)
        self._attempt.inject(headers)
        self._attempt_started = perf_counter()

    def attempt_ended(self, backend: str, failure: str | None, status: int | None) -> None:
        self.timings.add_upstream_since(self._attempt_started)
        outcome = attempt_outcome(failure, status)
        self._parent.metrics.attempt_done(backend, outcome)
        if self._attempt is not None:
            self._attempt.end(outcome, status=status)
        if failure is not None:
            self._reasons.append(outcome)
        self.backend = backend

    # -- the response --------------------------------------------------------------

    def first_token(self) -> None:
        self.timings.mark_first_token()
        self._trace.first_token()

    def streamed_since(self, started: float) -> None:
        """A relayed stream: its time counts as waiting on the backend."""
        self.timings.add_upstream_since(started)

    def shed(self) -> None:
        self._parent.metrics.request_shed(self._model)

    def stream_resumed(self, reasons: list[str]) -> None:
        """The stream broke and was continued elsewhere, once per reason."""
        for reason in reasons:
            self._parent.metrics.stream_resumed(self._model, reason)
        self._trace.set_attribute("gateway.stream.resumes", len(reasons))
        self._trace.set_attribute("gateway.stream.resume_reasons", reasons)

    def stream_broke(self, code: str) -> None:
        self.error_code = code
        self._parent.metrics.stream_error(self.backend or "none", code)

    def finish(self, status: int) -> None:
        """Once per request: metrics, the span's end, the log line."""
        timings = self.timings
        timings.finish()
        metrics = self._parent.metrics
        if self.retry_stop == "budget":
            metrics.retry_budget_refused(self._model)
        metrics.request_done(self._model, self.backend, status, total_seconds=timings.total,
                             upstream_seconds=timings.upstream, ttft_seconds=timings.ttft)
        usage = self.usage or {}
        self._trace.finish(status, response_model=self.served_model,
                           input_tokens=usage.get("prompt_tokens"),
                           output_tokens=usage.get("completion_tokens"),
                           attempts=self.attempts, error_type=self.error_code)
        if self._log is not None:
            log = self._log
            log.status, log.backend, log.attempts = status, self.backend, self.attempts
            log.served_model = self.served_model if self.served_model != self._model else None
            log.retry_reasons = tuple(self._reasons) if self._reasons else None
            log.retry_stop = self.retry_stop
            log.error_code, log.trace_id = self.error_code, self._trace.trace_id
            log.input_tokens = usage.get("prompt_tokens")
            log.output_tokens = usage.get("completion_tokens")
            log.set_timings(timings)
            log_request(log, redact_content=self._parent.config.redact_content)

    @property
    def sampled(self) -> bool:
        return self._trace.sampled
