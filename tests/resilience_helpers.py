"""Small helpers for the resilience tests: scripting simulators, counting their traffic."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

import aiohttp

from gateway.app import RUNTIME
from gateway.resilience.breaker import CircuitBreaker
from gateway.sim import SimServer
from tests.gateway_harness import RunningGateway

CHAT = {"model": "sim-model", "messages": [{"role": "user", "content": "hello"}]}


async def set_faults(http: aiohttp.ClientSession, sim: SimServer, **faults: Any) -> None:
    async with http.put(f"{sim.url}/sim/faults", json=faults) as response:
        assert response.status == 200, await response.text()


def inference_requests(sim: SimServer) -> int:
    """Requests the simulator received on its inference endpoints."""
    return sum(count for path, count in sim.state.requests_by_path.items()
               if path.startswith("/v1/") and path != "/v1/models")


def breaker(gateway: RunningGateway, name: str) -> CircuitBreaker:
    return gateway.app[RUNTIME].current.backends[name].breaker


async def post(http: aiohttp.ClientSession, gateway: RunningGateway,
               body: dict[str, Any] = CHAT, headers: dict[str, str] | None = None
               ) -> tuple[int, dict[str, Any], dict[str, str], float]:
    start = time.monotonic()
    async with http.post(f"{gateway.url}/v1/chat/completions", json=body,
                         headers=headers) as response:
        payload = await response.json()
        return response.status, payload, dict(response.headers), time.monotonic() - start


async def eventually(condition: Callable[[], bool], *, within: float, what: str) -> None:
    """Wait (bounded) for a condition that time itself makes true, e.g. a breaker timer."""
    deadline = time.monotonic() + within
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {within} s: {what}")
        await asyncio.sleep(0.02)
