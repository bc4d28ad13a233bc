"""Traces, metrics and logs of real requests through a real gateway."""

from __future__ import annotations

import json
import re

import aiohttp
import pytest
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind
from prometheus_client.parser import text_string_to_metric_families

from gateway.config import parse_config
from gateway.sim import SimSettings
from tests.gateway_harness import BackendSpec, RunningGateway, closed_port, config_text
from tests.processes import Process
from tests.resilience_helpers import CHAT, post, set_faults
from tests.sse_client import stream

TRACEPARENT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"


@pytest.fixture
async def traced(sims):
    """A gateway over a failing backend and a good one, sampling every request."""
    bad, good = await sims(SimSettings(ttft_ms=20)), await sims()
    exporter = InMemorySpanExporter()
    text = config_text(
        [BackendSpec("bad", bad.url, extra="weight = 1000"), BackendSpec("good", good.url)],
        retry="base = 0.01", extra="[telemetry]\nsample_ratio = 1.0\n")
    gateway = await RunningGateway(parse_config(text, "test.toml"),
                                   span_processor=SimpleSpanProcessor(exporter)).start()
    yield gateway, exporter, bad, good
    await gateway.stop()


async def test_a_retried_request_has_a_server_span_and_two_attempt_spans(traced, http):
    gateway, exporter, bad, good = traced
    await set_faults(http, bad, status=503)
    status, _, headers, _ = await post(http, gateway, headers={"traceparent": TRACEPARENT})
    assert status == 200 and headers["X-Gateway-Attempts"] == "2"
    spans = exporter.get_finished_spans()
    [server] = [s for s in spans if s.kind is SpanKind.SERVER]
    attempts = sorted((s for s in spans if s.kind is SpanKind.CLIENT),
                      key=lambda s: s.attributes["gateway.attempt"])
    assert format(server.context.trace_id, "032x") == TRACEPARENT.split("-")[1]
    assert [a.parent.span_id for a in attempts] == [server.context.span_id] * 2
    first, second = (a.attributes for a in attempts)
    assert (first["gateway.backend"], first["gateway.attempt.outcome"]) == ("bad", "http_503")
    assert (second["gateway.backend"], second["gateway.attempt.outcome"]) == ("good", "success")
    assert second["gateway.retry.reason"] == "http_503"
    assert 0 <= second["gateway.retry.wait_seconds"] <= 0.01
    assert server.attributes["gen_ai.request.model"] == "sim-model"
    assert server.attributes["gen_ai.usage.output_tokens"] == 8
    # the backend received the gateway's attempt span as its parent, same trace
    sent = good.state.last_requests[-1]["headers"]["traceparent"]
    assert sent.split("-")[1] == TRACEPARENT.split("-")[1]
    assert sent.split("-")[2] == format(attempts[1].context.span_id, "016x")


async def test_a_stream_records_the_first_token_event(traced, http):
    gateway, exporter, _, _ = traced
    record = await stream(http, f"{gateway.url}/v1/chat/completions", {**CHAT, "stream": True})
    assert record.done_count == 1
    [server] = [s for s in exporter.get_finished_spans() if s.kind is SpanKind.SERVER]
    assert [e.name for e in server.events] == ["gen_ai.first_token"]


