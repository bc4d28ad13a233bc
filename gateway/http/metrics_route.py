"""``GET /metrics``: the Prometheus exposition, with the gauges read at scrape time.

Values that are cheap to read but would cost a little on every request —
requests in flight per backend, breaker states (reading a state also moves
an open breaker whose time is up to half-open), the sessions' counters and
backlog — are read here, once per scrape, instead of on the hot path.
"""

from __future__ import annotations

from aiohttp import web

from gateway.runtime import RuntimeHolder
from gateway.sessions import SessionService, SessionStats
from gateway.telemetry.metrics import GatewayMetrics, render_metrics

_SESSION_COUNTERS = (  # SessionStats field -> (operation, outcome)
    ("fallback_reads", "load", "fallback"),
    ("fallback_writes", "save", "fallback"),
    ("conflicts", "save", "conflict"),
    ("replayed", "replay", "ok"),
    ("dropped", "replay", "dropped"),
    ("unreplicated", "save", "unreplicated"),
)


def add_metrics_route(app: web.Application, metrics: GatewayMetrics, holder: RuntimeHolder,
                      sessions: SessionService | None) -> None:
    exported = _SessionExport(metrics, sessions)

    async def scrape(_: web.Request) -> web.Response:
        for backend in holder.current.backends.values():
            metrics.set_breaker_state(backend.name, backend.breaker.state.value)
            metrics.set_in_flight(backend.name, backend.in_flight)
        exported.update()
        body, content_type = render_metrics(metrics)
        return web.Response(body=body, headers={"Content-Type": content_type})

    app.router.add_get("/metrics", scrape)


class _SessionExport:
    """Turns the sessions' running totals into counter increments, scrape by scrape."""

    def __init__(self, metrics: GatewayMetrics, sessions: SessionService | None) -> None:
        self._metrics = metrics
        self._sessions = sessions
        self._last: SessionStats | None = None

    def update(self) -> None:
        if self._sessions is None:
            return
        stats = self._sessions.stats
        store = self._sessions.config.store
        for field, op, outcome in _SESSION_COUNTERS:
            delta = getattr(stats, field) - (getattr(self._last, field) if self._last else 0)
            if delta > 0:
                self._metrics.session_store_op(store, op, outcome, delta)
        self._metrics.set_session_fallback_backlog(stats.backlog)
        self._last = stats
