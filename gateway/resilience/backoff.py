"""How long to wait before the next attempt.

Capped exponential backoff with jitter, in the three forms of the AWS
Architecture Blog ("Exponential Backoff And Jitter"), where ``n`` counts the
retries so far (0 before the first retry):

- ``full``:  ``U(0, min(cap, base * multiplier**n))``
- ``equal``: ``t/2 + U(0, t/2)`` with ``t = min(cap, base * multiplier**n)``
- ``decorrelated``: ``min(cap, U(base, 3 * previous))``, ``previous`` starting at ``base``

A backend's ``Retry-After`` (or ``retry-after-ms``) on a 429 or 503 replaces the
computed wait, capped by ``retry_after_cap``.
"""

from __future__ import annotations

import email.utils
import random
import time
from collections.abc import Callable, Mapping

from gateway.resilience.settings import RetryConfig


class Backoff:
    """The jittered wait sequence of one request."""

    def __init__(self, config: RetryConfig,
                 uniform: Callable[[float, float], float] = random.uniform) -> None:
        self._config = config
        self._uniform = uniform
        self._previous = config.base

    def next_wait(self, retries_so_far: int) -> float:
        c = self._config
        ceiling = min(c.cap, c.base * c.multiplier ** retries_so_far)
        if c.jitter == "full":
            wait = self._uniform(0.0, ceiling)
        elif c.jitter == "equal":
            wait = ceiling / 2 + self._uniform(0.0, ceiling / 2)
        else:
            wait = min(c.cap, self._uniform(c.base, self._previous * 3))
        self._previous = wait
        return wait


def retry_after_seconds(headers: Mapping[str, str] | None, cap: float) -> float | None:
    """The wait a backend asked for, in seconds and capped; None when it asked for none."""
    if not headers:
        return None
    millis = headers.get("retry-after-ms")
    if millis is not None:
        try:
            return _capped(float(millis) / 1000.0, cap)
        except ValueError:
            pass
    value = headers.get("Retry-After")
    if value is None:
        return None
    try:
        return _capped(float(value), cap)
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return _capped(when.timestamp() - time.time(), cap)


def _capped(seconds: float, cap: float) -> float | None:
    if seconds != seconds:  # NaN
        return None
    return min(max(seconds, 0.0), cap)
