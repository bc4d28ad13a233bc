"""The suite's outputs: JSON lines for machines, a Markdown report for people.

The Markdown has three tables: every measured row (both paths), the gateway
against the direct path of the same run, and the issue's targets with met /
not met. Targets are judged only on the rows this run produced; a target whose
scenario was skipped says so instead of passing silently.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import orjson

from bench.stats import Row


@dataclass(frozen=True)
class Target:
    """One of issue 8's targets, checked on one scenario x concurrency (gateway row)."""

    label: str
    scenario: str
    concurrency: int
    field: str
    limit: float
    unit: str

    def measured(self, rows: Sequence[Row]) -> float | None:
        for row in rows:
            if (row.path, row.scenario, row.concurrency) == ("gateway", self.scenario,
                                                             self.concurrency):
                return getattr(row, self.field)
        return None


def _targets() -> list[Target]:
    targets = [Target("CPU per non-streaming request ≤ 0.3 ms", "chat", c,
                      "cpu_ms_per_req", 0.3, "ms") for c in (16, 64)]
    targets += [Target("CPU per 32-token stream ≤ 1.0 ms", "stream32", c,
                       "cpu_ms_per_req", 1.0, "ms") for c in (16, 64)]
    targets += [Target("added p50 latency ≤ +1 ms", "chat", c, "added_p50_ms", 1.0, "ms")
                for c in (16, 64)]
    targets += [Target("added p50 TTFT ≤ +1 ms", scenario, c, "added_ttft_p50_ms", 1.0, "ms")
                for scenario, c in (("stream32", 16), ("stream32", 64),
                                    ("stream64_paced", 64))]
    targets.append(Target("peak RSS under 1,000 concurrent streams ≤ 120 MB", "streams1000",
                          1000, "peak_rss_mb", 120.0, "MB"))
    targets.append(Target("CPU per request with sessions (Redis) ≤ 0.5 ms", "sessions", 16,
                          "cpu_ms_per_req", 0.5, "ms"))
    return targets


TARGETS = _targets()


def _fmt(value: float | None, digits: int = 2) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def _signed(value: float | None) -> str:
    return "-" if value is None else f"{value:+.2f}"


def write_jsonl(path: Path, rows: Iterable[Row], skipped: dict[str, str]) -> None:
    """One object per scenario x path x concurrency; skipped scenarios as ``skipped`` lines."""
    with path.open("wb") as out:
        for row in rows:
            out.write(orjson.dumps(row.to_json()) + b"\n")
        for name, reason in skipped.items():
            out.write(orjson.dumps({"scenario": name, "skipped": reason}) + b"\n")


def read_jsonl(path: Path) -> list[dict]:
    """Rows of a results file (JSON lines, or one JSON array); skipped lines left out."""
    text = path.read_text().strip()
    if text.startswith("["):
        items = orjson.loads(text)
    else:
        items = [orjson.loads(line) for line in text.splitlines() if line.strip()]
    return [item for item in items if "skipped" not in item]


def table(header: Sequence[str], lines: Iterable[Sequence[str]]) -> list[str]:
    out = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    out += ["| " + " | ".join(cells) + " |" for cells in lines]
    return out


def measured_line(row: Row) -> list[str]:
    return [row.scenario, str(row.concurrency), row.path, str(row.requests),
            f"{row.error_rate * 100:.1f}", f"{row.throughput_rps:.0f}",
            _fmt(row.p50_ms), _fmt(row.p90_ms), _fmt(row.p99_ms),
            _fmt(row.ttft_p50_ms), _fmt(row.ttft_p99_ms), _fmt(row.cpu_ms_per_req, 3),
            _fmt(row.cpu_sys_share), _fmt(row.peak_rss_mb, 1), _fmt(row.gateway_cpu_share),
            _fmt(row.gateway_core_busy), _fmt(row.gateway_core_softirq),
            _fmt(row.load_core_busy), str(row.max_in_flight)]


def _versus_line(row: Row) -> list[str]:
    ratio = _fmt(row.throughput_ratio)
    return [row.scenario, str(row.concurrency), _signed(row.added_p50_ms),
            _signed(row.added_p99_ms), _signed(row.added_ttft_p50_ms),
            _signed(row.added_ttft_p99_ms), ratio]


def _target_line(target: Target, rows: Sequence[Row], skipped: dict[str, str]) -> list[str]:
    value = target.measured(rows)
    if value is None:
        verdict = "skipped" if target.scenario in skipped else "not measured"
    else:
        verdict = "**met**" if value <= target.limit else "**not met**"
    where = f"{target.scenario} @ {target.concurrency}"
    return [target.label, where, f"{_fmt(value, 3)} {target.unit}", verdict]


MEASURED_HEADER = ("scenario", "conc", "path", "requests", "err %", "req/s", "p50 ms",
                   "p90 ms", "p99 ms", "TTFT p50", "TTFT p99", "CPU ms/req", "sys share",
                   "peak RSS MB", "gw CPU share", "gw core busy", "gw core softirq",
                   "load core busy", "max in flight")
VERSUS_HEADER = ("scenario", "conc", "+p50 ms", "+p99 ms", "+TTFT p50 ms", "+TTFT p99 ms",
                 "throughput gw/direct")


def markdown(rows: Sequence[Row], skipped: dict[str, str], header: Sequence[str],
             titles: dict[str, str]) -> str:
    """The report: run header, targets, gateway vs direct, all rows, scenario legend."""
    gateway_rows = [row for row in rows if row.path == "gateway"]
    lines = [*header, "", "### Targets (issue 8), gateway path", ""]
    lines += table(("target", "where", "measured", "verdict"),
                    (_target_line(t, rows, skipped) for t in TARGETS))
    lines += ["", "### Gateway vs direct (same run, alternating rounds)", ""]
    lines += table(VERSUS_HEADER, (_versus_line(row) for row in gateway_rows))
    lines += ["", "### All measurements", ""]
    lines += table(MEASURED_HEADER, (measured_line(row) for row in rows))
    errors = [f"- {r.scenario} @ {r.concurrency} {r.path}: {r.errors}" for r in rows if r.errors]
    if errors:
        lines += ["", "Errors by kind:", "", *errors]
    lines += ["", "Scenarios:", ""]
    lines += [f"- `{name}`: {title}" + (f" — **skipped**: {skipped[name]}"
                                        if name in skipped else "")
              for name, title in titles.items()]
    return "\n".join(lines) + "\n"


def print_progress(write: Callable[[str], None], row: Row) -> None:
    """One console line per finished row, so a long run shows where it is."""
    extra = (f" cpu {row.cpu_ms_per_req:.3f} ms/req rss {_fmt(row.peak_rss_mb, 1)} MB"
             if row.path == "gateway" and row.cpu_ms_per_req is not None else "")
    ttft = f" ttft p50 {_fmt(row.ttft_p50_ms)}" if row.ttft_p50_ms is not None else ""
    write(f"  {row.scenario:15} c={row.concurrency:<5} {row.path:8} {row.requests:6} req "
          f"{row.throughput_rps:7.0f}/s p50 {_fmt(row.p50_ms)} p99 {_fmt(row.p99_ms)} ms"
          f"{ttft} err {row.error_rate * 100:.1f}%{extra}")
