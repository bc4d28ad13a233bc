"""Settings of the retry policy and of load shedding (``[retry]``, ``[shedding]``)."""

from __future__ import annotations

from dataclasses import dataclass

from gateway.configreader import Table

JITTER_MODES = ("full", "equal", "decorrelated")
DEFAULT_RETRY_ON = (429, 502, 503, 504)


@dataclass(frozen=True, slots=True)
class RetryConfig:
    max_attempts: int = 4
    """Attempts per request, the first included."""
    base: float = 0.5
    multiplier: float = 2.0
    cap: float = 30.0
    jitter: str = "full"
    retry_on: tuple[int, ...] = DEFAULT_RETRY_ON
    """Backend statuses that are retried (connection errors and timeouts always are)."""
    retry_after_cap: float = 60.0
    budget_ratio: float = 0.2
    budget_min_concurrency: int = 3


@dataclass(frozen=True, slots=True)
class SheddingConfig:
    max_queue: int = 64
    """Requests of one model that may wait for a free backend slot at once."""
    max_queue_delay_ms: float = 10.0
    """Longest such a wait; then the request is shed with 429."""


def parse_retry(table: Table) -> RetryConfig:
    d = RetryConfig()
    config = RetryConfig(
        max_attempts=table.integer("max_attempts", d.max_attempts, minimum=1, maximum=20),
        base=table.seconds("base", d.base),
        multiplier=table.number("multiplier", d.multiplier, minimum=1.0, allow_equal=True),
        cap=table.seconds("cap", d.cap),
        jitter=table.string("jitter", d.jitter, choices=JITTER_MODES),
        retry_on=table.integers("retry_on", list(d.retry_on), minimum=400, maximum=599),
        retry_after_cap=table.seconds("retry_after_cap", d.retry_after_cap, allow_zero=True),
        budget_ratio=table.number("budget_ratio", d.budget_ratio, allow_equal=True,
                                  maximum=1.0, what="a ratio"),
        budget_min_concurrency=table.integer("budget_min_concurrency",
                                             d.budget_min_concurrency, minimum=0),
    )
    if config.cap < config.base:
        raise table.error("cap", f"seconds >= base ({config.base:g})", config.cap)
    table.finish()
    return config


def parse_shedding(table: Table) -> SheddingConfig:
    d = SheddingConfig()
    config = SheddingConfig(
        max_queue=table.integer("max_queue", d.max_queue, minimum=0),
        max_queue_delay_ms=table.number("max_queue_delay_ms", d.max_queue_delay_ms,
                                        allow_equal=True, what="milliseconds"),
    )
    table.finish()
    return config
