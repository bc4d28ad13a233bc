"""The inference endpoints: from a client request to a relayed backend response.

This is the request path of DESIGN.md ("One request, end to end"): validate,
route by model (walking the fallback chain when no backend of a model admits
a call), dispatch with retries under one deadline, relay the answer.
"""

from __future__ import annotations

import functools

import orjson
from aiohttp import web

from gateway.http.body import CHAT, Endpoint, InferenceBody, parse_inference_body, read_body
from gateway.http.context import tenant_of
from gateway.http.errors import GatewayError
from gateway.http.headers import client_headers, upstream_headers
from gateway.http.request_id import HEADER as REQUEST_ID
from gateway.http.request_id import KEY as REQUEST_ID_KEY
from gateway.http.streaming import StreamJob, answer_stream
from gateway.resilience.deadline import Deadline
from gateway.runtime import Runtime, RuntimeHolder
from gateway.security import (
    PRINCIPAL_KEY,
    StreamUsage,
    charge_tokens,
    check_inference_limits,
    total_tokens,
)
from gateway.sessions import DEGRADED_HEADER, SESSION_HEADER, SessionBinding, SessionService
from gateway.upstream.attempt import AttemptFailed, Failure
from gateway.upstream.backend import Backend
from gateway.upstream.dispatch import Dispatched, NoBackendAdmits
from gateway.upstream.pool import Pool
from gateway.upstream.stream_relay import EventsObserver

BACKEND_HEADER = "X-Gateway-Backend"
MODEL_HEADER = "X-Gateway-Model"
ATTEMPTS_HEADER = "X-Gateway-Attempts"


class Proxy:
    """Serves the OpenAI-compatible inference endpoints."""

    def __init__(self, holder: RuntimeHolder, sessions: SessionService | None) -> None:
        self._holder = holder
        self._sessions = sessions

    async def handle(self, request: web.Request, endpoint: Endpoint) -> web.StreamResponse:
        runtime = self._holder.current  # this request keeps it, even across a reload
        raw = await read_body(request, runtime.config.server.max_body_bytes)
        body = parse_inference_body(raw, endpoint)
        check_inference_limits(body.data, runtime.config.security.limits)
        chain = _model_chain(runtime, body.model)
        binding = await self._bind_session(request, endpoint, body)
        if binding is not None:
            body = InferenceBody(raw=binding.request_body(), data=binding.request_data(),
                                 model=body.model, stream=body.stream)
        deadline = Deadline.after(runtime.config.timeouts.total)
        refusals: list[NoBackendAdmits] = []
        for model in chain:
            pool = runtime.pools.get(model)
            if pool is None:
                continue
            job = _job(request, runtime, endpoint, body, pool)
            payload = body.raw if job.data is body.data else orjson.dumps(job.data)
            try:
                dispatched = await runtime.dispatcher.dispatch(
                    pool, endpoint.path, payload, stream=body.stream,
                    headers_for=job.headers_for, deadline=deadline, read=job.policy.read)
            except NoBackendAdmits as refused:
                refusals.append(refused)
                continue
            except AttemptFailed as failed:
                return _failure_response(failed, request[REQUEST_ID_KEY])
            return await _respond(request, runtime, job, model, dispatched, binding)
        raise _nothing_admits(body.model, refusals)

    async def _bind_session(self, request: web.Request, endpoint: Endpoint,
                            body: InferenceBody) -> SessionBinding | None:
        session_id = request.headers.get(SESSION_HEADER)
        if session_id is None:
            return None
        if self._sessions is None:
            raise GatewayError(400, f"{SESSION_HEADER} was sent but sessions are disabled "
                                    "on this gateway", code="sessions_disabled")
        if endpoint is not CHAT:
            raise GatewayError(400, f"{SESSION_HEADER} is only supported on {CHAT.path}",
                               code="invalid_request")
        return await self._sessions.bind(tenant_of(request), session_id, body.data)


def _model_chain(runtime: Runtime, model: str) -> list[str]:
    """The model and its fallbacks, transitively, each once."""
    config = runtime.config
    if model not in runtime.pools and not config.fallbacks(model):
        raise GatewayError(404, f"model '{model}' is not served by this gateway",
                           code="model_not_found")
    chain, pending = [], [model]
    while pending:
        current = pending.pop(0)
        if current not in chain:
            chain.append(current)
            pending.extend(config.fallbacks(current))
    return chain


def _job(request: web.Request, runtime: Runtime, endpoint: Endpoint, body: InferenceBody,
         pool: Pool) -> StreamJob:
    rid = request[REQUEST_ID_KEY]

    def headers_for(backend: Backend) -> dict[str, str]:
        return upstream_headers(request.headers, rid, backend.api_key)

    # A fallback model: its backends expect their own model name.
    data = body.data if pool.model == body.model else {**body.data, "model": pool.model}
    config = runtime.config
    return StreamJob(pool, endpoint.path, data, headers_for, config.stream_policy(pool.model),
                     config.timeouts.total)


