"""Prometheus metrics in one process: counters move, the exposition parses."""

from __future__ import annotations

import inspect

import pytest
from prometheus_client.parser import text_string_to_metric_families

from gateway.resilience.breaker import BreakerState, CircuitBreaker
from gateway.resilience.breaker_config import BreakerConfig
from gateway.telemetry import multiprocess
from gateway.telemetry.metrics import (
    GatewayMetrics,
    NullMetrics,
    attempt_outcome,
    build_metrics,
    render_metrics,
)


def value(metrics: GatewayMetrics, name: str, **labels: str) -> float | None:
    return metrics.registry.get_sample_value(name, labels)


def families(metrics: GatewayMetrics) -> dict[str, object]:
    body, content_type = render_metrics(metrics)
    assert content_type.startswith("text/plain")
    return {f.name: f for f in text_string_to_metric_families(body.decode())}


@pytest.fixture
def metrics() -> GatewayMetrics:
    return GatewayMetrics(models=["m", "fallback"], backends=["a", "b"])


def test_a_retried_request_moves_the_counters(metrics):
    metrics.attempt_done("a", attempt_outcome("http_status", 503))
    metrics.retry_started("m", attempt_outcome("http_status", 503))
    metrics.attempt_done("b", attempt_outcome(None))
    metrics.request_done("m", "b", 200, total_seconds=1.2, upstream_seconds=1.1996,
                         ttft_seconds=0.3)
    metrics.request_done("m", "b", 200, total_seconds=0.8, upstream_seconds=0.792)

    assert value(metrics, "gateway_requests_total", model="m", backend="b", status="200") == 2
    assert value(metrics, "gateway_backend_attempts_total", backend="a",
                 outcome="http_503") == 1
    assert value(metrics, "gateway_backend_attempts_total", backend="b", outcome="success") == 1
    assert value(metrics, "gateway_retries_total", model="m", reason="http_503") == 1
    assert value(metrics, "gateway_request_duration_seconds_count", model="m") == 2
    assert value(metrics, "gateway_request_duration_seconds_sum", model="m") == pytest.approx(2.0)
    # TTFT only for the request that had one (a stream).
    assert value(metrics, "gateway_time_to_first_token_seconds_count", model="m",
                 backend="b") == 1
    # Overhead 0.4 ms and 8 ms: the buckets tell them apart.
    assert value(metrics, "gateway_overhead_seconds_bucket", le="0.0005") == 1
    assert value(metrics, "gateway_overhead_seconds_bucket", le="0.005") == 1
    assert value(metrics, "gateway_overhead_seconds_bucket", le="0.01") == 2


def test_the_exposition_parses_and_names_every_metric(metrics):
    metrics.request_done("m", None, 503, total_seconds=0.001, upstream_seconds=0.0)
    metrics.request_shed("m")
    metrics.stream_error("a", "upstream_disconnected")
    metrics.retry_budget_refused("m")
    metrics.session_store_op("redis", "load", "ok")
    metrics.set_session_fallback_backlog(3)
    metrics.observe_archive_lag(2.0)
    metrics.set_archive_backlog(7)
    found = families(metrics)
    # The parser drops a counter's _total suffix from its family name.
    assert {name: family.type for name, family in found.items()} == {
        "gateway_requests": "counter", "gateway_request_duration_seconds": "histogram",
        "gateway_time_to_first_token_seconds": "histogram",
        "gateway_overhead_seconds": "histogram", "gateway_stream_errors": "counter",
        "gateway_stream_resumes": "counter",
        "gateway_backend_attempts": "counter",
        "gateway_retries": "counter", "gateway_retry_budget_refusals": "counter",
        "gateway_breaker_state": "gauge", "gateway_breaker_transitions": "counter",
        "gateway_shed_requests": "counter", "gateway_backend_in_flight_requests": "gauge",
        "gateway_session_store_operations": "counter",
        "gateway_session_fallback_backlog_entries": "gauge",
        "gateway_archive_lag_seconds": "histogram", "gateway_archive_backlog_records": "gauge",
    }
    samples = {(s.name, tuple(sorted(s.labels.items()))): s.value
               for family in found.values() for s in family.samples}
    assert samples[("gateway_requests_total",
                    (("backend", "none"), ("model", "m"), ("status", "503")))] == 1
    assert samples[("gateway_shed_requests_total", (("model", "m"),))] == 1
    assert samples[("gateway_stream_errors_total",
                    (("backend", "a"), ("code", "upstream_disconnected")))] == 1
    assert samples[("gateway_retry_budget_refusals_total", (("model", "m"),))] == 1
    assert samples[("gateway_session_store_operations_total",
                    (("op", "load"), ("outcome", "ok"), ("store", "redis")))] == 1
    assert samples[("gateway_session_fallback_backlog_entries", ())] == 3
    assert samples[("gateway_archive_backlog_records", ())] == 7
    assert samples[("gateway_archive_lag_seconds_count", ())] == 1
    # Backends given up front have their series before any traffic.
    assert samples[("gateway_breaker_state", (("backend", "b"),))] == 0
    assert samples[("gateway_backend_in_flight_requests", (("backend", "b"),))] == 0


