"""Prometheus metrics of the gateway, recorded through a few typed calls.

The proxy, the breakers, the pools, the session layer and the archive call
:class:`GatewayMetrics` methods; nothing else touches prometheus-client.
Each instance has its own registry (tests build several), and each labelled
metric keeps its label children in a dict keyed by the label tuple, so a
hot-path call is one dict lookup plus prometheus-client's own increment.

Metrics (this table is the contract for README, dashboards and alerts):

| name | type | labels | meaning |
|---|---|---|---|
| ``gateway_requests_total`` | counter | model, backend, status | requests answered, by requested model (``other`` when not configured), the backend that served (``none`` when no attempt got a response) and the HTTP status sent |
| ``gateway_request_duration_seconds`` | histogram | model | request received to last byte sent (a stream: until it ended) |
| ``gateway_time_to_first_token_seconds`` | histogram | model, backend | streams only: request received to the first token sent to the client |
| ``gateway_overhead_seconds`` | histogram | | time the gateway added: total minus time waiting on backends (attempts, retry waits, stream reads) |
| ``gateway_stream_errors_total`` | counter | backend, code | started streams that ended with an SSE error event instead of ``[DONE]``; code ``stream_read_timeout``, ``stream_max_exceeded``, ``upstream_disconnected``, ``upstream_incomplete`` (their status stays 200 in ``gateway_requests_total``) |
| ``gateway_stream_resumes_total`` | counter | model, reason | broken streams continued on another backend; reason ``ttft_timeout``, ``stream_read_timeout``, ``min_throughput``, ``upstream_disconnected``, ``upstream_incomplete`` |
| ``gateway_backend_attempts_total`` | counter | backend, outcome | attempts; outcome ``success``, ``connect_error``, ``connect_timeout``, ``read_timeout``, ``deadline``, ``disconnected`` or ``http_<status>`` |
| ``gateway_retries_total`` | counter | model, reason | retries started; reason is the failed attempt's outcome |
| ``gateway_retry_budget_refusals_total`` | counter | model | retries not made because the model's retry budget was spent |
| ``gateway_breaker_state`` | gauge | backend | 0 closed, 1 half-open, 2 open; with several workers, the worst among live workers |
| ``gateway_breaker_transitions_total`` | counter | backend, from, to | breaker state changes (``closed``, ``half_open``, ``open``) |
| ``gateway_shed_requests_total`` | counter | model | requests refused with 429: every backend of the model and its fallbacks at capacity |
| ``gateway_backend_in_flight_requests`` | gauge | backend | requests holding a slot on the backend now (sum over workers) |
| ``gateway_session_store_operations_total`` | counter | store, op, outcome | session store calls; store ``redis``, ``cluster``, ``sharded``, ``memory``, ``fallback``; op ``load``, ``save``, ``delete``, ``replay``; outcome ``ok``, ``miss``, ``conflict``, ``error``, ``timeout`` |
| ``gateway_session_fallback_backlog_entries`` | gauge | | session writes waiting in the compensation log for Redis (sum over workers) |
| ``gateway_archive_lag_seconds`` | histogram | | a turn's completion to its archive row being written |
| ``gateway_archive_backlog_records`` | gauge | | archive records waiting to be written (the shared outbox with Redis: the max over workers) |

Label values must come from configuration or from the fixed sets above, never
from a client (each distinct value is a new series): a requested model that
is not configured is counted as ``other``.

With ``PROMETHEUS_MULTIPROC_DIR`` set, values live in shared files (see
:mod:`gateway.telemetry.multiprocess`) and :func:`render_metrics` aggregates
all workers. Gauges then need a rule to combine workers: ``livesum`` for
in-flight and backlogs (each worker holds its own requests and queues; the
total is what matters, and a dead worker's share is gone with it), and
``livemax`` for breaker state (each worker has its own breakers; with states
ordered closed < half-open < open, the max says whether any live worker
keeps the backend out; ``mostrecent`` would let the last worker to write hide
another worker's open breaker).
"""  # noqa: E501 - the metrics table is Markdown, one row per line

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    disable_created_metrics,
    generate_latest,
)

