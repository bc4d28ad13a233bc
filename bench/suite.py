"""The whole benchmark suite in one command: every scenario, direct and gateway, side by side.

    .venv/bin/python -m bench.suite [--quick] [--out bench/out] [--only chat ...]
                                    [--compare BASELINE.jsonl]

For each scenario and concurrency it starts fresh processes (simulators and
the load generator on the load core, the gateway alone on the other) and runs
rounds alternately on the direct path (client → simulator) and the gateway
path (client → gateway → simulator): direct, gateway, direct, gateway… so a
burst of noise from a neighbour on this shared machine hits both paths
instead of one. Writes ``results.jsonl`` (one object per scenario x path x
concurrency) and ``results.md`` into ``--out``; with ``--compare`` it then
runs the regression gate (``bench.gate``) and exits non-zero on a regression.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import shlex
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from bench import gate
from bench.loadclient import LoadGenerator
from bench.loadgen import RoundResult
from bench.procs import ROOT, cores, peak_rss_mb, pin_self
from bench.report import markdown, print_progress, read_jsonl, write_jsonl
from bench.scenarios import BY_NAME, SCENARIOS, Scenario
from bench.stack import Stack, sessions_available
from bench.stats import Row, compare, summarize

PATHS = ("direct", "gateway")


def _say(text: str) -> None:
    print(text, flush=True)


async def run_one(scenario: Scenario, concurrency: int, quick: bool, load: LoadGenerator,
                  gateway_core: int, load_core: int) -> list[Row]:
    """Rounds of one scenario x concurrency, alternating paths; two rows (direct, gateway)."""
    sizing = scenario.sizing(quick)
    stack = await Stack(scenario, gateway_core, load_core).start()
    results: dict[str, list[RoundResult]] = {path: [] for path in PATHS}
    try:
        for _ in range(sizing.rounds):
            for path in PATHS:
                results[path].append(await load.run(stack.spec(path, concurrency, sizing)))
        assert stack.gateway is not None
        peak = peak_rss_mb(stack.gateway.pid)
    finally:
        await stack.close()
    direct, gateway = (summarize(scenario.name, path, concurrency, results[path])
                       for path in PATHS)
    gateway.peak_rss_mb = peak
    compare(gateway, direct)
    return [direct, gateway]


def machine_lines(command: str, gateway_core: int, load_core: int) -> list[str]:
    """Date, machine, Python and the exact command: what makes two reports comparable."""
    model = "unknown"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, text=True,
                            capture_output=True, check=False).stdout.strip() or "unknown"
    return [
        f"- date: {time.strftime('%Y-%m-%d %H:%M:%S %Z')}",
        f"- machine: {os.cpu_count()} cores ({model}), Linux {platform.release()}",
        f"- Python {platform.python_version()}; commit {commit} (plus uncommitted work)",
        f"- gateway pinned to core {gateway_core}; simulators, Redis and the load generator "
        f"on core {load_core}",
        f"- command: `{command}`",
    ]


async def run_suite(names: Sequence[str], quick: bool) -> tuple[list[Row], dict[str, str]]:
    """Every selected scenario x concurrency; skipped scenarios with their reason."""
    gateway_core, load_core = cores()
    pin_self(load_core)
    rows: list[Row] = []
    skipped: dict[str, str] = {}
    load = await LoadGenerator(load_core).start()
    try:
        for name in names:
            scenario = BY_NAME[name]
            if scenario.session_turns:
                ok, why = sessions_available()
                if not ok:
                    skipped[name] = ("not available: gateway check-config refuses "
                                     f"[sessions] ({why})")
                    _say(f"  {name}: {skipped[name]}")
                    continue
            for concurrency in scenario.concurrencies:
                try:
                    pair = await run_one(scenario, concurrency, quick, load, gateway_core,
                                         load_core)
                except RuntimeError as exc:  # a gateway that does not start: report, go on
                    reason = str(exc).splitlines()[0] + " " + str(exc).splitlines()[-1]
                    skipped[name] = f"failed at concurrency {concurrency}: {reason}"
                    _say(f"  {name}: {skipped[name]}")
                    continue
                for row in pair:
                    row.meta = {"quick": quick}
                    print_progress(_say, row)
                    rows.append(row)
    finally:
        await load.stop()
    return rows, skipped


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="smaller rounds (under 2 minutes)")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "out")
    parser.add_argument("--only", nargs="+", choices=sorted(BY_NAME), metavar="SCENARIO",
                        help=f"run only these scenarios ({', '.join(BY_NAME)})")
    parser.add_argument("--compare", type=Path, metavar="BASELINE",
                        help="results.jsonl of an earlier run: exit 1 when a p99 or CPU "
                             "per request is more than --threshold worse")
    parser.add_argument("--threshold", type=float, default=gate.DEFAULT_THRESHOLD)
    args = parser.parse_args(argv)
    names = args.only or [scenario.name for scenario in SCENARIOS]
    python = os.path.relpath(sys.executable, ROOT)
    command = shlex.join([python if not python.startswith("..") else sys.executable,
                          "-m", "bench.suite", *(sys.argv[1:] if argv is None else argv)])
    gateway_core, load_core = cores()
    header = ["## Benchmark run", "", *machine_lines(command, gateway_core, load_core)]
    _say("\n".join(header))
    started = time.monotonic()
    rows, skipped = asyncio.run(run_suite(names, args.quick))
    header.append(f"- wall time: {time.monotonic() - started:.0f} s")
    args.out.mkdir(parents=True, exist_ok=True)
    write_jsonl(args.out / "results.jsonl", rows, skipped)
    titles = {name: BY_NAME[name].title for name in names}
    report = markdown(rows, skipped, header, titles)
    (args.out / "results.md").write_text(report)
    _say("\n" + report)
    _say(f"wrote {args.out / 'results.jsonl'} and {args.out / 'results.md'}")
    if args.compare is None:
        return 0
    current = [row.to_json() for row in rows]
    return gate.report(read_jsonl(args.compare), current, args.threshold, _say)


if __name__ == "__main__":
    sys.exit(main())
