"""The inference endpoints: from a client request to a relayed backend response.

This is the request path of DESIGN.md ("One request, end to end"): validate,
route by model (walking the fallback chain when no backend of a model admits
a call), dispatch with retries under one deadline, relay the answer.
"""

from __future__ import annotations

import orjson
from aiohttp import web

from gateway.http.answer import respond
from gateway.http.body import CHAT, Endpoint, InferenceBody, parse_inference_body, read_body
from gateway.http.context import tenant_of
from gateway.http.errors import GatewayError
from gateway.http.failures import failure_response, nothing_admits
from gateway.http.headers import upstream_headers
from gateway.http.request_id import KEY as REQUEST_ID_KEY
from gateway.http.streaming import StreamJob
from gateway.resilience.deadline import Deadline
from gateway.runtime import Runtime, RuntimeHolder
from gateway.security import (
    check_inference_limits,
)
from gateway.sessions import SESSION_HEADER, SessionBinding, SessionService
from gateway.telemetry.request import RequestTelemetry, Telemetry
from gateway.upstream.attempt import AttemptFailed
from gateway.upstream.backend import Backend
from gateway.upstream.dispatch import NoBackendAdmits
from gateway.upstream.pool import Pool

BACKEND_HEADER = "X-Gateway-Backend"
MODEL_HEADER = "X-Gateway-Model"
ATTEMPTS_HEADER = "X-Gateway-Attempts"


class Proxy:
    """Serves the OpenAI-compatible inference endpoints."""

    def __init__(self, holder: RuntimeHolder, sessions: SessionService | None,
                 telemetry: Telemetry) -> None:
        self._holder = holder
        self._sessions = sessions
        self._telemetry = telemetry

    async def handle(self, request: web.Request, endpoint: Endpoint) -> web.StreamResponse:
        """Serve one request and report it (metrics, span, log line) however it ends."""
        report = self._telemetry.start(request.headers, method=request.method,
                                       route=endpoint.path, request_id=request[REQUEST_ID_KEY],
                                       tenant=tenant_of(request))
        status = 500
        try:
            response = await self._serve(request, endpoint, report)
            status = response.status
            return response
        except GatewayError as error:
            status, report.error_code = error.status, error.code
            if error.code == "overloaded":
                report.shed()
            raise
        finally:
            report.finish(status)

    async def _serve(self, request: web.Request, endpoint: Endpoint,
                     report: RequestTelemetry) -> web.StreamResponse:
        runtime = self._holder.current  # this request keeps it, even across a reload
        raw = await read_body(request, runtime.config.server.max_body_bytes)
        body = parse_inference_body(raw, endpoint)
        report.set_model(body.model, body.stream)
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
                    pool, endpoint.path, payload, stream=body.stream, listener=report,
                    headers_for=job.headers_for, deadline=deadline, read=job.policy.read)
            except NoBackendAdmits as refused:
                refusals.append(refused)
                continue
            except AttemptFailed as failed:
                report.retry_stop = failed.retry_record and failed.retry_record.stop_reason
                return failure_response(failed, request[REQUEST_ID_KEY])
            report.served_model = model
            return await respond(request, runtime, job, model, dispatched, binding, report)
        raise nothing_admits(body.model, refusals)

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


