"""Input limits: JSON depth, messages, message size (unit and through the gateway), and the
HTTP parser's header limits over raw sockets."""

from __future__ import annotations

import time

import orjson
import pytest

from gateway.http.errors import GatewayError
from gateway.security import check_inference_limits
from gateway.security.settings import LimitsConfig
from tests.gateway_harness import BackendSpec, config_text
from tests.test_security_support import (  # noqa: F401 - fixture
    ALPHA_KEY,
    CHAT,
    auth_toml,
    bearer,
    needs_wiring,
    raw_exchange,
    secure_gateways,
    status_of,
)

LIMITS = LimitsConfig(max_json_depth=8, max_messages=4, max_message_bytes=100)


def nested(depth: int) -> dict:
    """A chat body whose deepest container is at ``depth`` (the body itself is depth 1)."""
    value: object = "x"
    for _ in range(depth - 1):
        value = [value]
    return {"model": "m", "messages": [{"role": "user", "content": "hi"}], "extra": value}


def refusal(data: dict, limits: LimitsConfig = LIMITS) -> GatewayError:
    with pytest.raises(GatewayError) as error:
        check_inference_limits(data, limits)
    return error.value


def test_depth_limit_is_exact() -> None:
    check_inference_limits(nested(8), LIMITS)
    error = refusal(nested(9))
    assert (error.status, error.code) == (400, "json_too_deep")
    assert "8 levels" in error.message


def test_depth_check_does_not_recurse() -> None:
    """Deeper than Python's recursion limit: refused, no RecursionError."""
    assert refusal(nested(200_000), LimitsConfig(max_json_depth=1000)).code == "json_too_deep"


def test_message_count_and_size_name_the_field() -> None:
    message = {"role": "user", "content": "x" * 100}
    check_inference_limits({"messages": [message] * 4}, LIMITS)
    error = refusal({"messages": [message] * 5})
    assert (error.status, error.code) == (400, "too_many_messages")
    assert "'messages'" in error.message
    error = refusal({"messages": [message, {"role": "user", "content": "x" * 101}]})
    assert (error.status, error.code) == (413, "message_too_large")
    assert "'messages[1].content'" in error.message


def test_message_size_counts_utf8_bytes_and_every_part() -> None:
    assert refusal({"messages": [{"role": "user", "content": "é" * 51}]}).status == 413
    check_inference_limits({"messages": [{"role": "user", "content": "é" * 50}]}, LIMITS)
    parts = [{"type": "text", "text": "a" * 40},
             {"type": "image_url", "image_url": {"url": "data:" + "b" * 60}}]
    assert refusal({"messages": [{"role": "user", "content": parts}]}).status == 413
    check_inference_limits({"messages": [{"role": "user", "content": parts[:1]}]}, LIMITS)


def test_odd_shapes_are_left_to_the_body_parser() -> None:
    for data in ({"messages": "text"}, {"messages": [1, None, "x"]}, {"prompt": "p"}):
        check_inference_limits(data, LIMITS)


def test_cost_on_a_typical_body_is_microseconds() -> None:
    body = orjson.loads(orjson.dumps({
        "model": "m", "temperature": 0.2, "stream": True,
        "messages": [{"role": "user" if i % 2 else "assistant", "content": "word " * 80}
                     for i in range(20)],
        "tools": [{"type": "function", "function": {"name": "f", "parameters": {
            "type": "object", "properties": {"a": {"type": "string"}}}}}]}))
    limits = LimitsConfig()
    rounds = 2000
    began = time.perf_counter()
    for _ in range(rounds):
        check_inference_limits(body, limits)
    per_call = (time.perf_counter() - began) / rounds
    assert per_call < 50e-6, f"{per_call * 1e6:.1f} us per body"


# --- the HTTP parser's limits, over raw sockets ------------------------------------------

HEADER_LIMITS = "max_headers = 20\nmax_header_bytes = 1024\nmax_request_line_bytes = 512\n"


@pytest.fixture
async def gateway(sim, secure_gateways):  # noqa: F811
    return await secure_gateways(config_text([BackendSpec("sim-a", sim.url)]),
                                 auth_toml(limits=HEADER_LIMITS))


def raw_request(extra_headers: list[bytes], target: bytes = b"/v1/chat/completions") -> bytes:
    body = orjson.dumps(CHAT)
    lines = [b"POST " + target + b" HTTP/1.1", b"Host: 127.0.0.1",
             b"Authorization: Bearer " + ALPHA_KEY.encode(), b"Content-Type: application/json",
             b"Content-Length: %d" % len(body), b"Connection: close", *extra_headers]
    return b"\r\n".join(lines) + b"\r\n\r\n" + body


async def test_requests_within_the_header_limits_pass(sim, gateway) -> None:
    extra = [b"X-Pad-%d: %s" % (i, b"v" * 900) for i in range(12)]
    raw = await raw_exchange(gateway.port, raw_request(extra))
    assert status_of(raw) == 200, raw[:300]


@pytest.mark.parametrize("case,extra,target", [
    ("value too long", [b"X-Big: " + b"a" * 1100], b"/v1/chat/completions"),
    ("name too long", [b"X-" + b"n" * 1100 + b": 1"], b"/v1/chat/completions"),
    ("key too long", [], b"/v1/chat/completions"),
    ("too many headers", [b"X-H-%d: 1" % i for i in range(20)], b"/v1/chat/completions"),
    ("request line too long", [], b"/v1/chat/completions?" + b"q" * 600),
])
async def test_oversized_headers_are_refused_by_the_parser(sim, gateway, case, extra,
                                                           target) -> None:
    request = raw_request(extra, target)
    if case == "key too long":
        request = request.replace(b"Bearer " + ALPHA_KEY.encode(), b"Bearer " + b"k" * 1100)
    raw = await raw_exchange(gateway.port, request)
    assert status_of(raw) in (400, 413, 414, 431), raw[:300]
    assert b"Traceback" not in raw and b'File "' not in raw
    assert sim.state.requests_total == 0


# --- body limits through the gateway ------------------------------------------------------

async def test_json_deeper_than_the_parser_allows_is_a_400(sim, gateway, http) -> None:
    body = b'{"model": "sim-model", "messages": [{"role": "user", "content": "x"}], "x": ' \
           + b"[" * 5000 + b"]" * 5000 + b"}"
    async with http.post(f"{gateway.url}/v1/chat/completions", data=body,
                         headers=bearer(ALPHA_KEY)) as response:
        assert response.status == 400
        assert (await response.json())["error"]["code"] in ("invalid_json", "json_too_deep")
    assert sim.state.requests_total == 0


@needs_wiring
@pytest.mark.parametrize("body,status,code", [
    (nested(70), 400, "json_too_deep"),
    ({"model": "sim-model", "messages": [{"role": "user", "content": "x"}] * 3000},
     400, "too_many_messages"),
    ({"model": "sim-model", "messages": [{"role": "user", "content": "x" * (3 << 20)}]},
     413, "message_too_large"),
])
async def test_body_limits_through_the_gateway(sim, secure_gateways, http, body,  # noqa: F811
                                               status, code) -> None:
    gateway = await secure_gateways(config_text([BackendSpec("sim-a", sim.url)],
                                                server="max_body_bytes = 8388608"),
                                    auth_toml())
    async with http.post(f"{gateway.url}/v1/chat/completions", json={**body,
                                                                      "model": "sim-model"},
                         headers=bearer(ALPHA_KEY)) as response:
        assert response.status == status
        assert (await response.json())["error"]["code"] == code
    assert sim.state.requests_total == 0
