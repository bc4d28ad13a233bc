"""The benchmark suite must not rot: a tiny bounded run through its real code path.

Starts a simulator and a gateway as pinned subprocesses (bench.stack), drives
one direct and one gateway round through the load generator's own process,
and checks that the report has sane fields. Bounded: 300 requests or 5 s per
round, about 5 s in all.
"""

from __future__ import annotations

from dataclasses import replace

from bench import gate
from bench.loadclient import LoadGenerator
from bench.procs import cores
from bench.report import markdown
from bench.scenarios import BY_NAME, Sizing
from bench.stack import Stack
from bench.stats import compare, summarize

TINY = Sizing(rounds=1, requests=300, seconds=5.0, warmup=20)


async def test_load_generator_measures_direct_and_gateway_paths() -> None:
    scenario = replace(BY_NAME["stream32"], concurrencies=(8,))
    gateway_core, load_core = cores()
    stack = await Stack(scenario, gateway_core, load_core).start()
    load = await LoadGenerator(load_core).start()
    try:
        direct_round = await load.run(stack.spec("direct", 8, TINY))
        gateway_round = await load.run(stack.spec("gateway", 8, TINY))
    finally:
        await load.stop()
        await stack.close()

    direct = summarize(scenario.name, "direct", 8, [direct_round])
    gateway = summarize(scenario.name, "gateway", 8, [gateway_round])
    compare(gateway, direct)
    for row in (direct, gateway):
        assert 0 < row.requests <= TINY.requests
        assert row.ok == row.requests, row.errors
        assert row.p50_ms is not None and row.p99_ms is not None
        assert 0 < row.p50_ms <= row.p99_ms
        assert row.ttft_p50_ms is not None and row.ttft_p50_ms <= row.p50_ms
        assert row.throughput_rps > 0
        assert row.max_in_flight <= 8
    assert direct.cpu_ms_per_req is None  # nothing to bill on the direct path
    assert gateway.cpu_ms_per_req is not None and gateway.cpu_ms_per_req > 0
    assert gateway.added_p50_ms is not None and gateway.throughput_ratio is not None

    report = markdown([direct, gateway], {}, ["## test"], {scenario.name: scenario.title})
    assert "| stream32 | 8 | gateway |" in report
    rows = [direct.to_json(), gateway.to_json()]
    _, regressions, compared = gate.compare(rows, rows)
    assert compared >= 2 and not regressions