def test_breaker_transitions_through_the_breaker_hook(metrics):
    clock = [0.0]
    breaker = CircuitBreaker("a", BreakerConfig(), clock=lambda: clock[0],
                             on_transition=metrics.on_breaker_transition)
    breaker.force_open(5.0)
    assert value(metrics, "gateway_breaker_state", backend="a") == 2
    clock[0] = 6.0
    assert breaker.state is BreakerState.HALF_OPEN
    assert value(metrics, "gateway_breaker_state", backend="a") == 1
    breaker.force_close()
    assert value(metrics, "gateway_breaker_state", backend="a") == 0
    for old, new in (("closed", "open"), ("open", "half_open"), ("half_open", "closed")):
        assert value(metrics, "gateway_breaker_transitions_total", backend="a",
                     **{"from": old, "to": new}) == 1


def test_in_flight_is_set_not_drifting(metrics):
    metrics.set_in_flight("a", 3)
    metrics.set_in_flight("a", 2)
    assert value(metrics, "gateway_backend_in_flight_requests", backend="a") == 2


def test_clients_cannot_mint_model_series(metrics):
    metrics.request_done("made-up-by-a-client", None, 404, total_seconds=0.001,
                         upstream_seconds=0.0)
    assert value(metrics, "gateway_requests_total", model="other", backend="none",
                 status="404") == 1
    metrics.set_models(["m", "made-up-by-a-client"])  # a reload added it
    metrics.request_shed("made-up-by-a-client")
    assert value(metrics, "gateway_shed_requests_total", model="made-up-by-a-client") == 1


def test_instances_do_not_share_a_registry():
    first, second = GatewayMetrics(), GatewayMetrics()
    first.request_shed("m")
    assert value(first, "gateway_shed_requests_total", model="m") == 1
    assert value(second, "gateway_shed_requests_total", model="m") is None


def test_attempt_outcome_labels():
    assert attempt_outcome(None) == "success"
    assert attempt_outcome("read_timeout") == "read_timeout"
    assert attempt_outcome("http_status", 429) == "http_429"


def test_null_metrics_overrides_every_recording_method():
    public = {name for name, member in inspect.getmembers(GatewayMetrics, inspect.isfunction)
              if not name.startswith("_") and name != "model_label"}
    overridden = {name for name in public if name in vars(NullMetrics)}
    assert public == overridden
    null = build_metrics(False, backends=["a"])
    assert isinstance(null, NullMetrics)
    null.request_done("m", "a", 200, total_seconds=1.0, upstream_seconds=0.5)
    null.on_breaker_transition("a", "closed", "open")
    assert render_metrics(null)[0] == b""
    assert type(build_metrics(True)) is GatewayMetrics


def test_multiprocess_env_after_import_is_refused(monkeypatch, tmp_path):
    # prometheus_client was imported by this test process without the variable:
    # values would stay in memory, invisible to other workers' scrapes.
    monkeypatch.setenv(multiprocess.ENV, str(tmp_path))
    with pytest.raises(RuntimeError, match="imported before"):
        GatewayMetrics()
