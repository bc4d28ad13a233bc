"""The resilience scenario of issue 3, as a benchmark command and a test.

Three simulated backends behind one gateway: ``dead`` is down from the start
(and brought back half-way, to show that its open breaker keeps it out),
``flaky`` answers 503 to half of its requests, ``good`` is healthy. Many
concurrent clients, started over the first half second, send chat requests
for a while. Expected: every request succeeds, none outlives its deadline,
and the dead backend gets no traffic while its breaker is open.

    .venv/bin/python -m bench.fault_scenario --clients 200 --seconds 30
"""

from __future__ import annotations

import argparse
import asyncio
import time
from dataclasses import dataclass, field

import aiohttp

from gateway.app import RUNTIME
from gateway.config import parse_config
from gateway.resilience.breaker import BreakerState
from gateway.sim import SimServer, SimSettings, start_sim
from tests.gateway_harness import BackendSpec, RunningGateway, config_text

BODY = {"model": "sim-model", "messages": [{"role": "user", "content": "hello"}]}
TOTAL_DEADLINE = 5.0


@dataclass
class ScenarioResult:
    requests: int = 0
    statuses: dict[int, int] = field(default_factory=dict)
    slowest: float = 0.0
    dead_traffic_while_open: int = -1
    dead_breaker_opened: bool = False
    elapsed: float = 0.0
    errors: dict[str, int] = field(default_factory=dict)

    def summary(self) -> str:
        return (f"{self.requests} requests in {self.elapsed:.1f} s "
                f"({self.requests / max(self.elapsed, 1e-9):.0f}/s), statuses {self.statuses}, "
                f"slowest {self.slowest * 1000:.0f} ms (deadline {TOTAL_DEADLINE:g} s), "
                f"dead backend opened: {self.dead_breaker_opened}, its traffic while open: "
                f"{self.dead_traffic_while_open}, errors {self.errors}")


def scenario_config(dead: str, flaky: str, good: str) -> str:
    return config_text(
        [BackendSpec("dead", dead), BackendSpec("flaky", flaky), BackendSpec("good", good)],
        timeouts=f"total = {TOTAL_DEADLINE}\nread = 2.0",
        # The retry budget is raised from the defaults (0.2 and 3): in the first
        # second, before the dead backend's breaker has seen min_calls and before
        # the pool has learnt to steer around the flaky one, about a third of
        # all attempts fail; the default budget would return some of those
        # failures to clients (the budget doing its job: see test_retries.py).
        retry="base = 0.05\ncap = 1.0\nbudget_ratio = 0.5\nbudget_min_concurrency = 10",
    )


async def _client(http: aiohttp.ClientSession, url: str, start_after: float, stop_at: float,
                  result: ScenarioResult) -> None:
    await asyncio.sleep(start_after)
    while time.monotonic() < stop_at:
        start = time.monotonic()
        async with http.post(f"{url}/v1/chat/completions", json=BODY) as response:
            body = await response.read()
            status = response.status
        if status != 200:
            # keyed by when (seconds before the end) and what, to see transients
            key = f"{stop_at - time.monotonic():.1f} s before the end: {body[:200].decode()}"
            result.errors[key] = result.errors.get(key, 0) + 1
        result.requests += 1
        result.statuses[status] = result.statuses.get(status, 0) + 1
        result.slowest = max(result.slowest, time.monotonic() - start)


async def run_scenario(clients: int, seconds: float) -> ScenarioResult:
    settings = SimSettings(ttft_ms=5, tokens=8)
    dead, flaky, good = [await start_sim(settings) for _ in range(3)]
    sims: list[SimServer] = [dead, flaky, good]
    gateway = await RunningGateway(parse_config(
        scenario_config(dead.url, flaky.url, good.url), source="scenario.toml")).start()
    dead_breaker = gateway.app[RUNTIME].current.backends["dead"].breaker
    result = ScenarioResult()
    try:
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as http:
            await http.put(f"{flaky.url}/sim/faults", json={"status": 503, "status_rate": 0.5})
            await dead.stop()
            started = time.monotonic()
            stop_at = started + seconds
            load = asyncio.gather(*(_client(http, gateway.url, 0.5 * i / clients, stop_at, result)
                                    for i in range(clients)))
            await asyncio.sleep(seconds / 2)
            result.dead_breaker_opened = dead_breaker.state is BreakerState.OPEN
            served_before_death = dead.state.requests_total
            await dead.restart()  # back, but its breaker is open: it must get nothing
            await load
            result.elapsed = time.monotonic() - started
            if dead_breaker.state is BreakerState.OPEN:
                result.dead_traffic_while_open = dead.state.requests_total - served_before_death
    finally:
        await gateway.stop()
        for sim in sims:
            await sim.stop()
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--clients", type=int, default=200)
    parser.add_argument("--seconds", type=float, default=30.0)
    args = parser.parse_args()
    result = asyncio.run(run_scenario(args.clients, args.seconds))
    print(result.summary())


if __name__ == "__main__":
    main()