async def _respond(request: web.Request, runtime: Runtime, job: StreamJob, model: str,
                   dispatched: Dispatched, binding: SessionBinding | None) -> web.StreamResponse:
    rid = request[REQUEST_ID_KEY]
    upstream = dispatched.response
    headers = client_headers(upstream.headers)
    headers[BACKEND_HEADER] = dispatched.backend.name
    headers[MODEL_HEADER] = model
    headers[ATTEMPTS_HEADER] = str(dispatched.attempts)
    headers[REQUEST_ID] = rid
    if dispatched.body is not None:
        dispatched.finish()
        charge_tokens(request, total_tokens(dispatched.body))
        if binding is not None:
            binding.observe_json(dispatched.body)
            await binding.commit(rid)  # before the answer: the next turn will find it
            _mark_degraded(headers, binding)
        return web.Response(status=upstream.status, body=dispatched.body, headers=headers)
    usage = _usage_follower(request)
    before_done = None
    if binding is not None:
        _mark_degraded(headers, binding)
        before_done = functools.partial(binding.commit, rid)
    result = await answer_stream(request, headers, dispatched, job, runtime.dispatcher,
                                 on_events=_observer(binding, usage), before_done=before_done)
    if usage is not None:
        charge_tokens(request, usage.total)
    return result.response


def _usage_follower(request: web.Request) -> StreamUsage | None:
    """Follows a stream's usage only when the key has a token limit to charge."""
    principal = request.get(PRINCIPAL_KEY)
    if principal is None or not principal.rates.token_interval_us:
        return None
    return StreamUsage()


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


def _failure_response(failed: AttemptFailed, rid: str) -> web.Response:
    """What the client sees when no attempt produced a response.

    A backend's 4xx (a bad prompt; a 429 still standing after retries) is its
    answer to the client and passes through. Otherwise: 504 when time ran out
    (a timeout, or a wait the deadline could not hold), 502 when the backends
    failed, with the last backend's status and message.
    """
    status = failed.status if failed.failure is Failure.HTTP_STATUS else None
    if status is not None and status < 500:
        return _passed_through(failed, rid)
    stop_reason = failed.retry_record.stop_reason if failed.retry_record else None
    tries = f"{failed.attempts} attempt(s)" + _STOP_REASONS.get(stop_reason or "", "")
    if failed.failure.is_timeout or stop_reason == "deadline":
        code = "deadline" if stop_reason == "deadline" else failed.failure.value
        error = GatewayError(504, f"{failed.message} ({tries}, deadline reached)"
                             if stop_reason == "deadline" else f"{failed.message} ({tries})",
                             type="timeout_error", code=code)
    elif status is not None:
        error = GatewayError(502, f"{failed.message} after {tries}: "
                                  f"{_upstream_message(failed.body)}",
                             type="upstream_error", code=f"upstream_{status}")
    else:
        error = GatewayError(502, f"{failed.message} ({tries})", type="upstream_error",
                             code=failed.failure.value)
    response = error.to_response()
    response.headers[BACKEND_HEADER] = failed.backend.name
    response.headers[ATTEMPTS_HEADER] = str(failed.attempts)
    return response


_STOP_REASONS = {
    "budget": ", retry budget exhausted",
    "no_backend": ", no other backend admits a retry",
}


def _passed_through(failed: AttemptFailed, rid: str) -> web.Response:
    """A backend's own error answer (a 400 for a bad prompt, a 429), passed through."""
    headers = client_headers(failed.headers) if failed.headers is not None else {}
    headers[BACKEND_HEADER] = failed.backend.name
    headers[ATTEMPTS_HEADER] = str(failed.attempts)
    headers[REQUEST_ID] = rid
    return web.Response(status=failed.status or 502, body=failed.body, headers=headers)


def _upstream_message(body: bytes) -> str:
    """The backend's error message, when its body has the OpenAI shape."""
    try:
        message = orjson.loads(body)["error"]["message"]
    except (orjson.JSONDecodeError, KeyError, TypeError):
        return body[:200].decode("utf-8", "replace") or "(empty body)"
    return str(message)


def _nothing_admits(model: str, refusals: list[NoBackendAdmits]) -> GatewayError:
    """503 when every breaker is open (Retry-After: the first half-open), else 429 (shed)."""
    if refusals and all(r.breakers_open for r in refusals):
        wait = min(r.retry_after for r in refusals)
        return GatewayError(503, f"no backend of model '{model}' (or its fallbacks) admits a "
                                 "call: circuit breakers are open",
                            type="server_error", code="no_backend_available", retry_after=wait)
    return GatewayError(429, f"every backend of model '{model}' (and its fallbacks) is at "
                             "capacity", type="rate_limit_error", code="overloaded",
                        retry_after=1)
