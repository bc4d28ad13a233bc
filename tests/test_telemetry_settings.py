"""The [telemetry] table: defaults, values, and errors that name the key path."""

from __future__ import annotations

import tomllib

import pytest

from gateway.configreader import ConfigError, Table
from gateway.telemetry.settings import TelemetryConfig, parse_telemetry


def parse(text: str) -> TelemetryConfig:
    root = Table("config.toml", "", tomllib.loads(text))
    config = parse_telemetry(root.table("telemetry"))
    root.finish()
    return config


def test_defaults_without_a_table():
    config = parse("")
    assert config == TelemetryConfig()
    assert config.traces_exporter == "none"
    assert config.sample_ratio == 0.01
    assert config.otlp_endpoint == "http://127.0.0.1:4318/v1/traces"
    assert config.service_name == "llm-gateway"
    assert config.log_level == "info"
    assert config.log_requests and config.redact_content and config.metrics
    assert not config.tracing_enabled


def test_every_key_is_read():
    config = parse("""
        [telemetry]
        traces_exporter = "otlp"
        otlp_endpoint = "https://collector.internal:4318/v1/traces"
        sample_ratio = 1
        service_name = "gw-eu"
        log_level = "warning"
        log_requests = false
        redact_content = false
        metrics = false
    """)
    assert config == TelemetryConfig(
        traces_exporter="otlp", otlp_endpoint="https://collector.internal:4318/v1/traces",
        sample_ratio=1.0, service_name="gw-eu", log_level="warning", log_requests=False,
        redact_content=False, metrics=False)
    assert config.tracing_enabled


def test_a_zero_ratio_turns_tracing_off():
    assert not parse('[telemetry]\ntraces_exporter = "console"\nsample_ratio = 0\n'
                     ).tracing_enabled


@pytest.mark.parametrize("body,message", [
    ('traces_exporter = "jaeger"',
     'config.toml: telemetry.traces_exporter: expected one of "none", "console", "otlp", '
     'got "jaeger"'),
    ("sample_ratio = 1.5", "telemetry.sample_ratio: expected a ratio >= 0 and <= 1, got 1.5"),
    ("sample_ratio = -0.1", "telemetry.sample_ratio: expected a ratio >= 0"),
    ('sample_ratio = "1%"', 'telemetry.sample_ratio: expected a ratio >= 0 and <= 1, got "1%"'),
    ('otlp_endpoint = "127.0.0.1:4318"',
     'telemetry.otlp_endpoint: expected an http:// or https:// URL with a host'),
    ('log_level = "trace"', 'telemetry.log_level: expected one of "debug", "info"'),
    ('log_requests = "yes"', 'telemetry.log_requests: expected true or false, got "yes"'),
    ("redact_content = 0", "telemetry.redact_content: expected true or false, got 0"),
    ("metrics = 1", "telemetry.metrics: expected true or false"),
    ('service_name = ""', "telemetry.service_name: expected a non-empty string"),
    ("sample_rate = 0.5", "config.toml: telemetry.sample_rate: unknown key"),
])
def test_errors_name_the_key_path(body, message):
    with pytest.raises(ConfigError) as error:
        parse(f"[telemetry]\n{body}\n")
    assert message in str(error.value)


def test_not_a_table():
    with pytest.raises(ConfigError, match="telemetry: expected a table"):
        parse('telemetry = "on"\n')
