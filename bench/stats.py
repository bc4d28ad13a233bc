"""From rounds to report rows: percentiles, throughput, CPU per request, gateway vs direct.

Rounds of one path are pooled before percentiles are taken (all latency
samples together), because a p99 of a few hundred samples per round is too
noisy to average. Throughput is requests over summed measured time, and CPU
per request is summed gateway CPU over summed requests, so a short round
does not weigh as much as a long one.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from bench.loadgen import RoundResult


def percentile(samples: Sequence[float], p: float) -> float | None:
    """Nearest-rank percentile of ``samples`` (None when there are none)."""
    if not samples:
        return None
    ordered = sorted(samples)
    rank = max(1, math.ceil(p / 100 * len(ordered)))
    return ordered[rank - 1]


@dataclass
class Row:
    """One scenario x path x concurrency: one JSON line and one table row."""

    scenario: str
    path: str
    """``direct`` (client → simulator) or ``gateway`` (client → gateway → simulator)."""
    concurrency: int
    rounds: int = 0
    requests: int = 0
    ok: int = 0
    errors: dict[str, int] = field(default_factory=dict)
    error_rate: float = 0.0
    elapsed_s: float = 0.0
    throughput_rps: float = 0.0
    p50_ms: float | None = None
    p90_ms: float | None = None
    p99_ms: float | None = None
    ttft_p50_ms: float | None = None
    ttft_p90_ms: float | None = None
    ttft_p99_ms: float | None = None
    cpu_ms_per_req: float | None = None
    """Gateway process CPU (utime+stime) per request; gateway rows only."""
    cpu_sys_share: float | None = None
    """Kernel (stime) share of that CPU: socket calls and, on loopback, the peer's TCP work."""
    peak_rss_mb: float | None = None
    """VmHWM of the gateway process (a fresh one per scenario and concurrency)."""
    gateway_cpu_share: float | None = None
    """Gateway CPU seconds per second of the measured phase (1.0 = its core is all its)."""
    gateway_core_busy: float | None = None
    """Busy share of the gateway's core, all processes and interrupts."""
    gateway_core_softirq: float | None = None
    """Interrupt (mostly softirq: loopback TCP) share of the gateway's core, billed to no
    process. Busy minus gateway share minus this is a neighbour: noise."""
    load_core_busy: float | None = None
    """Busy share of the load core (generator, simulators, Redis, neighbours); 1.0 = saturated,
    then the load side, not the gateway, bounds throughput."""
    max_in_flight: int = 0
    added_p50_ms: float | None = None
    added_p99_ms: float | None = None
    added_ttft_p50_ms: float | None = None
    added_ttft_p99_ms: float | None = None
    throughput_ratio: float | None = None
    """Gateway throughput / direct throughput, same scenario and concurrency."""
    meta: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def summarize(scenario: str, path: str, concurrency: int,
              rounds: Sequence[RoundResult]) -> Row:
    """Pool the rounds of one path into a row."""
    row = Row(scenario, path, concurrency, rounds=len(rounds))
    latency: list[float] = []
    ttft: list[float] = []
    cpu = cpu_sys = 0.0
    has_cpu = False
    busy = [0.0, 0.0]
    softirq = 0.0
    for result in rounds:
        row.requests += result.requests
        row.ok += result.ok
        for key, count in result.errors.items():
            row.errors[key] = row.errors.get(key, 0) + count
        row.elapsed_s += result.elapsed
        latency += result.latency_ms
        ttft += result.ttft_ms
        row.max_in_flight = max(row.max_in_flight, result.max_in_flight)
        for index, (share, interrupts) in enumerate(result.core_busy[:2]):
            busy[index] += share * result.elapsed
            softirq += interrupts * result.elapsed if index == 0 else 0.0
        if result.cpu_seconds is not None:
            cpu += result.cpu_seconds
            cpu_sys += result.cpu_sys_seconds or 0.0
            has_cpu = True
    row.error_rate = 1 - row.ok / row.requests if row.requests else 0.0
    row.throughput_rps = row.requests / row.elapsed_s if row.elapsed_s else 0.0
    row.p50_ms, row.p90_ms, row.p99_ms = (percentile(latency, p) for p in (50, 90, 99))
    row.ttft_p50_ms, row.ttft_p90_ms, row.ttft_p99_ms = (percentile(ttft, p)
                                                         for p in (50, 90, 99))
    if has_cpu and row.requests:
        row.cpu_ms_per_req = cpu / row.requests * 1000
        row.cpu_sys_share = cpu_sys / cpu if cpu else None
    if row.elapsed_s:
        row.gateway_core_busy, row.load_core_busy = (b / row.elapsed_s for b in busy)
        row.gateway_core_softirq = softirq / row.elapsed_s
        if has_cpu:
            row.gateway_cpu_share = cpu / row.elapsed_s
    return row


def _minus(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None else a - b


def compare(gateway: Row, direct: Row) -> None:
    """Fill the gateway row's differences against the direct row of the same run."""
    gateway.added_p50_ms = _minus(gateway.p50_ms, direct.p50_ms)
    gateway.added_p99_ms = _minus(gateway.p99_ms, direct.p99_ms)
    gateway.added_ttft_p50_ms = _minus(gateway.ttft_p50_ms, direct.ttft_p50_ms)
    gateway.added_ttft_p99_ms = _minus(gateway.ttft_p99_ms, direct.ttft_p99_ms)
    if direct.throughput_rps:
        gateway.throughput_ratio = gateway.throughput_rps / direct.throughput_rps
