"""Observability: tracing, metrics and logs (issue 6).

- :mod:`~gateway.telemetry.settings`: the ``[telemetry]`` table;
- :mod:`~gateway.telemetry.tracing` and :mod:`~gateway.telemetry.spans`:
  OpenTelemetry spans of a request, its attempts, session and archive work;
- :mod:`~gateway.telemetry.metrics` and :mod:`~gateway.telemetry.multiprocess`:
  Prometheus metrics, correct across worker processes;
- :mod:`~gateway.telemetry.logs` and :mod:`~gateway.telemetry.timing`: JSON
  log lines, one per request, with the request's durations.

Nothing is imported here, so reading the configuration does not load the
OpenTelemetry SDK or prometheus-client.
"""
