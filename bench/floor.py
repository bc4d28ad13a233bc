"""What the stack costs before the gateway's features: bare server, bare proxy, gateway.

    .venv/bin/python -m bench.floor                       # chat at 16, 4 rounds each
    .venv/bin/python -m bench.floor --scenario stream32

Four paths in alternating rounds, the same load generator and simulator:
``direct`` (client → simulator), ``bare-fixed`` (an aiohttp server answering
a fixed completion: what aiohttp's server costs), ``bare-proxy`` (aiohttp's
server plus the gateway's backend client, relaying: any proxy on this stack)
and ``gateway`` (the default configuration). CPU per request of each server
process is read from ``/proc`` as in the suite, so the rows subtract:
gateway - bare-proxy is the price of the gateway's features (auth, limits,
routing, retries, breakers, metrics, logs), bare-proxy - bare-fixed the
price of the backend hop. See bench/RESULTS.md for how to read it.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections.abc import Sequence

from bench.loadclient import LoadGenerator
from bench.loadgen import RoundResult, RoundSpec
from bench.procs import PYTHON, Child, cores, pin_self
from bench.report import MEASURED_HEADER, measured_line, table
from bench.scenarios import BY_NAME, Sizing
from bench.stack import Stack
from bench.stats import Row, summarize

PATHS = ("direct", "bare-fixed", "bare-proxy", "gateway")


def bare_child(mode: str, core: int, backend: str) -> Child:
    return Child(f"bare-{mode}", [PYTHON, "-m", "bench.bare", mode, "--port", "0",
                                  "--backend", backend], core)


async def run_floor(scenario_name: str, concurrency: int, sizing: Sizing) -> list[Row]:
    gateway_core, load_core = cores()
    pin_self(load_core)
    scenario = BY_NAME[scenario_name]
    stack = Stack(scenario, gateway_core, load_core)
    bare: dict[str, Child] = {}
    results: dict[str, list[RoundResult]] = {path: [] for path in PATHS}
    load = await LoadGenerator(load_core).start()
    try:
        await stack.start()
        sim = stack.sims[0].url
        for mode in ("fixed", "proxy"):
            bare[mode] = await bare_child(mode, gateway_core, sim).start()
        for _ in range(sizing.rounds):
            for path in PATHS:
                results[path].append(await load.run(_spec(stack, bare, path, concurrency,
                                                          sizing)))
    finally:
        await load.stop()
        for child in bare.values():
            await child.stop()
        await stack.close()
    return [summarize(scenario_name, path, concurrency, results[path]) for path in PATHS]


def _spec(stack: Stack, bare: dict[str, Child], path: str, concurrency: int,
          sizing: Sizing) -> RoundSpec:
    spec = stack.spec("direct" if path == "direct" else "gateway", concurrency, sizing)
    if path.startswith("bare-"):
        child = bare[path.removeprefix("bare-")]
        spec.targets, spec.cpu_pid = [child.url], child.pid
    return spec


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--scenario", default="chat", choices=("chat", "stream32"))
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--requests", type=int, default=3000, help="per round")
    parser.add_argument("--seconds", type=float, default=5.0, help="per round, at most")
    args = parser.parse_args(argv)
    sizing = Sizing(rounds=args.rounds, requests=args.requests, seconds=args.seconds,
                    warmup=100)
    rows = asyncio.run(run_floor(args.scenario, args.concurrency, sizing))
    print("\n".join(table(MEASURED_HEADER, (measured_line(row) for row in rows))))
    cpu = {row.path: row.cpu_ms_per_req for row in rows}
    if all(cpu.get(path) for path in PATHS[1:]):
        print(f"\naiohttp server alone: {cpu['bare-fixed'] * 1000:.0f} µs; backend hop: "
              f"+{(cpu['bare-proxy'] - cpu['bare-fixed']) * 1000:.0f} µs; gateway features: "
              f"+{(cpu['gateway'] - cpu['bare-proxy']) * 1000:.0f} µs "
              f"(gateway {cpu['gateway'] * 1000:.0f} µs per request)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
