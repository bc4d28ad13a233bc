"""Answering with a backend's started response: JSON or a relayed stream.

Here the session turn is stored (before the client gets the last byte, so
its next turn finds it) and the key's tokens are charged.
"""

from __future__ import annotations

import functools
from time import perf_counter

from aiohttp import web

from gateway.http.failures import ATTEMPTS_HEADER, BACKEND_HEADER, MODEL_HEADER
from gateway.http.headers import client_headers
from gateway.http.request_id import HEADER as REQUEST_ID
from gateway.http.request_id import KEY as REQUEST_ID_KEY
from gateway.http.streaming import StreamJob, answer_stream
from gateway.runtime import Runtime
from gateway.security import PRINCIPAL_KEY, StreamUsage, charge_tokens, total_tokens
from gateway.security.usage import usage_of
from gateway.sessions import DEGRADED_HEADER, SessionBinding
from gateway.sessions.state import TurnMeta
from gateway.telemetry.request import RequestTelemetry
from gateway.upstream.dispatch import Dispatched
from gateway.upstream.stream_relay import EventsObserver


async def respond(request: web.Request, runtime: Runtime, job: StreamJob, model: str,
                  dispatched: Dispatched, binding: SessionBinding | None,
                  report: RequestTelemetry) -> web.StreamResponse:
    rid = request[REQUEST_ID_KEY]
    upstream = dispatched.response
    headers = client_headers(upstream.headers)
    headers[BACKEND_HEADER] = dispatched.backend.name
    headers[MODEL_HEADER] = model
    headers[ATTEMPTS_HEADER] = str(dispatched.attempts)
    headers[REQUEST_ID] = rid
    if dispatched.body is not None:
        dispatched.finish()
        if _charges_tokens(request):  # reading usage parses the body: only when it counts
            charge_tokens(request, total_tokens(dispatched.body))
        if report.sampled:
            report.usage = usage_of(dispatched.body)
        if binding is not None:
            binding.observe_json(dispatched.body)
            meta = _turn_meta(model, dispatched, usage_of(dispatched.body))
            await binding.commit(rid, meta)  # before the answer: the next turn finds it
            _mark_degraded(headers, binding)
        return web.Response(status=upstream.status, body=dispatched.body, headers=headers)
    usage = _usage_follower(request)
    before_done = None
    if binding is not None:
        _mark_degraded(headers, binding)
        before_done = functools.partial(binding.commit, rid,
                                        _turn_meta(model, dispatched, None))
    relay_started = perf_counter()
    result = await answer_stream(request, headers, dispatched, job, runtime.dispatcher,
                                 on_events=_observer(binding, usage), before_done=before_done,
                                 on_first=report.first_token)
    report.streamed_since(relay_started)
    if result.resume_reasons:
        report.stream_resumed(result.resume_reasons)
    if result.error_code is not None:
        report.stream_broke(result.error_code)
    if usage is not None:
        charge_tokens(request, usage.total)
    return result.response


def _turn_meta(model: str, dispatched: Dispatched, usage: dict | None) -> TurnMeta:
    """What the archive records about the request behind a session turn."""
    usage = usage or {}
    return TurnMeta(model=model, backend=dispatched.backend.name,
                    prompt_tokens=usage.get("prompt_tokens"),
                    completion_tokens=usage.get("completion_tokens"),
                    total_tokens=usage.get("total_tokens"))


def _charges_tokens(request: web.Request) -> bool:
    """Whether the request's key has a token limit to charge the answer to."""
    principal = request.get(PRINCIPAL_KEY)
    return principal is not None and bool(principal.rates.token_interval_us)


def _usage_follower(request: web.Request) -> StreamUsage | None:
    """Follows a stream's usage only when the key has a token limit to charge."""
    return StreamUsage() if _charges_tokens(request) else None


def _observer(binding: SessionBinding | None,
              usage: StreamUsage | None) -> EventsObserver | None:
    """What must see the stream's events: the session's reply, the key's usage, or both."""
    if binding is None:
        return usage.feed if usage is not None else None
    if usage is None:
        return binding.observe_stream_events

    def both(events: bytes) -> None:
        binding.observe_stream_events(events)
        usage.feed(events)
    return both


def _mark_degraded(headers: dict[str, str], binding: SessionBinding) -> None:
    if binding.degraded:
        headers[DEGRADED_HEADER] = "degraded"


