"""A/B of one configuration change: two gateways, same scenario, alternating rounds.

    .venv/bin/python -m bench.ab --scenario chat --b-set telemetry.log_requests=false

Gateway A runs the default configuration, gateway B the same with the
``--b-set TABLE.KEY=VALUE`` settings (VALUE a TOML literal, repeatable);
rounds alternate A, B, A, B… on the same simulator settings, so the
difference in CPU per request is the price of that one setting, measured the
way the suite measures (and as noisy: repeat with more ``--rounds`` when the
difference is small). Meant for the hot-path work: what does a feature cost?
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections.abc import Sequence

from bench.configs import Overrides, parse_override
from bench.loadclient import LoadGenerator
from bench.loadgen import RoundResult
from bench.procs import cores, pin_self
from bench.report import MEASURED_HEADER, measured_line, table
from bench.scenarios import BY_NAME, Sizing
from bench.stack import Stack
from bench.stats import Row, summarize


async def run_ab(scenario_name: str, b_overrides: Overrides, concurrency: int,
                 sizing: Sizing) -> tuple[Row, Row]:
    """(row of A, row of B), each pooled over its rounds."""
    gateway_core, load_core = cores()
    pin_self(load_core)
    scenario = BY_NAME[scenario_name]
    stacks = {"A": Stack(scenario, gateway_core, load_core),
              "B": Stack(scenario, gateway_core, load_core, overrides=b_overrides)}
    results: dict[str, list[RoundResult]] = {"A": [], "B": []}
    load = await LoadGenerator(load_core).start()
    try:
        for stack in stacks.values():
            await stack.start()
        for _ in range(sizing.rounds):
            for name, stack in stacks.items():
                results[name].append(await load.run(stack.spec("gateway", concurrency, sizing)))
    finally:
        await load.stop()
        for stack in stacks.values():
            await stack.close()
    a, b = (summarize(f"{scenario_name} {name}", "gateway", concurrency, results[name])
            for name in ("A", "B"))
    return a, b


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--scenario", default="chat", choices=sorted(BY_NAME))
    parser.add_argument("--b-set", action="append", required=True, metavar="TABLE.KEY=VALUE",
                        help="a setting of gateway B (VALUE a TOML literal); repeatable")
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--requests", type=int, default=3000, help="per round")
    parser.add_argument("--seconds", type=float, default=5.0, help="per round, at most")
    args = parser.parse_args(argv)
    sizing = Sizing(rounds=args.rounds, requests=args.requests, seconds=args.seconds,
                    warmup=100)
    overrides: dict[str, dict[str, str]] = {}
    for text in args.b_set:
        try:
            section, key, value = parse_override(text)
        except ValueError as exc:
            parser.error(str(exc))
        overrides.setdefault(section, {})[key] = value
    a, b = asyncio.run(run_ab(args.scenario, overrides, args.concurrency, sizing))
    print("\n".join(table(MEASURED_HEADER, (measured_line(row) for row in (a, b)))))
    if a.cpu_ms_per_req and b.cpu_ms_per_req:
        delta = b.cpu_ms_per_req - a.cpu_ms_per_req
        print(f"\nB - A: {delta * 1000:+.0f} µs CPU per request "
              f"({delta / a.cpu_ms_per_req * 100:+.1f} %); B is A with {', '.join(args.b_set)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
