"""The regression gate: a run against a stored baseline, non-zero exit on a regression.

    .venv/bin/python -m bench.gate BASELINE.jsonl CURRENT.jsonl [--threshold 0.05]
    .venv/bin/python -m bench.suite --compare BASELINE.jsonl      (run, then gate)

It compares the *gateway* rows present in both files (same scenario and
concurrency) on the figures the issue names: p99 latency, p99 time to first
token, and gateway CPU per request. A figure more than ``threshold`` (5 %)
above the baseline's is a regression. Only the gateway path is gated: the
direct path measures the simulator and the machine, not our code.

Meant for a user's CI on quiet, dedicated hardware with a baseline taken on
the same machine. On a shared 2-core box (ours) run-to-run noise is larger
than 5 %, so the gate would fail at random; it is not part of our CI.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

from bench.report import read_jsonl

DEFAULT_THRESHOLD = 0.05
GATED = ("p99_ms", "ttft_p99_ms", "cpu_ms_per_req")

Key = tuple[str, int]


def _gateway_rows(rows: Iterable[dict[str, Any]]) -> dict[Key, dict[str, Any]]:
    return {(row["scenario"], int(row["concurrency"])): row
            for row in rows if row.get("path") == "gateway"}


def compare(baseline: Iterable[dict[str, Any]], current: Iterable[dict[str, Any]],
            threshold: float = DEFAULT_THRESHOLD) -> tuple[list[str], list[str], int]:
    """(report lines, regressions, figures compared)."""
    old, new = _gateway_rows(baseline), _gateway_rows(current)
    lines = ["| scenario | conc | figure | baseline | current | change | verdict |",
             "|---|---|---|---|---|---|---|"]
    regressions: list[str] = []
    compared = 0
    for key in sorted(old.keys() & new.keys()):
        for figure in GATED:
            before, after = old[key].get(figure), new[key].get(figure)
            if before is None or after is None or before <= 0:
                continue
            compared += 1
            change = after / before - 1
            worse = change > threshold
            verdict = "REGRESSION" if worse else "ok"
            lines.append(f"| {key[0]} | {key[1]} | {figure} | {before:.3f} | {after:.3f} | "
                         f"{change * 100:+.1f} % | {verdict} |")
            if worse:
                regressions.append(f"{key[0]} @ {key[1]}: {figure} {before:.3f} → {after:.3f} "
                                   f"({change * 100:+.1f} % > {threshold * 100:.0f} %)")
    return lines, regressions, compared


def report(baseline: Sequence[dict[str, Any]], current: Sequence[dict[str, Any]],
           threshold: float, write: Callable[[str], None]) -> int:
    """Print the comparison; 0 when nothing regressed, 1 on a regression, 2 if nothing matched."""
    lines, regressions, compared = compare(baseline, current, threshold)
    write("\n".join(lines))
    if not compared:
        write("gate: no gateway figure in common with the baseline (different scenarios?)")
        return 2
    if regressions:
        write(f"gate: {len(regressions)} regression(s) over {threshold * 100:.0f} %:")
        for line in regressions:
            write(f"  {line}")
        return 1
    write(f"gate: {compared} figures within {threshold * 100:.0f} % of the baseline")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("baseline", type=Path)
    parser.add_argument("current", type=Path)
    parser.add_argument("--threshold", type=float, default=DEFAULT_THRESHOLD,
                        help="allowed relative worsening (default 0.05 = 5 %%)")
    args = parser.parse_args(argv)
    return report(read_jsonl(args.baseline), read_jsonl(args.current), args.threshold, print)


if __name__ == "__main__":
    sys.exit(main())
