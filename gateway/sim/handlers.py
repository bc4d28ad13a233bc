"""The inference endpoints: chat, completions, embeddings, models, health.

Every inference request goes the same way: read and record it, work out its
options (defaults overridden by ``X-Sim-*`` headers), apply the faults that
strike before any header is sent (hang, error status), plan the answer, then
send it whole or as a stream paced by ``ttft_ms`` and ``itl_ms``, cutting it
short where a stall or drop fault says so.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from typing import NoReturn

import orjson
from aiohttp import web

from gateway.sim.errors import SIM_FAULT, ApiError, bad_request
from gateway.sim.overrides import OverrideError, RequestOptions, request_options
from gateway.sim.settings import Faults
from gateway.sim.shapes import SSE_DONE, ChunkEncoder, completion_body, embeddings_body, models_body
from gateway.sim.state import STATE_KEY, SimState
from gateway.sim.validation import (
    Generation,
    plan_chat,
    plan_completion,
    request_object,
    requested_model,
    string_or_strings,
)

SSE_HEADERS = {"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
DISCONNECT_POLL_S = 0.05
"""How often a hanging handler looks whether its client is still there."""

Planner = Callable[[object, RequestOptions, Sequence[str]], Generation]


def _json(body: bytes) -> web.Response:
    """A 200 with an already encoded JSON body (orjson gives bytes; no re-encoding)."""
    return web.Response(body=body, content_type="application/json")


async def _read_json(request: web.Request) -> object:
    """The parsed body, or None when there is none or it is not JSON (validation says why)."""
    if not request.body_exists:
        return None
    try:
        return orjson.loads(await request.read())
    except orjson.JSONDecodeError:
        return None


async def wait_for_disconnect(request: web.Request) -> None:
    """Sleep, without blocking the loop, until the client goes away.

    ``SimServer`` runs aiohttp with handler cancellation, so a lost connection
    cancels this wait at once; polling the transport also ends it under a
    runner that does not cancel handlers.
    """
    # aiohttp offers no event for "connection lost", hence the polling.
    while (transport := request.transport) is not None and not transport.is_closing():  # noqa: ASYNC110
        await asyncio.sleep(DISCONNECT_POLL_S)


def _format_seconds(seconds: float) -> str:
    """``2.0`` as ``"2"`` (the standard integer form) and ``0.25`` as ``"0.25"``."""
    return f"{seconds:.3f}".rstrip("0").rstrip(".")


def _status_fault(faults: Faults) -> ApiError:
    """The error of a status fault, with both Retry-After forms when set.

    ``retry-after-ms`` is what OpenAI's clients read first; ``Retry-After``
    is the standard header the gateway honours.
    """
    headers = {}
    if faults.retry_after is not None:
        headers["Retry-After"] = _format_seconds(faults.retry_after)
        headers["retry-after-ms"] = f"{faults.retry_after * 1000:.0f}"
    message = f"simulated failure: status {faults.status}"
    return ApiError(faults.status or 500, message, SIM_FAULT, headers)


async def _receive(request: web.Request) -> tuple[SimState, object, RequestOptions]:
    """Read and record a request, decide its options, apply the faults that precede headers."""
    state = request.app[STATE_KEY]
    body = await _read_json(request)
    state.record(request.path, request.headers, body)
    try:
        options = request_options(request.headers, state.options)
    except OverrideError as error:
        raise bad_request(str(error)) from None
    faults = options.faults
    if faults.hang_headers:
        await wait_for_disconnect(request)
        _client_gone()
    if faults.status is not None and (
        faults.status_rate >= 1.0 or state.rng.random() < faults.status_rate
    ):
        raise _status_fault(faults)
    return state, body, options


def _client_gone() -> NoReturn:
    """End a handler whose client has gone, the way aiohttp ends a cancelled one.

    Nothing can be answered any more; raising CancelledError makes aiohttp
    treat it as a premature disconnection instead of logging an error.
    """
    raise asyncio.CancelledError


class _Pacer:
    """Waits until token i is due: ``ttft + i * itl`` after the start.

    Waiting for absolute times keeps the sleeps' overshoot from adding up
    over a long stream.
    """

    def __init__(self, options: RequestOptions) -> None:
        self._loop = asyncio.get_running_loop()
        self._start = self._loop.time()
        self._ttft = options.ttft_ms / 1000.0
        self._itl = options.itl_ms / 1000.0

    async def until_token(self, index: int) -> None:
        """Sleep until token ``index`` is due (no sleep at all with zero timings: benchmarks)."""
        if not self._ttft and not self._itl:
            return
        delay = self._start + self._ttft + self._itl * index - self._loop.time()
        if delay > 0:
            await asyncio.sleep(delay)


def _cut_point(faults: Faults, emitted: int) -> tuple[int, bool] | None:
    """Where a drop or stall fault cuts the answer: (tokens sent before it, is it a drop).

    A fault at k <= emitted strikes after k tokens, before anything further;
    a drop wins over a stall at the same k.
    """
    points = [
        (after, is_drop)
        for after, is_drop in ((faults.drop_after, True), (faults.stall_after, False))
        if after is not None and after <= emitted
    ]
    return min(points, key=lambda point: point[0]) if points else None


async def _cut(request: web.Request, is_drop: bool) -> NoReturn:
    """Drop (abort the TCP connection) or stall (go silent until the client leaves)."""
    if is_drop:
        if request.transport is not None:
            request.transport.abort()
    else:
        await wait_for_disconnect(request)
    _client_gone()


async def _answer_whole(
    request: web.Request, generation: Generation, options: RequestOptions
) -> web.Response:
    """A non-streaming answer, sent when its last token would have been generated."""
    pacer = _Pacer(options)
    cut = _cut_point(options.faults, len(generation.tokens))
    if cut is not None:
        if cut[0]:
            await pacer.until_token(cut[0] - 1)
        await _cut(request, cut[1])
    await pacer.until_token(max(len(generation.tokens) - 1, 0))
    return _json(completion_body(generation))


async def _stream(
    request: web.Request, generation: Generation, options: RequestOptions
) -> web.StreamResponse:
    """Server-sent events: headers now, then each token when due, written one by one."""
    pacer = _Pacer(options)
    encoder = ChunkEncoder(generation)
    # A chat stream always opens with the assistant's role, even with nothing to say.
    tokens = generation.tokens or (("",) if encoder.is_chat else ())
    cut = _cut_point(options.faults, len(tokens))
    if cut is not None:
        tokens = tokens[: cut[0]]
    response = web.StreamResponse(headers=SSE_HEADERS)
    try:
        await response.prepare(request)
        for index, token in enumerate(tokens):
            await pacer.until_token(index)
            await response.write(encoder.token(index, token))
        if cut is not None:
            await _cut(request, cut[1])
        await response.write(encoder.finish())
        if generation.include_usage:
            await response.write(encoder.usage())
        await response.write(SSE_DONE)
    except ConnectionResetError:
        _client_gone()
    return response


async def _generate(request: web.Request, plan: Planner) -> web.StreamResponse:
    """Chat and completions differ only in how the body is planned; the rest is shared."""
    try:
        state, body, options = await _receive(request)
        generation = plan(body, options, state.settings.models)
    except ApiError as error:
        return error.response()
    if generation.stream:
        return await _stream(request, generation, options)
    return await _answer_whole(request, generation, options)


async def chat_completions(request: web.Request) -> web.StreamResponse:
    """``POST /v1/chat/completions``."""
    return await _generate(request, plan_chat)


async def completions(request: web.Request) -> web.StreamResponse:
    """``POST /v1/completions``."""
    return await _generate(request, plan_completion)


async def embeddings(request: web.Request) -> web.Response:
    """``POST /v1/embeddings``: deterministic vectors after ``ttft_ms``."""
    try:
        state, body, options = await _receive(request)
        body = request_object(body)
        model = requested_model(body, state.settings.models)
        inputs = string_or_strings(body, "input")
        encoding_format = body.get("encoding_format") or "float"
        if encoding_format not in ("float", "base64"):
            raise bad_request("'encoding_format' must be 'float' or 'base64'")
    except ApiError as error:
        return error.response()
    await _Pacer(options).until_token(0)
    return _json(embeddings_body(model, inputs, encoding_format))


async def models(request: web.Request) -> web.Response:
    """``GET /v1/models``: the accepted models, or ``sim-model`` when any is accepted."""
    state = request.app[STATE_KEY]
    state.record(request.path, request.headers, None)
    return _json(models_body(state.settings.listed_models(), int(time.time())))


async def health(request: web.Request) -> web.Response:
    """``GET /health``: 200 while the simulator listens (faults do not affect it)."""
    request.app[STATE_KEY].record(request.path, request.headers, None)
    return web.Response()
