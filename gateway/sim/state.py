"""The mutable state of one simulator: current defaults and what it has received.

Tests read the counters to learn which backend a gateway chose and what it
forwarded, and change the defaults to make one backend misbehave. Everything
else in the simulator is immutable, so this is the one place to look for
what changes while it runs.
"""

from __future__ import annotations

import random
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from aiohttp import web

from gateway.sim.overrides import RequestOptions
from gateway.sim.settings import SimSettings

LAST_REQUESTS = 100
"""How many recent requests ``last_requests`` keeps."""


@dataclass(eq=False)
class SimState:
    """Current settings and counters of one simulator (owned by its aiohttp app)."""

    startup: SimSettings
    """The settings the simulator started with; ``POST /sim/reset`` returns to them."""
    settings: SimSettings = field(init=False)
    """Current defaults; a request's headers override them."""
    requests_total: int = field(init=False, default=0)
    requests_by_path: dict[str, int] = field(init=False, default_factory=dict)
    last_requests: deque[dict[str, Any]] = field(
        init=False, default_factory=lambda: deque(maxlen=LAST_REQUESTS)
    )
    """Each ``{"path", "headers": {lowercased name: value}, "body": parsed JSON or None}``."""
    on_refuse: Callable[[], None] | None = field(init=False, default=None)
    """Stops the listener soon (after the current answer); set by ``SimServer``.

    A bare application, run by someone else's runner, cannot stop listening.
    """
    options: RequestOptions = field(init=False)
    """``settings`` as request options, built once per change instead of per request."""
    rng: random.Random = field(init=False)
    """Decides ``status_rate`` draws; seeded so that a test run is repeatable."""

    def __post_init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        """Back to the startup settings, counters zeroed, generator reseeded."""
        self.use(self.startup)
        self.requests_total = 0
        self.requests_by_path.clear()
        self.last_requests.clear()
        self.rng = random.Random(self.startup.seed)

    def use(self, settings: SimSettings) -> None:
        """Make ``settings`` the current defaults."""
        self.settings = settings
        self.options = RequestOptions.from_settings(settings)

    def record(self, path: str, headers: Mapping[str, str], body: object) -> None:
        """Count one request and remember it (control requests are not recorded)."""
        self.requests_total += 1
        self.requests_by_path[path] = self.requests_by_path.get(path, 0) + 1
        self.last_requests.append(
            {
                "path": path,
                "headers": {name.lower(): value for name, value in headers.items()},
                "body": body,
            }
        )

    def snapshot(self) -> dict[str, Any]:
        """The JSON answer of ``GET /sim/state``."""
        return {
            "settings": asdict(self.settings),
            "requests_total": self.requests_total,
            "requests_by_path": dict(self.requests_by_path),
            "last_requests": list(self.last_requests),
        }


STATE_KEY = web.AppKey("sim_state", SimState)
"""Where the aiohttp application keeps its ``SimState``."""
