"""Running the gateway: one process, or N worker processes sharing one port.

With ``workers > 1`` every worker binds the same port with ``SO_REUSEPORT`` and
the kernel spreads connections among them; the parent only supervises and
passes SIGTERM/SIGINT on.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import multiprocessing
import os
import signal
import sys
import tempfile
from collections.abc import Callable, Coroutine
from typing import Any

from aiohttp import web

from gateway.app import RUNTIME, build_app
from gateway.config import ConfigError, GatewayConfig
from gateway.http.admin import reload_from_file
from gateway.runtime import RuntimeHolder
from gateway.security import install_log_redaction
from gateway.telemetry.logs import configure_logging, flush_request_lines
from gateway.telemetry.multiprocess import ENV as MULTIPROC_ENV
from gateway.telemetry.multiprocess import mark_worker_dead, prepare_multiprocess_dir

log = logging.getLogger("gateway.server")


def run_event_loop(main: Callable[[], Coroutine[Any, Any, None]]) -> None:
    """Run ``main`` on uvloop when it is installed, else on asyncio's loop."""
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is a dependency off Windows
        asyncio.run(main())
        return
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        runner.run(main())


def serve(config: GatewayConfig) -> int:
    """Serve until SIGTERM or SIGINT; returns the process exit status."""
    workers = config.server.workers
    if workers == 1:
        run_event_loop(lambda: _serve_one(config, reuse_port=False))
        return 0
    return _supervise(config, workers)


async def _serve_one(config: GatewayConfig, *, reuse_port: bool) -> None:
    """Serve until SIGTERM/SIGINT, then drain: see :func:`_drain`. SIGHUP reloads."""
    configure_logging(config.telemetry)
    install_log_redaction()
    app = build_app(config)
    runner = web.AppRunner(app, access_log=None, handle_signals=False,
                           shutdown_timeout=config.server.drain_seconds)
    await runner.setup()
    site = web.TCPSite(runner, config.server.host, config.server.port,
                       reuse_port=reuse_port, backlog=1024)
    await site.start()
    _tune_gc()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    reloads: set[asyncio.Task[None]] = set()

    def on_sighup() -> None:
        task = loop.create_task(_reload(app[RUNTIME]))
        reloads.add(task)
        task.add_done_callback(reloads.discard)

    loop.add_signal_handler(signal.SIGHUP, on_sighup)
    # Only now that every signal has its handler: whoever waits for this line
    # may signal the process at once.
    for address in runner.addresses:
        host, port = address[0], address[1]
        print(f"gateway listening on http://{host}:{port}", flush=True)
    try:
        await stop.wait()
    finally:
        await _drain(app[RUNTIME], runner, config)
        flush_request_lines()


def _tune_gc() -> None:
    """Fewer garbage collections on the hot path.

    A request's objects are short-lived and freed by reference counting; the
    collector's passes cost tens of microseconds per request at the default
    thresholds (bench/RESULTS.md). What exists at start-up (modules, config,
    app) is moved out of the collector's sight for good.
    """
    gc.collect()
    gc.freeze()
    gc.set_threshold(50_000, 50, 100)


async def _drain(holder: RuntimeHolder, runner: web.AppRunner, config: GatewayConfig) -> None:
    """Shut down without dropping a request.

    ``/readyz`` turns 503 at once so load balancers stop sending; new
    connections are still accepted for ``shutdown_grace_seconds`` (while the
    balancers notice); then the listener closes and requests and streams in
    flight get up to ``drain_seconds`` to finish, before the components
    flush and close (``on_cleanup``).
    """
    holder.draining = True
    log.info("draining: readiness off, %.1f s grace, up to %.1f s for requests in flight",
             config.server.shutdown_grace_seconds, config.server.drain_seconds)
    await asyncio.sleep(config.server.shutdown_grace_seconds)
    await runner.cleanup()


async def _reload(holder: RuntimeHolder) -> None:
    try:
        report = await reload_from_file(holder)
    except ConfigError as exc:
        log.error("reload refused, the running configuration stays: %s", exc)
        return
    log.warning("configuration reloaded: %s", report)


def _worker_main(config: GatewayConfig) -> None:
    run_event_loop(lambda: _serve_one(config, reuse_port=True))


def _supervise(config: GatewayConfig, workers: int) -> int:
    # Metrics from every worker, aggregated whichever one a scrape reaches:
    # prometheus-client's multiprocess mode, set up before the workers start.
    metrics_dir = os.environ.get(MULTIPROC_ENV) or tempfile.mkdtemp(prefix="gateway-metrics-")
    prepare_multiprocess_dir(metrics_dir)
    context = multiprocessing.get_context("spawn")
    processes = [context.Process(target=_worker_main, args=(config,), name=f"gateway-worker-{i}")
                 for i in range(workers)]
    for process in processes:
        process.start()

    def forward(signum: int, _frame: object) -> None:
        for process in processes:
            if process.is_alive() and process.pid is not None:
                os.kill(process.pid, signum)

    signal.signal(signal.SIGTERM, forward)
    signal.signal(signal.SIGINT, forward)
    signal.signal(signal.SIGHUP, forward)  # each worker reloads its own configuration
    for process in processes:
        process.join()
        if process.pid is not None:
            mark_worker_dead(process.pid)
    failed = [p.name for p in processes if p.exitcode not in (0, -signal.SIGTERM, -signal.SIGINT)]
    if failed:
        print(f"gateway: workers exited with an error: {', '.join(failed)}", file=sys.stderr)
        return 1
    return 0

