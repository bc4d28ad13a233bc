"""Metrics across real worker processes (prometheus-client multiprocess mode).

The workers are started the way ``gateway serve --workers N`` starts them:
``multiprocessing`` with "spawn", after the parent prepared the directory and
exported ``PROMETHEUS_MULTIPROC_DIR``. A spawned child is a fresh interpreter
that inherits that environment, so prometheus-client is imported there with
multiprocess mode on (the worker checks it, and GatewayMetrics would refuse
otherwise).
"""

from __future__ import annotations

import multiprocessing
import os
import queue

from prometheus_client.parser import text_string_to_metric_families

from gateway.telemetry import multiprocess
from gateway.telemetry.multiprocess import (
    mark_worker_dead,
    prepare_multiprocess_dir,
    render_multiprocess,
)

TIMEOUT_S = 20.0


def _worker(index: int, requests: int, barrier, results) -> None:  # pragma: no cover - child
    """One gateway worker: record, wait for the other, let worker 1 serve a scrape."""
    from prometheus_client import values

    from gateway.telemetry.metrics import GatewayMetrics, render_metrics

    assert values.ValueClass._multiprocess, "multiprocess mode must be on in the worker"
    metrics = GatewayMetrics(models=["m"], backends=["a"])
    for _ in range(requests):
        metrics.attempt_done("a", "success")
        metrics.request_done("m", "a", 200, total_seconds=0.5, upstream_seconds=0.4995)
    metrics.set_in_flight("a", index + 1)                            # 1 + 2
    metrics.set_breaker_state("a", "open" if index == 0 else "closed")  # worst: open
    metrics.set_archive_backlog(10 * (index + 1))                   # max(10, 20)
    barrier.wait(TIMEOUT_S)
    if index == 1:
        results.put(render_metrics(metrics)[0].decode())
    barrier.wait(TIMEOUT_S)


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def test_workers_are_aggregated(tmp_path, monkeypatch):
    directory = tmp_path / "metrics"
    directory.mkdir()
    (directory / "counter_999999.db").write_bytes(b"stale from an earlier run")
    (directory / "keep.txt").write_text("not ours")
    monkeypatch.setenv(multiprocess.ENV, "")  # restored when the test ends
    prepare_multiprocess_dir(directory)
    assert os.environ[multiprocess.ENV] == str(directory.resolve())
    assert not (directory / "counter_999999.db").exists()
    assert (directory / "keep.txt").exists()

    context = multiprocessing.get_context("spawn")
    barrier, results = context.Barrier(2), context.Queue()
    workers = [context.Process(target=_worker, args=(i, n, barrier, results))
               for i, n in enumerate((3, 4))]
    for worker in workers:
        worker.start()
    try:
        scraped = samples(results.get(timeout=TIMEOUT_S))
    except queue.Empty:
        raise AssertionError("worker 1 served no scrape") from None
    finally:
        for worker in workers:
            worker.join(TIMEOUT_S)
    assert [w.exitcode for w in workers] == [0, 0]

    # A scrape served by one worker shows both workers.
    requests = ("gateway_requests_total", (("backend", "a"), ("model", "m"), ("status", "200")))
    in_flight = ("gateway_backend_in_flight_requests", (("backend", "a"),))
    breaker = ("gateway_breaker_state", (("backend", "a"),))
    backlog = ("gateway_archive_backlog_records", ())
    assert scraped[requests] == 7
    assert scraped[("gateway_backend_attempts_total",
                    (("backend", "a"), ("outcome", "success")))] == 7
    assert scraped[("gateway_request_duration_seconds_count", (("model", "m"),))] == 7
    assert scraped[("gateway_overhead_seconds_bucket", (("le", "0.001"),))] == 7
    assert scraped[in_flight] == 3
    assert scraped[breaker] == 2
    assert scraped[backlog] == 20  # the shared outbox: the max, not the sum

    # The parent's aggregate is the same; a dead worker's live gauges leave it,
    # its counters stay (totals never go backwards).
    assert samples(render_multiprocess(directory)[0].decode())[requests] == 7
    mark_worker_dead(workers[0].pid)
    after = samples(render_multiprocess(directory)[0].decode())
    assert after[requests] == 7
    assert after[in_flight] == 2
    assert after[breaker] == 0
    assert after[backlog] == 20


def test_mark_worker_dead_is_a_no_op_in_one_process(monkeypatch):
    monkeypatch.delenv(multiprocess.ENV, raising=False)
    mark_worker_dead(12345)
