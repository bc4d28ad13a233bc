"""breaker.shared: a trip in one replica opens the backend in the others, via real Redis."""

from __future__ import annotations

import asyncio

from gateway.app import SHARED_TRIPS
from gateway.resilience.breaker import BreakerState
from tests.gateway_harness import BackendSpec, config_text
from tests.resilience_helpers import breaker, eventually, inference_requests, post, set_faults


def _shared(redis_url: str) -> str:
    return (f'[breaker]\nshared = true\nredis_url = "{redis_url}"\nmin_calls = 2\n'
            "[[breaker.tiers]]\nconsecutive_failures = 2\nerror_rate = 0.5\nopen_seconds = 30\n")


async def test_a_trip_in_one_replica_opens_the_backend_in_the_other(sims, gateways, http,
                                                                     redis_url):
    sim = await sims()
    text = config_text([BackendSpec("a", sim.url)], retry="max_attempts = 1",
                       extra=_shared(redis_url))
    first, second = await gateways(text), await gateways(text)
    for gateway in (first, second):
        await asyncio.wait_for(gateway.app[SHARED_TRIPS].subscribed.wait(), 5)
    await set_faults(http, sim, status=500)
    for _ in range(2):
        assert (await post(http, first))[0] == 502
    assert breaker(first, "a").state is BreakerState.OPEN
    await eventually(lambda: breaker(second, "a").state is BreakerState.OPEN,
                     within=3.0, what="the other replica opens its breaker")
    assert 25 < breaker(second, "a").seconds_until_half_open() <= 30
    status, _, _, _ = await post(http, second)
    assert status == 503
    assert inference_requests(sim) == 2  # the second replica sent nothing


async def test_replicas_keep_working_without_redis(sims, gateways, http, redis_server):
    sim = await sims()
    gateway = await gateways(config_text([BackendSpec("a", sim.url)], retry="max_attempts = 1",
                                         extra=_shared(redis_server.url)))
    redis_server.kill()
    try:
        await set_faults(http, sim, status=500)
        for _ in range(2):
            assert (await post(http, gateway))[0] == 502
        assert breaker(gateway, "a").state is BreakerState.OPEN  # local state still works
        assert (await post(http, gateway))[0] == 503
    finally:
        redis_server.restart()
