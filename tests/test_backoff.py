"""The backoff formulas, Retry-After parsing and the retry budget, without a network."""

from __future__ import annotations

import email.utils
import time

import pytest

from gateway.resilience.backoff import Backoff, retry_after_seconds
from gateway.resilience.budget import RetryBudget
from gateway.resilience.settings import RetryConfig


def _lowest(low: float, high: float) -> float:
    return low


def _highest(low: float, high: float) -> float:
    return high


@pytest.mark.parametrize("jitter,uniform,expected", [
    ("full", _highest, [0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 30.0, 30.0]),
    ("full", _lowest, [0.0] * 8),
    ("equal", _lowest, [0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 15.0, 15.0]),
    ("equal", _highest, [0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 30.0, 30.0]),
    # decorrelated: min(cap, U(base, 3 * previous)), previous starting at base
    ("decorrelated", _highest, [1.5, 4.5, 13.5, 30.0, 30.0, 30.0, 30.0, 30.0]),
    ("decorrelated", _lowest, [0.5] * 8),
])
def test_backoff_bounds_follow_the_formula(jitter, uniform, expected):
    backoff = Backoff(RetryConfig(base=0.5, multiplier=2.0, cap=30.0, jitter=jitter), uniform)
    assert [backoff.next_wait(n) for n in range(8)] == pytest.approx(expected)


def test_full_jitter_spreads_within_the_cap():
    backoff = Backoff(RetryConfig(base=0.5, cap=30.0))
    waits = [backoff.next_wait(3) for _ in range(2000)]
    assert all(0.0 <= w <= 4.0 for w in waits)
    assert 1.6 < sum(waits) / len(waits) < 2.4  # mean of U(0, 4)


@pytest.mark.parametrize("headers,cap,expected", [
    ({"Retry-After": "2"}, 60.0, 2.0),
    ({"Retry-After": "0.25"}, 60.0, 0.25),
    ({"Retry-After": "120"}, 60.0, 60.0),
    ({"retry-after-ms": "1500", "Retry-After": "9"}, 60.0, 1.5),
    ({"Retry-After": "soon"}, 60.0, None),
    ({}, 60.0, None),
    (None, 60.0, None),
])
def test_retry_after_is_read_and_capped(headers, cap, expected):
    assert retry_after_seconds(headers, cap) == expected


def test_retry_after_as_an_http_date():
    when = email.utils.formatdate(time.time() + 5, usegmt=True)
    assert 3.0 <= retry_after_seconds({"Retry-After": when}, 60.0) <= 5.0


def test_budget_allows_a_ratio_of_active_requests_and_a_floor():
    budget = RetryBudget(ratio=0.2, min_concurrency=3)
    budget.active_requests = 50
    taken = sum(budget.try_begin_retry() for _ in range(20))
    assert taken == 10 and budget.refused == 10
    budget.end_retry()
    assert budget.try_begin_retry()
    small = RetryBudget(ratio=0.2, min_concurrency=3)
    small.active_requests = 1
    assert [small.try_begin_retry() for _ in range(4)] == [True, True, True, False]
