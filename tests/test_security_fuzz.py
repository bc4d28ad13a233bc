"""Fuzzing the HTTP API of a real gateway with hypothesis.

Random bodies (bytes, any JSON, chat-shaped JSON with wrong types), random
headers, random paths and methods, random session ids, with and without a
valid key. Every answer must be a 2xx or a 4xx with a JSON body (SSE for a
started stream), never a stack trace; a 5xx only as 502/503/504 when the
example asked the simulator for a fault. The gateway must stay healthy.
Example counts are bounded so the module runs in seconds; the example
database is off so runs leave no files behind.
"""

from __future__ import annotations

import json
from typing import Any

import aiohttp
import orjson
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from yarl import URL

from tests.gateway_harness import BackendSpec, config_text
from tests.test_security_support import (  # noqa: F401 - fixture
    ALPHA_KEY,
    auth_toml,
    secure_gateways,
)

FUZZ = settings(max_examples=300, deadline=None, database=None, print_blob=True,
                suppress_health_check=[HealthCheck.function_scoped_fixture,
                                       HealthCheck.too_slow])
TIMEOUT = aiohttp.ClientTimeout(total=10)
FAULTS = [None, ("X-Sim-Status", "503"), ("X-Sim-Status", "500"), ("X-Sim-Status", "429"),
          ("X-Sim-Drop-After", "1"), ("X-Sim-Status", "400")]

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner,
                                                                max_size=4),
    max_leaves=16)
valid_messages = st.lists(st.fixed_dictionaries(
    {"role": st.sampled_from(["user", "assistant", "system"]), "content": st.text(max_size=40)}),
    min_size=1, max_size=4)
messages = st.lists(st.one_of(
    st.fixed_dictionaries({"role": st.sampled_from(["user", "assistant", "system", "tool"]),
                           "content": st.one_of(st.text(max_size=40), json_values)}),
    json_values), max_size=4)
chat_bodies = st.fixed_dictionaries(
    {"model": st.one_of(st.just("sim-model"), st.just("sim-model"), st.just("sim-model"),
                        json_values),
     "messages": st.one_of(valid_messages, valid_messages, valid_messages, messages,
                           json_values)},
    optional={"stream": st.one_of(st.booleans(), st.booleans(), json_values),
              "prompt": json_values, "input": json_values, "max_tokens": json_values,
              "url": st.text(max_size=30), "stream_options": json_values})


def _dumps(value: Any) -> bytes:
    """Stdlib JSON: huge integers and ``Infinity`` (not JSON) are fuzz input too."""
    return json.dumps(value).encode()


valid_bodies = st.fixed_dictionaries(
    {"model": st.just("sim-model"), "messages": valid_messages},
    optional={"stream": st.booleans(), "url": st.text(max_size=30),
              "api_base": st.text(max_size=30), "user": st.text(max_size=10)})
bodies = st.one_of(valid_bodies.map(_dumps), valid_bodies.map(_dumps), chat_bodies.map(_dumps),
                   chat_bodies.map(_dumps), json_values.map(_dumps), st.binary(max_size=64))

_TOKEN = st.text(alphabet="abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_.!~*'",
                 min_size=1, max_size=20)
_VALUE = st.text(alphabet=st.characters(min_codepoint=0x20, max_codepoint=0x7E), max_size=60)
_RESERVED = ("host", "content-length", "transfer-encoding", "connection", "authorization",
             "api-key", "x-sim-", "expect", "content-encoding", "upgrade")
random_headers = st.dictionaries(
    _TOKEN.filter(lambda name: not name.lower().startswith(_RESERVED)), _VALUE, max_size=6)

_SEGMENT = st.text(alphabet="abcdefghijklmnopqrstuvwxyz0123456789-._~:@!$&'()*+,;=", max_size=12)
random_paths = st.one_of(
    st.sampled_from(["/v1/chat/completions", "/v1/completions", "/v1/embeddings", "/v1/models",
                     "/v1/sessions/abc", "/healthz", "/readyz", "/admin/keys", "/", "/v1",
                     "/v1/chat/completions/", "//v1/models", "/v1/../admin/x"]),
    st.lists(st.one_of(_SEGMENT, st.sampled_from(["%2F", "%00", "%ff", "..", ".", "%25"])),
             min_size=1, max_size=5).map(lambda parts: "/" + "/".join(parts)))