from gateway.telemetry import multiprocess

NO_BACKEND = "none"
OTHER_MODEL = "other"
SUCCESS = "success"
BREAKER_STATE_VALUES = {"closed": 0.0, "half_open": 1.0, "open": 2.0}

# Total latency: a cached embedding in milliseconds up to a long generation.
LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
                   20.0, 30.0, 60.0, 120.0, 300.0)
# Time to first token: prefill of a short prompt up to a queue on a busy engine.
TTFT_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.2, 0.3, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 5.0,
                10.0, 30.0)
# Overhead: the target is well under a millisecond, so resolve 50 us steps there.
OVERHEAD_BUCKETS = (0.0001, 0.00025, 0.0005, 0.00075, 0.001, 0.0015, 0.0025, 0.005,
                    0.01, 0.025, 0.05, 0.1, 0.25, 1.0)
# Archive lag: a batch interval when healthy, up to an hour behind during an outage.
ARCHIVE_LAG_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0,
                       300.0, 600.0, 1800.0, 3600.0)


def attempt_outcome(failure: str | None, status: int | None = None) -> str:
    """The bounded outcome label of one attempt (also a retry reason and a span value).

    ``failure`` is the attempt's :class:`~gateway.upstream.attempt.Failure`
    value, or None when it succeeded; an HTTP status failure is labelled with
    its status, e.g. ``http_503``.
    """
    if failure is None:
        return SUCCESS
    if failure == "http_status" and status is not None:
        return f"http_{status}"
    return failure


class _Children:
    """The label children of one metric, cached by label tuple.

    prometheus-client's ``labels()`` validates and locks on every call; a
    plain dict hit skips all of that after the first request with a label set.
    """

    __slots__ = ("_cache", "_metric")

    def __init__(self, metric: Any) -> None:
        self._metric = metric
        self._cache: dict[tuple[Any, ...], Any] = {}

    def get(self, *labels: Any) -> Any:
        child = self._cache.get(labels)
        if child is None:
            child = self._metric.labels(*(str(value) for value in labels))
            self._cache[labels] = child
        return child


