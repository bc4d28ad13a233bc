"""What one scenario runs against: simulators, maybe Redis, and a fresh gateway.

A fresh gateway per scenario and concurrency, because the peak RSS it reports
(``VmHWM``) is a high-water mark that never goes down: a gateway reused after
the 1,000-stream scenario would show that peak in every later row. The
simulators and Redis live on the load core with the load generator; the
gateway is alone on its core. Everything is stopped in ``close()``, also
when a start fails half-way.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from bench import configs
from bench.loadgen import RoundSpec
from bench.procs import PYTHON, Child, check_config, gateway_child, sim_child
from bench.scenarios import Scenario, Sizing

SESSIONS_PROBE_URL = "redis://127.0.0.1:6399/0"
"""Any well-formed URL: ``check-config`` validates the table, it does not connect."""


def sessions_available() -> tuple[bool, str]:
    """Whether this gateway accepts a ``[sessions]`` table (issue 4 is being built)."""
    text = configs.config_text([configs.Backend("probe", "http://127.0.0.1:9")],
                               configs.sessions_overrides(SESSIONS_PROBE_URL))
    ok, output = check_config(configs.write_config(text))
    return ok, output.splitlines()[-1] if output else "no output"


@dataclass
class Stack:
    """The running processes of one scenario x concurrency."""

    scenario: Scenario
    gateway_core: int
    load_core: int
    sims: list[Child] = field(default_factory=list)
    gateway: Child | None = None
    trace_sink: Child | None = None
    """Receives the sampled spans (OTLP/HTTP): the issue's targets hold with tracing on."""
    redis: Any = None
    """A ``tests.services.RedisServer`` for the session scenario."""
    redis_pid: int = 0
    overrides: configs.Overrides = field(default_factory=dict)
    """Settings changed from ``config.toml`` (``bench.ab`` compares a setting on and off)."""

    async def start(self) -> Stack:
        try:
            await self._start()
        except BaseException:
            await self.close()
            raise
        return self

    async def _start(self) -> None:
        scenario = self.scenario
        for index in range(scenario.sims):
            sim = sim_child(self.load_core, ttft_ms=scenario.ttft_ms, itl_ms=scenario.itl_ms,
                            tokens=scenario.tokens, name=f"sim-{index + 1}")
            self.sims.append(await sim.start())
        if scenario.faulty_status_rate:
            await put_faults(self.sims[-1].url, {"status": 503,
                                                 "status_rate": scenario.faulty_status_rate})
        self.trace_sink = await Child(
            "trace-sink", [PYTHON, "-m", "bench.bare", "fixed", "--port", "0"],
            self.load_core).start()
        overrides = {table: dict(values) for table, values in self.overrides.items()}
        telemetry = overrides.setdefault("telemetry", {})
        telemetry.setdefault("traces_exporter", '"otlp"')  # sampled as config.toml says: 1 %
        telemetry.setdefault("otlp_endpoint", f'"{self.trace_sink.url}/v1/traces"')
        if scenario.session_turns:
            overrides.update(configs.sessions_overrides(self._start_redis()))
        backends = [configs.Backend(sim.name, sim.url, scenario.max_concurrency)
                    for sim in self.sims]
        path = configs.write_config(configs.config_text(backends, overrides))
        ok, output = check_config(path)
        if not ok:
            raise RuntimeError(f"gateway refuses the benchmark configuration: {output}")
        self.gateway = await gateway_child(path, self.gateway_core).start()

    def _start_redis(self) -> str:
        """A private redis-server on a free port in a temp dir, pinned to the load core."""
        from tests.services import RedisServer, redis_command

        self.redis = RedisServer().start()
        self.redis_pid = int(redis_command(self.redis.port, "INFO", "server")["process_id"])
        with contextlib.suppress(OSError):
            os.sched_setaffinity(self.redis_pid, {self.load_core})
        return str(self.redis.url)

    def spec(self, path: str, concurrency: int, sizing: Sizing) -> RoundSpec:
        """The round spec of ``path`` (``direct`` or ``gateway``) for this scenario."""
        scenario = self.scenario
        direct = path == "direct"
        assert self.gateway is not None
        return RoundSpec(
            targets=[sim.url for sim in self.sims] if direct else [self.gateway.url],
            stream=scenario.stream, concurrency=concurrency, rate=scenario.rate,
            max_requests=sizing.requests,
            max_seconds=sizing.seconds, warmup=sizing.warmup,
            ramp_seconds=scenario.ramp_seconds, session_turns=scenario.session_turns,
            session_mode=("client" if direct else "server") if scenario.session_turns else "",
            cpu_pid=0 if direct else self.gateway.pid,
            watch_cores=[self.gateway_core, self.load_core])

    async def close(self) -> None:
        if self.gateway is not None:
            await self.gateway.stop()
        for sim in self.sims:
            await sim.stop()
        if self.trace_sink is not None:
            await self.trace_sink.stop()
        if self.redis is not None:
            self.redis.stop()


async def put_faults(sim_url: str, faults: dict[str, Any]) -> None:
    """``PUT /sim/faults`` on one simulator (its defaults for every later request)."""
    async with aiohttp.ClientSession() as http, \
            http.put(f"{sim_url}/sim/faults", json=faults) as response:
        if response.status != 200:
            raise RuntimeError(f"PUT /sim/faults on {sim_url}: {response.status} "
                               f"{await response.text()}")

