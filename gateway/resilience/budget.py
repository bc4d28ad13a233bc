"""The retry budget of a model pool, with Envoy's semantics.

Retries in flight stay under ``max(min_concurrency, ratio * active requests)``.
When a fleet fails completely, every request fails at once and wants to
retry; the budget turns that into about ``(1 + ratio)`` times the client's
request rate instead of ``max_attempts`` times, so a struggling fleet is not
buried under the gateway's own retries.
"""

from __future__ import annotations


class RetryBudget:
    def __init__(self, ratio: float, min_concurrency: int) -> None:
        self.ratio = ratio
        self.min_concurrency = min_concurrency
        self.active_requests = 0
        self.active_retries = 0
        self.refused = 0

    def limit(self) -> float:
        return max(self.min_concurrency, self.ratio * self.active_requests)

    def try_begin_retry(self) -> bool:
        """Take room for one retry; False (and counted) when the budget is spent."""
        if self.active_retries + 1 > self.limit():
            self.refused += 1
            return False
        self.active_retries += 1
        return True

    def end_retry(self) -> None:
        self.active_retries -= 1
