"""The retry loop of one request, on tenacity.

Three limits decide whether a failed attempt gets another, checked in this
order after the wait has been computed (tenacity computes the wait, then asks
``stop``; see NOTES.md):

1. attempts: at most ``max_attempts`` in all;
2. the deadline: a wait that would reach past the request's deadline is not
   taken (waiting and then failing anyway helps nobody);
3. the retry budget of the pool (:mod:`gateway.resilience.budget`), except
   for a failure that put no load on any backend (a refused connection):
   the budget exists to cap the load retries add to a fleet, and retrying
   such a failure adds none.

The wait is the jittered backoff (:mod:`gateway.resilience.backoff`) unless
the failure carries a ``Retry-After``, which replaces it.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from tenacity import AsyncRetrying, RetryCallState, retry_if_exception
from tenacity.wait import wait_base

from gateway.resilience.backoff import Backoff
from gateway.resilience.budget import RetryBudget
from gateway.resilience.deadline import Deadline
from gateway.resilience.settings import RetryConfig

Classifier = Callable[[BaseException], bool]
RetryAfter = Callable[[BaseException], float | None]


@dataclass(slots=True)
class RetryRecord:
    """What happened to one request's retries: for headers, logs and spans."""

    waits: list[float] = field(default_factory=list)
    stop_reason: str | None = None
    """Why retrying stopped: "attempts", "deadline" or "budget" (None: it did not)."""
    holds_budget: bool = False


class _Wait(wait_base):
    def __init__(self, backoff: Backoff, retry_after: RetryAfter) -> None:
        self._backoff = backoff
        self._retry_after = retry_after

    def __call__(self, retry_state: RetryCallState) -> float:
        outcome = retry_state.outcome
        error = outcome.exception() if outcome is not None else None
        hinted = self._retry_after(error) if error is not None else None
        if hinted is not None:
            return hinted
        return self._backoff.next_wait(retry_state.attempt_number - 1)


class RetryPolicy:
    """Builds the retry loop of each request from the ``[retry]`` settings."""

    def __init__(self, config: RetryConfig, *,
                 sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
                 uniform: Callable[[float, float], float] = random.uniform) -> None:
        self.config = config
        self._sleep = sleep
        self._uniform = uniform

    def retrying(self, *, deadline: Deadline, budget: RetryBudget, record: RetryRecord,
                 retryable: Classifier, retry_after: RetryAfter,
                 free: Classifier) -> AsyncRetrying:
        """A fresh loop for one request (tenacity loops keep per-run state).

        ``free`` tells the failures whose retry the budget does not count.
        """

        def stop(retry_state: RetryCallState) -> bool:
            outcome = retry_state.outcome
            error = outcome.exception() if outcome is not None else None
            if retry_state.attempt_number >= self.config.max_attempts:
                record.stop_reason = "attempts"
            elif (retry_state.upcoming_sleep or 0.0) >= deadline.remaining():
                record.stop_reason = "deadline"
            elif error is not None and free(error):
                record.waits.append(retry_state.upcoming_sleep or 0.0)
                return False
            elif not budget.try_begin_retry():
                record.stop_reason = "budget"
            else:
                record.holds_budget = True
                record.waits.append(retry_state.upcoming_sleep or 0.0)
                return False
            return True

        return AsyncRetrying(
            stop=stop,
            wait=_Wait(Backoff(self.config, self._uniform), retry_after),
            retry=retry_if_exception(retryable),
            sleep=self._sleep,
            reraise=True,
        )
