"""Header hygiene between the client and a backend.

Towards a backend, the client's end-to-end headers pass (so ``traceparent`` or
a client's custom headers reach the engine), except hop-by-hop headers, the
client's credentials (its key is for the gateway, never for a backend) and
anything that would let a client pretend to be a proxy. Towards the client,
only an allow-list of backend headers passes: a backend cannot set cookies or
arbitrary headers on the gateway's domain.
"""

from __future__ import annotations

from collections.abc import Mapping

from multidict import CIMultiDictProxy

from gateway.http.request_id import HEADER as REQUEST_ID

HOP_BY_HOP = frozenset({
    "connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "te",
    "trailer", "trailers", "transfer-encoding", "upgrade",
})
_NOT_FORWARDED = HOP_BY_HOP | {
    "host", "content-length", "content-type", "authorization", "api-key", "cookie",
    "accept-encoding", "forwarded", "x-real-ip", "x-request-id", "expect",
    "x-session-id",  # the gateway supplies the history; the backend needs no id
}
_NOT_FORWARDED_PREFIXES = ("x-forwarded-", "proxy-")

PASSED_TO_CLIENT = ("Content-Type", "Retry-After", "retry-after-ms")


def _connection_tokens(headers: Mapping[str, str]) -> set[str]:
    """Headers the client named in ``Connection``: hop-by-hop by declaration."""
    value = headers.get("Connection", "")
    return {token.strip().lower() for token in value.split(",") if token.strip()}


def upstream_headers(client: CIMultiDictProxy[str], request_id: str,
                     api_key: str | None) -> dict[str, str]:
    """Headers for the call to a backend, built from the client's."""
    dropped = _connection_tokens(client)
    headers: dict[str, str] = {}
    for name, value in client.items():
        lower = name.lower()
        if lower in _NOT_FORWARDED or lower in dropped or lower.startswith(_NOT_FORWARDED_PREFIXES):
            continue
        headers[name] = value
    headers["Content-Type"] = "application/json"
    headers[REQUEST_ID] = request_id
    if api_key:
        headers["Authorization"] = f"Bearer {api_key}"
    return headers


def client_headers(upstream: CIMultiDictProxy[str]) -> dict[str, str]:
    """The backend response headers a client may see."""
    return {name: upstream[name] for name in PASSED_TO_CLIENT if name in upstream}
