"""The control API: read and change one simulator's defaults while it runs.

A gateway spreads requests over its backends, so a test cannot aim a header
at one of them; instead it tells that backend, through this API, to fail
every request it gets. Control requests are not counted or recorded, so they
never disturb what a test measures.
"""

from __future__ import annotations

import orjson
from aiohttp import web

from gateway.sim.errors import ApiError, bad_request
from gateway.sim.overrides import OverrideError, apply_update
from gateway.sim.state import STATE_KEY


def _state_response(request: web.Request) -> web.Response:
    """Every control call answers the resulting state, so a test sees what it changed."""
    body = orjson.dumps(request.app[STATE_KEY].snapshot())
    return web.Response(body=body, content_type="application/json")


async def get_state(request: web.Request) -> web.Response:
    """``GET /sim/state``: current settings and counters."""
    return _state_response(request)


async def put_faults(request: web.Request) -> web.StreamResponse:
    """``PUT /sim/faults``: replace some defaults; answers the new state.

    With ``refuse: true`` the answer is sent in full first, then the server
    stops listening, so the caller learns that its order was taken.
    """
    state = request.app[STATE_KEY]
    try:
        try:
            update = orjson.loads(await request.read())
            settings = apply_update(state.settings, state.startup, update)
        except (orjson.JSONDecodeError, OverrideError) as error:
            raise bad_request(f"bad /sim/faults body: {error}") from None
        if settings.faults.refuse and state.on_refuse is None:
            raise bad_request("'refuse' needs a simulator started by start_sim or serve_forever")
    except ApiError as error:
        return error.response()
    state.use(settings)
    response = _state_response(request)
    if settings.faults.refuse and state.on_refuse is not None:
        await response.prepare(request)
        await response.write_eof()
        state.on_refuse()
    return response


async def reset(request: web.Request) -> web.Response:
    """``POST /sim/reset``: startup settings, counters zeroed."""
    request.app[STATE_KEY].reset()
    return _state_response(request)
