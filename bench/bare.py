"""The stack's floor: the same HTTP server and backend client as the gateway, no gateway.

    .venv/bin/python -m bench.bare fixed --port 0
    .venv/bin/python -m bench.bare proxy --backend http://127.0.0.1:8001 --port 0

``fixed`` is an aiohttp server (uvloop, no access log) that answers every
chat POST with a fixed completion (a fixed 32-event stream when the body asks
for ``"stream":true``): the CPU aiohttp's server costs per request.
It also accepts OTLP/HTTP trace exports (``/v1/traces``): the suite's
gateways run with tracing on and send their sampled spans to one.
``proxy`` forwards each POST to one backend through the gateway's own
keep-alive client (:mod:`gateway.upstream.connections`) and relays the answer
(whole body, or the stream as it comes): the cost of any proxy built on this
stack before it does anything a gateway is for (timeouts aside: it has the
client's). ``bench.floor`` measures both beside the gateway; the difference
to the gateway is what its features cost.
"""

from __future__ import annotations

import argparse
import asyncio
from collections.abc import Awaitable, Callable, Sequence

import orjson
import uvloop
from aiohttp import web

from gateway.upstream.connections import ConnectionPool

ANSWER = orjson.dumps({
    "id": "chatcmpl-bare", "object": "chat.completion", "created": 0, "model": "sim-model",
    "choices": [{"index": 0, "finish_reason": "stop",
                 "message": {"role": "assistant", "content": "word " * 16}}],
    "usage": {"prompt_tokens": 8, "completion_tokens": 16, "total_tokens": 24}})


async def accepted(request: web.Request) -> web.StreamResponse:
    """OTLP/HTTP export: the suite's gateways send their sampled spans here."""
    await request.read()
    return web.Response(status=200, content_type="application/x-protobuf")


EVENTS = b"".join(
    b'data: {"id":"chatcmpl-bare","object":"chat.completion.chunk","created":0,'
    b'"model":"sim-model","choices":[{"index":0,"delta":{"content":"word "},'
    b'"finish_reason":null}]}\n\n' for _ in range(32)) + b"data: [DONE]\n\n"
"""A fixed 32-token stream, sent in one write (the load generator's streams ask for
``"stream":true`` in compact JSON)."""


async def fixed(request: web.Request) -> web.StreamResponse:
    body = await request.read()
    if b'"stream":true' in body:
        return web.Response(body=EVENTS, content_type="text/event-stream")
    return web.Response(body=ANSWER, content_type="application/json")


def proxy_handler(pool: ConnectionPool) -> Callable[[web.Request], Awaitable[web.StreamResponse]]:
    async def proxy(request: web.Request) -> web.StreamResponse:
        body = await request.read()
        upstream = await pool.post(request.path, body, {"Content-Type": "application/json"},
                                   read=15.0, deadline=pool.loop.time() + 20.0)
        try:
            if upstream.content_type != "text/event-stream":
                return web.Response(status=upstream.status, body=await upstream.read(),
                                    content_type="application/json")
            response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
            await response.prepare(request)
            async for chunk in upstream:
                await response.write(chunk)
            await response.write_eof()
            return response
        finally:
            upstream.release()
    return proxy


async def serve(mode: str, port: int, backend: str) -> None:
    app = web.Application()
    if mode == "fixed":
        app.router.add_post("/v1/chat/completions", fixed)
        app.router.add_post("/v1/traces", accepted)
    else:
        pool = ConnectionPool(backend, connect_timeout=3.0)
        pool.start(asyncio.get_running_loop())
        app.router.add_post("/v1/chat/completions", proxy_handler(pool))
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", port)
    await site.start()
    bound = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    print(f"bare {mode}: listening on http://127.0.0.1:{bound}", flush=True)
    await asyncio.Event().wait()


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("mode", choices=("fixed", "proxy"))
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--backend", default="http://127.0.0.1:8001")
    args = parser.parse_args(argv)
    uvloop.run(serve(args.mode, args.port, args.backend))


if __name__ == "__main__":
    main()
