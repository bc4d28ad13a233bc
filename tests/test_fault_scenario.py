"""Issue 3's scenario, shortened: a dead backend, a flaky one, a good one, 200 clients."""

from __future__ import annotations

from bench.fault_scenario import TOTAL_DEADLINE, run_scenario


async def test_every_request_succeeds_through_a_dead_and_a_flaky_backend():
    result = await run_scenario(clients=200, seconds=6.0)
    assert result.requests > 500, result.summary()
    assert result.statuses == {200: result.requests}, result.summary()
    assert result.slowest < TOTAL_DEADLINE, result.summary()
    assert result.dead_breaker_opened, result.summary()
    assert result.dead_traffic_while_open == 0, result.summary()
