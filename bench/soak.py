"""Soak: steady load on one gateway for minutes, its RSS sampled, growth reported.

    .venv/bin/python -m bench.soak --minutes 10 [--concurrency 32] [--interval 5]

A leak per request is invisible in a 10-second benchmark and obvious after
hundreds of thousands of requests: this keeps one gateway process busy with
alternating rounds of non-streaming requests and 32-token streams (each round
opens new client connections, so connection churn is soaked too), samples
``VmRSS`` every ``--interval`` seconds, and compares the mean RSS of the first
minute with that of the last. Bounded: the load stops when the time is up
(each round is bounded in requests and seconds too). Writes ``soak.jsonl``
(one sample per line) and ``soak.md`` into ``--out``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

import orjson

from bench.loadclient import LoadGenerator
from bench.procs import ROOT, cores, peak_rss_mb, pin_self, rss_mb
from bench.scenarios import Scenario, Sizing
from bench.stack import Stack

SOAK = Scenario("soak", "alternating chat and 32-token streams", (32,), tokens=32,
                full=Sizing(rounds=1, requests=200_000, seconds=10.0, warmup=0),
                quick=Sizing(rounds=1, requests=200_000, seconds=10.0, warmup=0))
GROWTH_LIMIT = 0.05
"""Last-minute mean RSS at most 5 % above the first minute's counts as no growth."""


@dataclass
class SoakResult:
    samples: list[tuple[float, float]] = field(default_factory=list)
    """(seconds since start, RSS MB)."""
    requests: int = 0
    ok: int = 0
    errors: dict[str, int] = field(default_factory=dict)
    seconds: float = 0.0
    cpu_ms_per_req: float = 0.0
    peak_rss_mb: float = 0.0

    def window_means(self, window: float) -> tuple[float, float]:
        """Mean RSS of the first and of the last ``window`` seconds."""
        end = self.samples[-1][0]
        first = [mb for t, mb in self.samples if t <= window]
        last = [mb for t, mb in self.samples if t >= end - window]
        return sum(first) / len(first), sum(last) / len(last)


async def _sample(pid: int, interval: float, result: SoakResult, started: float) -> None:
    while True:
        result.samples.append((time.monotonic() - started, rss_mb(pid)))
        await asyncio.sleep(interval)


async def soak(minutes: float, concurrency: int, interval: float) -> SoakResult:
    """Run the load for ``minutes`` while sampling the gateway's RSS."""
    gateway_core, load_core = cores()
    pin_self(load_core)
    stack = await Stack(SOAK, gateway_core, load_core).start()
    load = await LoadGenerator(load_core).start()
    result = SoakResult()
    cpu = 0.0
    try:
        assert stack.gateway is not None
        started = time.monotonic()
        stop_at = started + minutes * 60
        sampler = asyncio.create_task(_sample(stack.gateway.pid, interval, result, started))
        stream = False
        while (left := stop_at - time.monotonic()) > 0.5:
            spec = replace(stack.spec("gateway", concurrency, SOAK.full), stream=stream,
                           max_seconds=min(SOAK.full.seconds, left))
            round_result = await load.run(spec)
            result.requests += round_result.requests
            result.ok += round_result.ok
            for key, count in round_result.errors.items():
                result.errors[key] = result.errors.get(key, 0) + count
            cpu += round_result.cpu_seconds or 0.0
            stream = not stream
        result.samples.append((time.monotonic() - started, rss_mb(stack.gateway.pid)))
        sampler.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await sampler
        result.seconds = time.monotonic() - started
        result.peak_rss_mb = peak_rss_mb(stack.gateway.pid)
        result.cpu_ms_per_req = cpu / max(result.requests, 1) * 1000
    finally:
        await load.stop()
        await stack.close()
    return result


def summary(result: SoakResult, minutes: float) -> list[str]:
    """The Markdown lines of the report, verdict included."""
    window = min(60.0, result.seconds / 4)
    first, last = result.window_means(window)
    growth = last / first - 1
    verdict = "no growth" if growth <= GROWTH_LIMIT else "GROWTH"
    return [
        f"## Soak: {minutes:g} min, {result.requests} requests "
        f"({result.requests / max(result.seconds, 1e-9):.0f}/s), "
        f"{result.requests - result.ok} errors {result.errors or ''}",
        "",
        f"- RSS mean over the first {window:.0f} s: {first:.1f} MB; over the last "
        f"{window:.0f} s: {last:.1f} MB; growth {last - first:+.1f} MB ({growth * 100:+.1f} %)"
        f" → **{verdict}** (limit +{GROWTH_LIMIT * 100:.0f} %)",
        f"- peak RSS (VmHWM) {result.peak_rss_mb:.1f} MB; gateway CPU "
        f"{result.cpu_ms_per_req:.3f} ms per request",
        "- samples (s, MB): " + ", ".join(f"{t:.0f}:{mb:.1f}" for t, mb in result.samples),
    ]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=10.0)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--interval", type=float, default=5.0, help="seconds between samples")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "out")
    args = parser.parse_args(argv)
    if not 0 < args.minutes <= 120:
        parser.error("--minutes must be in (0, 120]")
    result = asyncio.run(soak(args.minutes, args.concurrency, args.interval))
    lines = summary(result, args.minutes)
    args.out.mkdir(parents=True, exist_ok=True)
    with (args.out / "soak.jsonl").open("wb") as out:
        for t, mb in result.samples:
            out.write(orjson.dumps({"t_s": round(t, 2), "rss_mb": round(mb, 2)}) + b"\n")
    (args.out / "soak.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    first, last = result.window_means(min(60.0, result.seconds / 4))
    return 0 if last / first - 1 <= GROWTH_LIMIT else 1


if __name__ == "__main__":
    sys.exit(main())