def _samples(text: str) -> dict[tuple[str, tuple], float]:
    values = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            values[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return values


async def _scrape(http: aiohttp.ClientSession, url: str) -> dict[tuple[str, tuple], float]:
    async with http.get(f"{url}/metrics") as response:
        assert response.status == 200
        return _samples(await response.text())


async def test_metrics_parse_and_move(traced, http):
    gateway, _, bad, _ = traced
    await set_faults(http, bad, status=503)
    for _ in range(3):
        assert (await post(http, gateway))[0] == 200
    assert (await post(http, gateway, {**CHAT, "model": "nope"}))[0] == 404
    values = await _scrape(http, gateway.url)
    ok = ("gateway_requests_total",
          (("backend", "good"), ("model", "sim-model"), ("status", "200")))
    assert values[ok] == 3
    assert values[("gateway_backend_attempts_total",
                   (("backend", "bad"), ("outcome", "http_503")))] >= 1
    assert values[("gateway_retries_total",
                   (("model", "sim-model"), ("reason", "http_503")))] >= 1
    assert values[("gateway_breaker_state", (("backend", "good"),))] == 0
    assert values[("gateway_overhead_seconds_count", ())] == 4
    assert any(name == "gateway_requests_total" and dict(labels)["status"] == "404"
               for name, labels in values)


async def test_breaker_gauge_and_transitions(sims, gateways, http):
    sim = await sims()
    gateway = await gateways(config_text([BackendSpec("a", sim.url)]))
    from tests.resilience_helpers import breaker
    breaker(gateway, "a").force_open(30)
    values = await _scrape(http, gateway.url)
    assert values[("gateway_breaker_state", (("backend", "a"),))] == 2
    assert values[("gateway_breaker_transitions_total",
                   (("backend", "a"), ("from", "closed"), ("to", "open")))] == 1


async def test_metrics_are_summed_over_workers_and_logs_are_json(sims, tmp_path):
    sim = await sims()
    port = closed_port()
    config = tmp_path / "gw.toml"
    config.write_text(f"[server]\nport = {port}\nworkers = 2\n[sessions]\nenabled = false\n"
                      f'[[backends]]\nname = "sim"\nurl = "{sim.url}"\nmodels = ["sim-model"]\n')
    gateway = Process("serve", "--config", str(config))
    url = f"http://127.0.0.1:{port}"
    try:
        gateway.wait_for_line("gateway listening on")
        gateway.wait_for_line("gateway listening on")
        async with aiohttp.ClientSession() as http:
            for _ in range(20):
                # a new connection each time, so the kernel spreads them over workers
                async with http.post(f"{url}/v1/chat/completions", json=CHAT,
                                     headers={"Connection": "close"}) as response:
                    assert response.status == 200
            totals = set()
            for _ in range(6):
                async with http.get(f"{url}/metrics", headers={"Connection": "close"}) as r:
                    values = _samples(await r.text())
                totals.add(sum(v for (name, _), v in values.items()
                               if name == "gateway_requests_total"))
        assert totals == {20}  # whichever worker answered the scrape
    finally:
        assert gateway.stop() == 0
    lines = [json.loads(line) for line in gateway.drain_output()
             if line.startswith("{") and '"request_id"' in line]
    assert len(lines) == 20
    assert {line["status"] for line in lines} == {200}
    assert all(re.fullmatch(r"[0-9a-f]+", line["request_id"]) for line in lines)
    assert all("total_ms" in line and line["backend"] == "sim" for line in lines)


async def test_a_resumed_stream_is_counted_and_on_its_span(sims, http):
    a, b = await sims(SimSettings(tokens=20)), await sims(SimSettings(tokens=20))
    await set_faults(http, a, drop_after=5)
    exporter = InMemorySpanExporter()
    text = config_text([BackendSpec("a", a.url, extra="weight = 1000"),
                        BackendSpec("b", b.url)], extra="[telemetry]\nsample_ratio = 1.0\n")
    gateway = await RunningGateway(parse_config(text, "test.toml"),
                                   span_processor=SimpleSpanProcessor(exporter)).start()
    try:
        record = await stream(http, f"{gateway.url}/v1/chat/completions",
                              {**CHAT, "stream": True})
        assert record.done_count == 1 and record.comments == ["gateway-resumes=1"]
        values = await _scrape(http, gateway.url)
    finally:
        await gateway.stop()
    assert values[("gateway_stream_resumes_total",
                   (("model", "sim-model"), ("reason", "upstream_disconnected")))] == 1
    [server] = [s for s in exporter.get_finished_spans() if s.kind is SpanKind.SERVER]
    assert server.attributes["gateway.stream.resumes"] == 1
    assert list(server.attributes["gateway.stream.resume_reasons"]) == ["upstream_disconnected"]
