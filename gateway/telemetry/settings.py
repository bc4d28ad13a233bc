"""Settings of tracing, metrics and logs: the ``[telemetry]`` table.

Every key has a default, so a file without ``[telemetry]`` gets what a
production gateway should have out of the box: metrics on, one JSON log line
per request with message contents redacted, and tracing off until an operator
names an exporter (a span pipeline with nowhere to send spans is pure cost).

```toml
[telemetry]
traces_exporter = "otlp"          # "none" | "console" | "otlp"
otlp_endpoint = "http://127.0.0.1:4318/v1/traces"
sample_ratio = 0.01               # of requests without a sampled parent; 0 turns tracing off
service_name = "llm-gateway"
log_level = "info"                # "debug" | "info" | "warning" | "error"
log_requests = true               # one JSON line per request
redact_content = true             # never log message contents
metrics = true                    # GET /metrics
```
"""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import urlsplit

from gateway.configreader import Table

TRACES_EXPORTERS = ("none", "console", "otlp")
LOG_LEVELS = ("debug", "info", "warning", "error")


@dataclass(frozen=True, slots=True)
class TelemetryConfig:
    traces_exporter: str = "none"
    """Where finished spans go: nowhere, stdout (debugging), or OTLP over HTTP/protobuf."""
    otlp_endpoint: str = "http://127.0.0.1:4318/v1/traces"
    """The collector's full traces URL (the OTLP/HTTP default port and path)."""
    sample_ratio: float = 0.01
    """Share of root requests traced. A client's sampled ``traceparent`` is always
    honoured (parent-based sampling) unless the ratio is 0, which turns tracing off."""
    service_name: str = "llm-gateway"
    """``service.name`` of the spans: what a trace UI lists the gateway as."""
    log_level: str = "info"
    log_requests: bool = True
    """One JSON line per request, independent of ``log_level``."""
    redact_content: bool = True
    """Prompts and replies are user data: they reach the logs only when this is false."""
    metrics: bool = True

    @property
    def tracing_enabled(self) -> bool:
        """Whether spans are built at all (an injected test processor also enables them)."""
        return self.traces_exporter != "none" and self.sample_ratio > 0


def parse_telemetry(table: Table) -> TelemetryConfig:
    """Read ``[telemetry]``; errors name the key path, unknown keys are rejected."""
    d = TelemetryConfig()
    config = TelemetryConfig(
        traces_exporter=table.string("traces_exporter", d.traces_exporter,
                                     choices=TRACES_EXPORTERS),
        otlp_endpoint=_http_url(table, "otlp_endpoint", d.otlp_endpoint),
        sample_ratio=table.number("sample_ratio", d.sample_ratio, allow_equal=True,
                                  maximum=1.0, what="a ratio"),
        service_name=table.string("service_name", d.service_name),
        log_level=table.string("log_level", d.log_level, choices=LOG_LEVELS),
        log_requests=table.boolean("log_requests", d.log_requests),
        redact_content=table.boolean("redact_content", d.redact_content),
        metrics=table.boolean("metrics", d.metrics),
    )
    table.finish()
    return config


def _http_url(table: Table, key: str, default: str) -> str:
    """A URL the OTLP/HTTP exporter can post to (checked even when unused, to catch typos)."""
    url = table.string(key, default)
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise table.error(key, "an http:// or https:// URL with a host", url)
    return url
