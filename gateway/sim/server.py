"""Running the simulator: the aiohttp application, an in-process server, the CLI loop.

``start_sim`` is what tests and benchmarks use: a real HTTP server on a
loopback port of the caller's event loop, which they can stop and restart on
the same port to play a backend that dies and comes back. ``serve_forever``
runs the same server as a process of its own (``gateway sim``).
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
from dataclasses import replace
from types import TracebackType

from aiohttp import web

from gateway.sim import control, handlers
from gateway.sim.settings import SimSettings
from gateway.sim.state import STATE_KEY, SimState

MAX_BODY_BYTES = 64 * 1024 * 1024
"""Long conversations make big bodies; the simulator should not be the one to refuse them."""
SHUTDOWN_TIMEOUT_S = 1.0
"""How long stop() lets cancelled handlers finish; they end at once in practice."""


def build_app(settings: SimSettings) -> web.Application:
    """The simulator as an aiohttp application, with a fresh ``SimState``."""
    return _make_app(SimState(settings))


def _make_app(state: SimState) -> web.Application:
    """An application around an existing state: a restart keeps settings and counters."""
    app = web.Application(client_max_size=MAX_BODY_BYTES)
    app[STATE_KEY] = state
    app.router.add_post("/v1/chat/completions", handlers.chat_completions)
    app.router.add_post("/v1/completions", handlers.completions)
    app.router.add_post("/v1/embeddings", handlers.embeddings)
    app.router.add_get("/v1/models", handlers.models)
    app.router.add_get("/health", handlers.health)
    app.router.add_get("/sim/state", control.get_state)
    app.router.add_put("/sim/faults", control.put_faults)
    app.router.add_post("/sim/reset", control.reset)
    return app


class SimServer:
    """A running simulator on this event loop, for in-process tests and benchmarks."""

    def __init__(self, state: SimState, host: str, port: int) -> None:
        self.state = state
        self.host = host
        self.port = port
        self._runner: web.AppRunner | None = None
        self._stopping: asyncio.Task[None] | None = None
        state.on_refuse = self._refuse_soon

    @property
    def url(self) -> str:
        """Base URL, e.g. ``http://127.0.0.1:43121``."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    async def _listen(self) -> None:
        """Bind ``self.port`` (0 picks a free one, remembered for restart) and serve."""
        runner = web.AppRunner(
            _make_app(self.state),
            access_log=None,  # a log line per request would cost more than answering it
            handler_cancellation=True,  # a client that leaves ends hanging handlers at once
            shutdown_timeout=SHUTDOWN_TIMEOUT_S,
        )
        await runner.setup()
        try:
            # Engines' servers (uvicorn: 2048) queue bursts of connections; aiohttp's
            # default backlog of 128 drops the SYNs of a 1,000-client burst.
            await web.TCPSite(runner, self.host, self.port, backlog=2048).start()
        except BaseException:
            await runner.cleanup()
            raise
        self.port = runner.addresses[0][1]
        self._runner = runner

    async def stop(self) -> None:
        """Close the listener and every connection, like a backend that crashed."""
        stopping, self._stopping = self._stopping, None
        if stopping is not None and stopping is not asyncio.current_task():
            await stopping  # a ``refuse`` is already stopping: let it finish
        runner, self._runner = self._runner, None
        if runner is None:
            return
        if runner.server is not None:
            for connection in runner.server.connections:
                if connection.transport is not None:
                    connection.transport.abort()
        await runner.cleanup()

    async def restart(self) -> None:
        """Listen again on the same port (after stop() or a ``refuse`` fault)."""
        await self.stop()
        settings = self.state.settings
        self.state.use(replace(settings, faults=replace(settings.faults, refuse=False)))
        await self._listen()

    def _refuse_soon(self) -> None:
        """Stop once the current handler has returned (the control API's ``refuse``)."""
        self._stopping = asyncio.get_running_loop().create_task(self.stop())

    async def __aenter__(self) -> SimServer:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        await self.stop()


async def start_sim(
    settings: SimSettings = SimSettings(),  # noqa: B008 (frozen, so sharing it is safe)
    host: str = "127.0.0.1",
    port: int = 0,
) -> SimServer:
    """Start a simulator on the running loop; port 0 picks a free port."""
    server = SimServer(SimState(settings), host, port)
    await server._listen()
    return server


async def _serve(settings: SimSettings, host: str, port: int) -> None:
    """Serve until SIGINT or SIGTERM, then close cleanly.

    The signal handlers are in place before the "listening" line, so a
    supervisor that waits for the line and then signals gets a clean exit.
    """
    done = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError):  # not on Windows
            loop.add_signal_handler(signum, done.set)
    server = await start_sim(settings, host, port)
    print(f"sim listening on {server.url}", flush=True)
    try:
        await done.wait()
    finally:
        await server.stop()


def serve_forever(settings: SimSettings, host: str, port: int) -> None:
    """Run a simulator until SIGINT or SIGTERM: the CLI's ``gateway sim`` (uvloop if present)."""
    try:
        import uvloop  # optional dependency

        loop_factory = uvloop.new_event_loop
    except ImportError:
        loop_factory = None
    with asyncio.Runner(loop_factory=loop_factory) as runner:
        runner.run(_serve(settings, host, port))
