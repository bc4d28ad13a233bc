"""Configuration of the per-backend circuit breaker: the ``[breaker]`` section.

A breaker trips on a *tier*: enough failures in a row AND a high enough error
rate over a sliding window. Requiring both keeps one unlucky burst on a busy
backend (high count, low rate) and a few failures on an idle one (high rate,
tiny sample) from draining a healthy backend. Several tiers let a clearly dead
backend (long streak) stay out longer than a flaky one.

```toml
[breaker]
window_seconds = 60
min_calls = 10
half_open_max_calls = 1
half_open_successes = 2

[[breaker.tiers]]          # most severe first
consecutive_failures = 10
error_rate = 0.40
open_seconds = 180

[[breaker.tiers]]
consecutive_failures = 5
error_rate = 0.60
open_seconds = 60
```
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import pairwise

from gateway.configreader import Table

__all__ = ["BreakerConfig", "BreakerTier", "parse_breaker"]


@dataclass(frozen=True, slots=True)
class BreakerTier:
    """One trip condition and how long the breaker then stays open."""

    consecutive_failures: int
    """Failures in a row (ignored outcomes do not break the run)."""
    error_rate: float
    """Failures / calls over the window, in (0, 1]; reached means "at least"."""
    open_seconds: float
    """How long the breaker stays open before it lets probes through."""


@dataclass(frozen=True, slots=True)
class BreakerConfig:
    """The breaker settings shared by every backend."""

    window_seconds: float = 60.0
    """The sliding window over which the error rate is measured."""
    min_calls: int = 10
    """Below this many calls in the window there is no error rate: no tier can trip."""
    half_open_max_calls: int = 1
    """Probes admitted at the same time while half-open; other callers are refused."""
    half_open_successes: int = 2
    """Probe successes in a row that close the breaker again."""
    tiers: tuple[BreakerTier, ...] = (
        BreakerTier(consecutive_failures=10, error_rate=0.40, open_seconds=180.0),
        BreakerTier(consecutive_failures=5, error_rate=0.60, open_seconds=60.0),
    )
    """Most severe first (strictly decreasing ``consecutive_failures``)."""
    shared: bool = False
    """Publish every trip to the other replicas through Redis, so they open it too."""
    redis_url: str = ""
    """The Redis that carries shared trips (required when ``shared``)."""


def parse_breaker(table: Table) -> BreakerConfig:
    """Read the ``[breaker]`` table; keys it leaves out keep their defaults.

    Omitting ``[[breaker.tiers]]`` keeps the default tier table; giving it
    replaces the whole table (tiers are not merged one by one, which would
    make the effective table hard to see from the file).
    """
    defaults = BreakerConfig()
    config = BreakerConfig(
        window_seconds=table.seconds("window_seconds", defaults.window_seconds),
        min_calls=table.integer("min_calls", defaults.min_calls, minimum=1),
        half_open_max_calls=table.integer(
            "half_open_max_calls", defaults.half_open_max_calls, minimum=1),
        half_open_successes=table.integer(
            "half_open_successes", defaults.half_open_successes, minimum=1),
        tiers=_tiers(table) if table.has("tiers") else defaults.tiers,
        shared=table.boolean("shared", defaults.shared),
        redis_url=table.string("redis_url", "", non_empty=False),
    )
    if config.shared and not config.redis_url.startswith(("redis://", "rediss://")):
        raise table.error("redis_url", "a redis:// URL when shared = true", config.redis_url)
    table.finish()
    return config


def _tiers(table: Table) -> tuple[BreakerTier, ...]:
    """Read ``[[breaker.tiers]]`` and check that it is ordered most severe first.

    The order is not fixed up silently: the breaker evaluates tiers in file
    order, so a table that reads differently from how it behaves would mislead
    whoever tunes it.
    """
    tiers = tuple(_tier(item) for item in table.tables("tiers"))
    if not tiers:
        raise table.error("tiers", "at least one [[breaker.tiers]] table", [])
    counts = [tier.consecutive_failures for tier in tiers]
    if any(later >= earlier for earlier, later in pairwise(counts)):
        raise table.error(
            "tiers",
            "the tiers ordered most severe first, by strictly decreasing"
            " consecutive_failures (no two equal): reorder the [[breaker.tiers]] tables",
            counts,
        )
    return tiers


def _tier(table: Table) -> BreakerTier:
    for key in ("consecutive_failures", "error_rate", "open_seconds"):
        if not table.has(key):
            raise table.error(key, "a value (this key is required in every tier)", "nothing")
    tier = BreakerTier(
        consecutive_failures=table.integer("consecutive_failures", 1, minimum=1),
        error_rate=table.number("error_rate", 1.0, maximum=1.0, what="an error rate"),
        open_seconds=table.seconds("open_seconds", 1.0),
    )
    table.finish()
    return tier
