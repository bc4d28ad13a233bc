"""The inference endpoints: from a client request to a relayed backend response.

This is the request path of DESIGN.md ("One request, end to end"): validate,
route by model (walking the fallback chain when no backend of a model admits
a call), dispatch with retries under one deadline, relay the answer.
"""

from __future__ import annotations

from collections.abc import Mapping

import orjson
from aiohttp import web

from gateway.config import GatewayConfig
from gateway.http.body import Endpoint, InferenceBody, parse_inference_body, read_body
from gateway.http.errors import GatewayError
from gateway.http.headers import client_headers, upstream_headers
from gateway.http.request_id import HEADER as REQUEST_ID
from gateway.http.request_id import KEY as REQUEST_ID_KEY
from gateway.http.streaming import StreamJob, answer_stream
from gateway.resilience.deadline import Deadline
from gateway.upstream.attempt import AttemptFailed, Failure
from gateway.upstream.backend import Backend
from gateway.upstream.dispatch import Dispatched, Dispatcher, NoBackendAdmits
from gateway.upstream.pool import Pool

BACKEND_HEADER = "X-Gateway-Backend"
MODEL_HEADER = "X-Gateway-Model"
ATTEMPTS_HEADER = "X-Gateway-Attempts"


class Proxy:
    """Serves the OpenAI-compatible inference endpoints."""

    def __init__(self, config: GatewayConfig, pools: Mapping[str, Pool],
                 dispatcher: Dispatcher) -> None:
        self._config = config
        self._pools = pools
        self._dispatcher = dispatcher

    async def handle(self, request: web.Request, endpoint: Endpoint) -> web.StreamResponse:
        raw = await read_body(request, self._config.server.max_body_bytes)
        body = parse_inference_body(raw, endpoint)
        chain = self._model_chain(body.model)
        deadline = Deadline.after(self._config.timeouts.total)
        refusals: list[NoBackendAdmits] = []
        for model in chain:
            pool = self._pools.get(model)
            if pool is None:
                continue
            payload = body.raw
            if pool.model != body.model:
                # A fallback model: its backends expect their own model name.
                payload = orjson.dumps({**body.data, "model": pool.model})
            job = self._job(request, endpoint, body, pool)
            try:
                dispatched = await self._dispatcher.dispatch(
                    pool, endpoint.path, payload, stream=body.stream,
                    headers_for=job.headers_for, deadline=deadline, read=job.policy.read)
            except NoBackendAdmits as refused:
                refusals.append(refused)
                continue
            except AttemptFailed as failed:
                return _failure_response(failed, request[REQUEST_ID_KEY])
            return await self._respond(request, job, model, dispatched)
        raise _nothing_admits(body.model, refusals)

    def _model_chain(self, model: str) -> list[str]:
        """The model and its fallbacks, transitively, each once."""
        if model not in self._pools and not self._config.fallbacks(model):
            raise GatewayError(404, f"model '{model}' is not served by this gateway",
                               code="model_not_found")
        chain, pending = [], [model]
        while pending:
            current = pending.pop(0)
            if current not in chain:
                chain.append(current)
                pending.extend(self._config.fallbacks(current))
        return chain

    def _job(self, request: web.Request, endpoint: Endpoint, body: InferenceBody,
             pool: Pool) -> StreamJob:
        rid = request[REQUEST_ID_KEY]

        def headers_for(backend: Backend) -> dict[str, str]:
            return upstream_headers(request.headers, rid, backend.api_key)

        data = body.data if pool.model == body.model else {**body.data, "model": pool.model}
        return StreamJob(pool, endpoint.path, data, headers_for,
                         self._config.stream_policy(pool.model), self._config.timeouts.total)

    async def _respond(self, request: web.Request, job: StreamJob, model: str,
                       dispatched: Dispatched) -> web.StreamResponse:
        upstream = dispatched.response
        headers = client_headers(upstream.headers)
        headers[BACKEND_HEADER] = dispatched.backend.name
        headers[MODEL_HEADER] = model
        headers[ATTEMPTS_HEADER] = str(dispatched.attempts)
        headers[REQUEST_ID] = request[REQUEST_ID_KEY]
        if dispatched.body is not None:
            dispatched.finish()
            return web.Response(status=upstream.status, body=dispatched.body, headers=headers)
        result = await answer_stream(request, headers, dispatched, job, self._dispatcher)
        return result.response


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