class GatewayMetrics:
    """All of the gateway's metrics, in a private registry.

    ``models`` bounds the ``model`` label (anything else is ``other``);
    ``backends`` are pre-registered so their breaker state and in-flight
    series exist (at 0) before the first request.
    """

    def __init__(self, *, models: Iterable[str] | None = None,
                 backends: Iterable[str] = ()) -> None:
        # ``*_created`` series would double the exposition in one process and
        # are absent in multiprocess mode: off, so both modes expose the same.
        disable_created_metrics()
        self.registry = CollectorRegistry()
        """Where this instance's metrics live (tests read values from it)."""
        self.multiprocess_dir = multiprocess.multiprocess_dir()
        if self.multiprocess_dir:
            multiprocess.ensure_multiprocess_values()
            self._scrape = multiprocess.aggregating_registry(self.multiprocess_dir)
        else:
            self._scrape = self.registry
        self._models: frozenset[str] | None = None if models is None else frozenset(models)
        self._define_requests()
        self._define_resilience()
        self._define_storage()
        for backend in backends:
            self.set_breaker_state(backend, "closed")
            self.set_in_flight(backend, 0)

    # -- definitions ------------------------------------------------------------

    def _counter(self, name: str, doc: str, labels: tuple[str, ...]) -> Any:
        metric = Counter(name, doc, labels, registry=self.registry)
        return _Children(metric) if labels else metric

    def _gauge(self, name: str, doc: str, labels: tuple[str, ...], mode: str) -> Any:
        metric = Gauge(name, doc, labels, registry=self.registry, multiprocess_mode=mode)
        return _Children(metric) if labels else metric

    def _histogram(self, name: str, doc: str, labels: tuple[str, ...],
                   buckets: tuple[float, ...]) -> Any:
        metric = Histogram(name, doc, labels, registry=self.registry, buckets=buckets)
        return _Children(metric) if labels else metric

    def _define_requests(self) -> None:
        self._requests = self._counter(
            "gateway_requests_total", "Requests answered, by model, backend and status.",
            ("model", "backend", "status"))
        self._duration = self._histogram(
            "gateway_request_duration_seconds",
            "Request received to last byte sent.", ("model",), LATENCY_BUCKETS)
        self._ttft = self._histogram(
            "gateway_time_to_first_token_seconds",
            "Streams: request received to first token sent.", ("model", "backend"),
            TTFT_BUCKETS)
        self._overhead = self._histogram(
            "gateway_overhead_seconds",
            "Time the gateway added: total minus time waiting on backends.", (),
            OVERHEAD_BUCKETS)
        self._stream_errors = self._counter(
            "gateway_stream_errors_total", "Started streams ended by an SSE error event.",
            ("backend", "code"))
        self._stream_resumes = self._counter(
            "gateway_stream_resumes_total",
            "Broken streams continued on another backend, by the reason they broke.",
            ("model", "reason"))

    def _define_resilience(self) -> None:
        self._attempts = self._counter(
            "gateway_backend_attempts_total", "Attempts, by backend and outcome.",
            ("backend", "outcome"))
        self._retries = self._counter(
            "gateway_retries_total", "Retries started, by model and reason.",
            ("model", "reason"))
        self._budget_refusals = self._counter(
            "gateway_retry_budget_refusals_total",
            "Retries not made because the retry budget was spent.", ("model",))
        self._breaker_state = self._gauge(
            "gateway_breaker_state", "Breaker state: 0 closed, 1 half-open, 2 open.",
            ("backend",), "livemax")
        self._breaker_transitions = self._counter(
            "gateway_breaker_transitions_total", "Breaker state changes.",
            ("backend", "from", "to"))
        self._shed = self._counter(
            "gateway_shed_requests_total", "Requests shed with 429 (no capacity).", ("model",))
        self._in_flight = self._gauge(
            "gateway_backend_in_flight_requests", "Requests in flight per backend.",
            ("backend",), "livesum")

    def _define_storage(self) -> None:
        self._store_ops = self._counter(
            "gateway_session_store_operations_total", "Session store operations.",
            ("store", "op", "outcome"))
        self._fallback_backlog = self._gauge(
            "gateway_session_fallback_backlog_entries",
            "Session writes waiting in the compensation log.", (), "livesum")
        self._archive_lag = self._histogram(
            "gateway_archive_lag_seconds", "Turn completed to archive row written.", (),
            ARCHIVE_LAG_BUCKETS)
        self._archive_backlog = self._gauge(
            "gateway_archive_backlog_records", "Archive records waiting to be written.", (),
            # With Redis every worker samples the same shared outbox: a sum would
            # count it N times. (With the memory store each worker's queue is its
            # own, and the max under-reports: the Redis case is the production one.)
            "livemax")

    # -- requests -----------------------------------------------------------------

    def model_label(self, model: str) -> str:
        """``model`` if configured, else ``other``: clients cannot mint new series."""
        models = self._models
        return model if models is None or model in models else OTHER_MODEL

    def set_models(self, models: Iterable[str]) -> None:
        """The configured models changed (hot reload)."""
        self._models = frozenset(models)

    def request_done(self, model: str, backend: str | None, status: int, *,
                     total_seconds: float, upstream_seconds: float,
                     ttft_seconds: float | None = None) -> None:
        """Once per request, when its last byte was sent (or it failed)."""
        model = self.model_label(model)
        backend = backend or NO_BACKEND
        self._requests.get(model, backend, status).inc()
        self._duration.get(model).observe(total_seconds)
        if ttft_seconds is not None:
            self._ttft.get(model, backend).observe(ttft_seconds)
        self._overhead.observe(max(0.0, total_seconds - upstream_seconds))

    def request_shed(self, model: str) -> None:
        self._shed.get(self.model_label(model)).inc()

    def stream_error(self, backend: str, code: str) -> None:
        """A started stream ended with an error event (``code`` from the event)."""
        self._stream_errors.get(backend, code).inc()

    def stream_resumed(self, model: str, reason: str) -> None:
        """A broken stream was continued on another backend (``reason``: why it broke)."""
        self._stream_resumes.get(self.model_label(model), reason).inc()

    # -- attempts, retries, breakers, pools ---------------------------------------

    def attempt_done(self, backend: str, outcome: str) -> None:
        """Once per attempt; ``outcome`` from :func:`attempt_outcome`."""
        self._attempts.get(backend, outcome).inc()

    def retry_started(self, model: str, reason: str) -> None:
        """A failed attempt is being retried; ``reason`` is its outcome."""
        self._retries.get(self.model_label(model), reason).inc()

    def retry_budget_refused(self, model: str) -> None:
        self._budget_refusals.get(self.model_label(model)).inc()

    def on_breaker_transition(self, backend: str, old: str, new: str) -> None:
        """A breaker's ``on_transition`` hook (BreakerState values are strings)."""
        self._breaker_transitions.get(backend, old, new).inc()
        self._breaker_state.get(backend).set(BREAKER_STATE_VALUES[new])

    def set_breaker_state(self, backend: str, state: str) -> None:
        self._breaker_state.get(backend).set(BREAKER_STATE_VALUES[state])

    def set_in_flight(self, backend: str, count: int) -> None:
        self._in_flight.get(backend).set(count)

    # -- sessions and archive -----------------------------------------------------

    def session_store_op(self, store: str, op: str, outcome: str, count: int = 1) -> None:
        self._store_ops.get(store, op, outcome).inc(count)

    def set_session_fallback_backlog(self, entries: int) -> None:
        self._fallback_backlog.set(entries)

    def observe_archive_lag(self, seconds: float) -> None:
        self._archive_lag.observe(seconds)

    def set_archive_backlog(self, records: int) -> None:
        self._archive_backlog.set(records)


