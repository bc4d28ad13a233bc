"""API keys: from the configuration to an authenticated principal, in constant time.

Keys are known only by their SHA-256 digests; a key configured through an
environment variable is hashed when the gateway starts and its text dropped.
A request's key is hashed once and looked up by digest.

Why the lookup leaks nothing useful about a key:

- The dict is keyed by the *digest* of a key, which an attacker cannot steer:
  to make a presented key's digest share even one byte with a stored one they
  would have to find partial SHA-256 preimages. So whatever timing the lookup
  shows is about digests, not about the key text.
- CPython's dict compares bytes only after the 64-bit hash of the candidate
  equals the stored one's, and bytes hashes are SipHash with a per-process
  random seed; for a wrong key the byte comparison practically never runs.
- The one comparison of secret material that decides the answer is
  ``hmac.compare_digest`` on the two 32-byte digests, whose time does not
  depend on where they differ. It is the only thing that grants access.

A scan with ``compare_digest`` over every key would be constant-time too, but
costs O(keys) per request; the digest index keeps it O(1).
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass

from gateway.configreader import ConfigError
from gateway.http.errors import GatewayError
from gateway.security.gcra import Rates
from gateway.security.settings import ApiKeyConfig, AuthConfig

log = logging.getLogger("gateway.security")

MIN_ENV_KEY_CHARS = 16
"""An environment key shorter than this is refused at start: it could be guessed."""
_AUTH_TYPE = "invalid_request_error"


@dataclass(frozen=True, slots=True)
class Principal:
    """An authenticated client key: what the rest of the request may know about it."""

    name: str
    """The key's configured name: its id in rate limits, logs and metrics."""
    tenant: str
    digest: bytes
    rates: Rates

    @property
    def limited(self) -> bool:
        return self.rates.limited


def digest_of(key: str) -> bytes:
    """SHA-256 of a key as sent (header text back to its original bytes)."""
    return hashlib.sha256(key.encode("utf-8", "surrogateescape")).digest()


def fingerprint(digest: bytes) -> str:
    """A short, non-secret label of a key for logs (32 bits of its digest)."""
    return digest[:4].hex()


def presented_key(headers: Mapping[str, str]) -> str | None:
    """The key from ``Authorization: Bearer <key>``, else from ``api-key: <key>``.

    Raises a 401 for an ``Authorization`` header of another scheme, so that a
    client sending Basic credentials learns why it is refused.
    """
    value = headers.get("Authorization")
    if value is not None:
        scheme, _, token = value.strip().partition(" ")
        if scheme.lower() != "bearer":
            raise unauthorized("the Authorization header must be 'Bearer <key>'",
                               "invalid_api_key")
        return token.strip() or None
    value = headers.get("api-key")
    if value is not None:
        return value.strip() or None
    return None


def unauthorized(message: str, code: str) -> GatewayError:
    return GatewayError(401, message, type=_AUTH_TYPE, code=code)


_MISSING = ("missing API key: send 'Authorization: Bearer <key>' or 'api-key: <key>'",
            "missing_api_key")


class KeyRing:
    """The configured keys, indexed by digest, and the admin key."""

    __slots__ = ("_admin", "_by_digest")

    def __init__(self, principals: list[Principal], admin_digest: bytes | None) -> None:
        self._by_digest = {p.digest: p for p in principals}
        self._admin = admin_digest

    @classmethod
    def from_config(cls, auth: AuthConfig, source: str = "config",
                    environ: Mapping[str, str] | None = None) -> KeyRing:
        """Resolve every key (environment variables are read now); ConfigError if one is
        missing or too short. Called once at start, never per request."""
        env = os.environ if environ is None else environ
        principals = [Principal(k.name, k.tenant, _configured_digest(k, source, env),
                                Rates.per_minute(k.requests_per_minute, k.tokens_per_minute))
                      for k in auth.keys]
        digests = [p.digest for p in principals]
        if len(set(digests)) != len(digests):
            raise ConfigError(f"{source}: auth.keys: two entries hold the same key")
        admin = None
        if auth.admin_key_sha256 is not None:
            admin = bytes.fromhex(auth.admin_key_sha256)
        elif auth.admin_key_env is not None:
            admin = digest_of(_env_key(env, auth.admin_key_env, source, "auth.admin_key_env"))
        if admin is not None and admin in digests:
            raise ConfigError(f"{source}: auth: the admin key is also a client key")
        return cls(principals, admin)

    def authenticate(self, headers: Mapping[str, str]) -> Principal:
        """The principal of the request's key; a 401 GatewayError without a valid one."""
        key = presented_key(headers)
        if key is None:
            raise unauthorized(*_MISSING)
        digest = digest_of(key)
        candidate = self._by_digest.get(digest)
        # The decision rests on this constant-time comparison (see the module docstring).
        if candidate is None or not hmac.compare_digest(candidate.digest, digest):
            log.debug("refused an unknown API key (fingerprint %s)", fingerprint(digest))
            raise unauthorized("invalid API key", "invalid_api_key")
        return candidate

    @property
    def admin_enabled(self) -> bool:
        return self._admin is not None

    def check_admin(self, headers: Mapping[str, str]) -> None:
        """Pass with the admin key; 403 when no admin key is configured, else 401."""
        if self._admin is None:
            raise GatewayError(403, "the admin API is disabled: no admin key is configured",
                               type=_AUTH_TYPE, code="admin_disabled")
        key = presented_key(headers)
        if key is None:
            raise unauthorized(*_MISSING)
        digest = digest_of(key)
        if not hmac.compare_digest(self._admin, digest):
            log.info("refused a key on the admin API (fingerprint %s)", fingerprint(digest))
            raise unauthorized("invalid admin key", "invalid_api_key")


def _configured_digest(key: ApiKeyConfig, source: str, env: Mapping[str, str]) -> bytes:
    if key.sha256 is not None:
        return bytes.fromhex(key.sha256)
    assert key.key_env is not None  # guaranteed by parse_auth
    return digest_of(_env_key(env, key.key_env, source, f"auth.keys.{key.name}.key_env"))


def _env_key(env: Mapping[str, str], name: str, source: str, where: str) -> str:
    value = env.get(name, "").strip()
    if not value:
        raise ConfigError(f"{source}: {where}: environment variable {name} is not set")
    if len(value) < MIN_ENV_KEY_CHARS:
        raise ConfigError(f"{source}: {where}: the key in {name} is shorter than "
                          f"{MIN_ENV_KEY_CHARS} characters")
    return value


def missing_secrets(auth: AuthConfig, environ: Mapping[str, str] | None = None) -> list[str]:
    """Environment variables that ``[auth]`` names but that are not set (check-config)."""
    env = os.environ if environ is None else environ
    named = [(f"auth.keys.{k.name}.key_env", k.key_env) for k in auth.keys if k.key_env]
    if auth.admin_key_env:
        named.append(("auth.admin_key_env", auth.admin_key_env))
    return [f"{where}: environment variable {name} is not set"
            for where, name in named if not env.get(name, "").strip()]
