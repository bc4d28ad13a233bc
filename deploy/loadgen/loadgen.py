"""Steady chat traffic for the compose stack, and a recurring fault on one backend.

Runs in the gateway image (it uses aiohttp, a dependency of the gateway), as the
``loadgen`` service of deploy/compose.yaml; or by hand:

    .venv/bin/python deploy/loadgen/loadgen.py        # LOADGEN_* variables below

Clients send chat completions through the load balancer, half of them streamed, most
in a handful of sessions (``X-Session-Id``) so that session storage and the archive
have work. Every ``LOADGEN_FAULT_EVERY`` seconds the simulator at ``LOADGEN_FAULT_URL``
is told (``PUT /sim/faults``) to answer 503 for ``LOADGEN_FAULT_FOR`` seconds, then
reset: retries, breaker trips (shared between replicas) and recovery show on the
dashboard. A line of counts is printed every ``LOADGEN_REPORT_EVERY`` seconds.

Environment (defaults in brackets): LOADGEN_URL [http://lb:8080], LOADGEN_MODEL
[sim-model], LOADGEN_CONCURRENCY [8], LOADGEN_PAUSE [0.2 s between requests of one
client], LOADGEN_SESSIONS [32], LOADGEN_API_KEY [none], LOADGEN_FAULT_URL [none: no
faults], LOADGEN_FAULT_EVERY [300], LOADGEN_FAULT_FOR [90], LOADGEN_FAULT_RATE [1.0],
LOADGEN_REPORT_EVERY [10], LOADGEN_DURATION [0: forever].
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import json
import os
import random
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass

import aiohttp


@dataclass(frozen=True)
class Settings:
    url: str = "http://lb:8080"
    model: str = "sim-model"
    concurrency: int = 8
    pause: float = 0.2
    sessions: int = 32
    api_key: str = ""
    fault_url: str = ""
    fault_every: float = 300.0
    fault_for: float = 90.0
    fault_rate: float = 1.0
    report_every: float = 10.0
    duration: float = 0.0

    @classmethod
    def from_env(cls, env: Mapping[str, str] = os.environ) -> Settings:
        d = cls()

        def get(name: str, default: object) -> str:
            return env.get(f"LOADGEN_{name.upper()}", str(default))

        return cls(
            url=get("url", d.url).rstrip("/"), model=get("model", d.model),
            concurrency=int(get("concurrency", d.concurrency)),
            pause=float(get("pause", d.pause)), sessions=int(get("sessions", d.sessions)),
            api_key=get("api_key", d.api_key), fault_url=get("fault_url", d.fault_url).rstrip("/"),
            fault_every=float(get("fault_every", d.fault_every)),
            fault_for=float(get("fault_for", d.fault_for)),
            fault_rate=float(get("fault_rate", d.fault_rate)),
            report_every=float(get("report_every", d.report_every)),
            duration=float(get("duration", d.duration)),
        )


PROMPTS = ("Hello", "Summarize our conversation.", "And in French?", "Give me three ideas.",
           "Explain circuit breakers briefly.", "What did I ask first?")


class LoadGen:
    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.counts: collections.Counter[str] = collections.Counter()
        self._rng = random.Random()

    async def run(self) -> collections.Counter[str]:
        s = self.settings
        timeout = aiohttp.ClientTimeout(total=120, sock_connect=5)
        connector = aiohttp.TCPConnector(limit=s.concurrency * 2)
        async with aiohttp.ClientSession(timeout=timeout, connector=connector) as http:
            tasks = [asyncio.create_task(self._client(http, i)) for i in range(s.concurrency)]
            tasks.append(asyncio.create_task(self._report()))
            if s.fault_url:
                tasks.append(asyncio.create_task(self._faults(http)))
            try:
                if s.duration > 0:
                    await asyncio.sleep(s.duration)
                else:
                    await asyncio.gather(*tasks)
            finally:
                for task in tasks:
                    task.cancel()
                await asyncio.gather(*tasks, return_exceptions=True)
                if s.fault_url:  # never leave the simulator failing
                    await self._control(http, "POST", "/sim/reset", None)
        return self.counts

    async def _client(self, http: aiohttp.ClientSession, index: int) -> None:
        s = self.settings
        headers = {"Content-Type": "application/json"}
        if s.api_key:
            headers["Authorization"] = f"Bearer {s.api_key}"
        while True:
            stream = self._rng.random() < 0.5
            request_headers = dict(headers)
            if s.sessions > 0 and self._rng.random() < 0.8:
                request_headers["X-Session-Id"] = f"loadgen-{self._rng.randrange(s.sessions)}"
            body = {"model": s.model, "stream": stream, "max_tokens": 64,
                    "messages": [{"role": "user", "content": self._rng.choice(PROMPTS)}]}
            try:
                async with http.post(f"{s.url}/v1/chat/completions", data=json.dumps(body),
                                     headers=request_headers) as response:
                    payload = await response.read()
                    outcome = str(response.status)
                    if stream and response.status == 200 and b"[DONE]" not in payload:
                        outcome = "stream_error"
            except (TimeoutError, aiohttp.ClientError) as error:
                outcome = type(error).__name__
            self.counts[outcome] += 1
            await asyncio.sleep(s.pause * (0.5 + self._rng.random()))

    async def _faults(self, http: aiohttp.ClientSession) -> None:
        s = self.settings
        while True:
            await asyncio.sleep(max(0.0, s.fault_every - s.fault_for))
            await self._control(http, "PUT", "/sim/faults",
                                {"status": 503, "status_rate": s.fault_rate})
            print(f"loadgen: {s.fault_url} answers 503 for {s.fault_for:g} s", flush=True)
            await asyncio.sleep(s.fault_for)
            await self._control(http, "POST", "/sim/reset", None)
            print(f"loadgen: {s.fault_url} reset", flush=True)

    async def _control(self, http: aiohttp.ClientSession, method: str, path: str,
                       body: dict[str, object] | None) -> None:
        try:
            async with http.request(method, f"{self.settings.fault_url}{path}",
                                    data=None if body is None else json.dumps(body)) as response:
                await response.read()
                self.counts[f"fault_{path.rsplit('/', 1)[-1]}_{response.status}"] += 1
        except (TimeoutError, aiohttp.ClientError) as error:
            print(f"loadgen: {method} {path}: {error!r}", file=sys.stderr, flush=True)

    async def _report(self) -> None:
        started = time.monotonic()
        while True:
            await asyncio.sleep(self.settings.report_every)
            elapsed = time.monotonic() - started
            summary = " ".join(f"{key}={value}" for key, value in sorted(self.counts.items()))
            print(f"loadgen: {elapsed:.0f} s: {summary}", flush=True)


def main() -> int:
    settings = Settings.from_env()
    print(f"loadgen: {settings.concurrency} clients on {settings.url} ({settings.model})",
          flush=True)
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(LoadGen(settings).run())
    return 0


if __name__ == "__main__":
    sys.exit(main())