class NullMetrics(GatewayMetrics):
    """``metrics = false``: the same calls, doing nothing, with no registry behind them."""

    def __init__(self, *, models: Iterable[str] | None = None,
                 backends: Iterable[str] = ()) -> None:
        self.multiprocess_dir = None
        self.registry = self._scrape = CollectorRegistry()
        self._models = None

    def set_models(self, models: Iterable[str]) -> None:
        pass

    def request_done(self, model: str, backend: str | None, status: int, *,
                     total_seconds: float, upstream_seconds: float,
                     ttft_seconds: float | None = None) -> None:
        pass

    def request_shed(self, model: str) -> None:
        pass

    def stream_error(self, backend: str, code: str) -> None:
        pass

    def stream_resumed(self, model: str, reason: str) -> None:
        pass

    def attempt_done(self, backend: str, outcome: str) -> None:
        pass

    def retry_started(self, model: str, reason: str) -> None:
        pass

    def retry_budget_refused(self, model: str) -> None:
        pass

    def on_breaker_transition(self, backend: str, old: str, new: str) -> None:
        pass

    def set_breaker_state(self, backend: str, state: str) -> None:
        pass

    def set_in_flight(self, backend: str, count: int) -> None:
        pass

    def session_store_op(self, store: str, op: str, outcome: str, count: int = 1) -> None:
        pass

    def set_session_fallback_backlog(self, entries: int) -> None:
        pass

    def observe_archive_lag(self, seconds: float) -> None:
        pass

    def set_archive_backlog(self, records: int) -> None:
        pass


def build_metrics(enabled: bool, *, models: Iterable[str] | None = None,
                  backends: Iterable[str] = ()) -> GatewayMetrics:
    """The metrics for ``[telemetry] metrics``: real ones, or :class:`NullMetrics`."""
    cls = GatewayMetrics if enabled else NullMetrics
    return cls(models=models, backends=backends)


def render_metrics(metrics: GatewayMetrics) -> tuple[bytes, str]:
    """The body and Content-Type of ``GET /metrics``.

    In multiprocess mode the body aggregates every worker's files; otherwise
    it is this instance's registry. CPU-bound (milliseconds with many files):
    a busy gateway may run it in an executor.
    """
    return generate_latest(metrics._scrape), CONTENT_TYPE_LATEST