methods = st.sampled_from(["GET", "POST", "POST", "POST", "PUT", "DELETE", "PATCH", "OPTIONS"])
credentials = st.sampled_from([{"Authorization": f"Bearer {ALPHA_KEY}"}, {"api-key": ALPHA_KEY},
                               {"Authorization": f"Bearer {ALPHA_KEY}"},
                               {"Authorization": "Bearer wrong"}, {}])
session_ids = st.one_of(st.none(), st.text(max_size=80).filter(
    lambda s: "\r" not in s and "\n" not in s and s.isprintable()))


@pytest.fixture
async def gateway(sim, secure_gateways):  # noqa: F811
    text = config_text([BackendSpec("sim-a", sim.url)],
                       timeouts="read = 2.0\ntotal = 3.0",
                       retry="max_attempts = 2\nbase = 0.001\ncap = 0.002",
                       extra="[breaker]\nmin_calls = 1000000")
    return await secure_gateways(text, auth_toml())


def check_answer(status: int, content_type: str, body: bytes, fault: bool) -> None:
    event(f"status {status}")  # the spread shows with --hypothesis-show-statistics
    assert b"Traceback" not in body and b'File "/' not in body, body[:300]
    if status >= 500:
        assert fault and status in (502, 503, 504), (status, body[:300])
    else:
        assert 200 <= status < 300 or 400 <= status < 500, (status, body[:300])
    if content_type.startswith("text/event-stream"):
        for line in body.split(b"\n"):
            if line.startswith(b"data: ") and line != b"data: [DONE]":
                orjson.loads(line[6:])
        return
    assert content_type.startswith("application/json"), (status, content_type, body[:300])
    payload = orjson.loads(body)
    if status >= 400:
        assert isinstance(payload["error"]["message"], str)


async def exchange(http: aiohttp.ClientSession, method: str, url: URL, body: bytes,
                   headers: dict[str, str]) -> tuple[int, str, bytes]:
    data = body if method in ("POST", "PUT", "PATCH") else None
    async with http.request(method, url, data=data, headers=headers,
                            timeout=TIMEOUT) as response:
        return response.status, response.content_type, await response.read()


async def assert_healthy(http: aiohttp.ClientSession, base: str) -> None:
    async with http.get(f"{base}/healthz", timeout=TIMEOUT) as response:
        assert response.status == 200


@FUZZ
@given(body=bodies, headers=random_headers, key=credentials, session=session_ids,
       fault=st.sampled_from(FAULTS))
async def test_inference_endpoints_answer_every_body(gateway, http, body: bytes,
                                                     headers: dict[str, str],
                                                     key: dict[str, str], session: str | None,
                                                     fault: tuple[str, str] | None) -> None:
    sent = {**headers, **key, "Content-Type": "application/json"}
    if session is not None:
        sent["X-Session-Id"] = session
    if fault is not None:
        sent[fault[0]] = fault[1]
    status, content_type, answer = await exchange(
        http, "POST", URL(f"{gateway.url}/v1/chat/completions"), body, sent)
    check_answer(status, content_type, answer, fault is not None)
    await assert_healthy(http, gateway.url)


@FUZZ
@given(method=methods, path=random_paths, query=st.one_of(st.just(""), _SEGMENT),
       body=bodies, headers=random_headers, key=credentials)
async def test_any_method_and_path_gets_a_json_answer(gateway, http, method: str, path: str,
                                                      query: str, body: bytes,
                                                      headers: dict[str, Any],
                                                      key: dict[str, str]) -> None:
    target = gateway.url + path + (f"?{query}" if query else "")
    status, content_type, answer = await exchange(http, method, URL(target, encoded=True),
                                                  body, {**headers, **key})
    check_answer(status, content_type, answer, fault=False)
    await assert_healthy(http, gateway.url)
