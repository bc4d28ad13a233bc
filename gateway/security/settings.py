"""The ``[auth]``, ``[ratelimit]`` and ``[limits]`` tables, typed and checked.

Like every section, these are read through :class:`gateway.configreader.Table`
so an error names the file and the key (``config.toml: auth.keys[1].sha256:
expected 64 hexadecimal digits ...``). The file never holds a key itself: a
key is configured as the SHA-256 of its text, or as the name of the
environment variable that holds it (read when the gateway starts, see
:mod:`gateway.security.keys`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from urllib.parse import urlsplit

from gateway.configreader import ConfigError, Table

IDENTIFIER = re.compile(r"^[A-Za-z0-9._-]{1,64}$")
"""Tenants and key names. The same rule as ``gateway.sessions.keys.TENANT_PATTERN``:
a tenant is part of Redis keys, so no ``:`` (separator) and no braces (hash tags)."""
_SHA256_HEX = re.compile(r"^[0-9a-fA-F]{64}$")
_REDIS_SCHEMES = ("redis", "rediss")


@dataclass(frozen=True, slots=True)
class ApiKeyConfig:
    """One client key: who it belongs to and how much it may use."""

    name: str
    """Unique; identifies the key in rate limits, logs and metrics (never the key itself)."""
    tenant: str
    sha256: str | None = None
    """Lowercase hex SHA-256 of the key's UTF-8 text."""
    key_env: str | None = None
    """Environment variable holding the key (read at start)."""
    requests_per_minute: int | None = None
    """None: no request limit."""
    tokens_per_minute: int | None = None
    """None: no token limit. Tokens are ``usage.total_tokens`` of the answers."""


@dataclass(frozen=True, slots=True)
class AuthConfig:
    enabled: bool = False
    """Off only in the embedded local default; then every request is tenant "default"."""
    keys: tuple[ApiKeyConfig, ...] = ()
    admin_key_sha256: str | None = None
    admin_key_env: str | None = None

    @property
    def admin_configured(self) -> bool:
        return self.admin_key_sha256 is not None or self.admin_key_env is not None


@dataclass(frozen=True, slots=True)
class RateLimitConfig:
    redis_url: str = ""
    """Shared limits across replicas; empty: each process limits on its own. A standalone
    Redis >= 5 (or a primary behind a proxy): the lean client does not follow cluster
    redirections, though both keys of a limit share one hash tag for a cluster-aware one."""
    op_timeout_ms: int = 50
    """Budget of one Redis call; past it this request is limited locally."""
    recheck_ms: int = 1000
    """After a Redis failure, limit locally for this long before trying Redis again."""
    prefix: str = "gateway:ratelimit:"


@dataclass(frozen=True, slots=True)
class LimitsConfig:
    max_json_depth: int = 64
    """Nesting of objects and arrays in a request body (tool schemas nest ~10 deep)."""
    max_messages: int = 2048
    max_message_bytes: int = 2 * 1024 * 1024
    """UTF-8 bytes of the strings in one message's ``content`` (image data URLs count)."""
    max_headers: int = 100
    """Request header fields; more is a 400 from the HTTP parser."""
    max_header_bytes: int = 8190
    """Bytes of one header field's name or value."""
    max_request_line_bytes: int = 8190
    """Bytes of the request line (method, target, version)."""


@dataclass(frozen=True, slots=True)
class SecurityConfig:
    """Everything :func:`gateway.security.install_security` needs."""

    auth: AuthConfig = field(default_factory=AuthConfig)
    ratelimit: RateLimitConfig = field(default_factory=RateLimitConfig)
    limits: LimitsConfig = field(default_factory=LimitsConfig)


def parse_security(root: Table) -> SecurityConfig:
    """Read ``[auth]``, ``[ratelimit]`` and ``[limits]`` from the file's root table."""
    return SecurityConfig(auth=parse_auth(root.table("auth")),
                          ratelimit=parse_ratelimit(root.table("ratelimit")),
                          limits=parse_limits(root.table("limits")))


def parse_auth(table: Table) -> AuthConfig:
    keys = tuple(_api_key(t) for t in table.tables("keys"))
    _check_unique(table, keys)
    # Listing keys turns authentication on unless the file says otherwise:
    # keys configured next to a forgotten `enabled` must not leave the door open.
    enabled = table.boolean("enabled", bool(keys))
    admin_sha = _sha256(table, "admin_key_sha256")
    admin_env = table.env_name("admin_key_env")
    if admin_sha and admin_env:
        raise table.error("admin_key_env", "either admin_key_sha256 or admin_key_env, not both",
                          admin_env)
    if enabled and not keys:
        raise ConfigError(f"{table.source}: {table.path}.keys: expected at least one "
                          f"[[{table.path}.keys]] table when {table.path}.enabled = true")
    table.finish()
    return AuthConfig(enabled=enabled, keys=keys, admin_key_sha256=admin_sha,
                      admin_key_env=admin_env)


def _api_key(table: Table) -> ApiKeyConfig:
    name = _identifier(table, "name")
    tenant = _identifier(table, "tenant")
    sha = _sha256(table, "sha256")
    env = table.env_name("key_env")
    if (sha is None) == (env is None):
        raise table.error("sha256", "exactly one of sha256 or key_env", sha or env or "neither")
    key = ApiKeyConfig(name=name, tenant=tenant, sha256=sha, key_env=env,
                       requests_per_minute=_optional_rate(table, "requests_per_minute"),
                       tokens_per_minute=_optional_rate(table, "tokens_per_minute"))
    table.finish()
    return key


def _check_unique(table: Table, keys: tuple[ApiKeyConfig, ...]) -> None:
    names: set[str] = set()
    hashes: set[str] = set()
    for index, key in enumerate(keys):
        where = Table(table.source, f"{table.path}.keys[{index}]", {})
        if key.name in names:
            raise where.error("name", "a name no other key uses", key.name)
        if key.sha256 is not None and key.sha256 in hashes:
            raise where.error("sha256", "a key no other entry uses", key.sha256)
        names.add(key.name)
        if key.sha256 is not None:
            hashes.add(key.sha256)


def _identifier(table: Table, key: str) -> str:
    value = table.string(key)
    if not IDENTIFIER.match(value):
        raise table.error(key, "1-64 characters of [A-Za-z0-9._-]", value)
    return value


def _sha256(table: Table, key: str) -> str | None:
    value = table.string(key, "", non_empty=False)
    if value == "":
        return None
    if not _SHA256_HEX.match(value):
        raise table.error(key, "64 hexadecimal digits (the SHA-256 of the key)", value)
    return value.lower()


def _optional_rate(table: Table, key: str) -> int | None:
    if not table.has(key):
        return None
    return table.integer(key, 0, minimum=1, maximum=1_000_000_000)


def parse_ratelimit(table: Table) -> RateLimitConfig:
    d = RateLimitConfig()
    config = RateLimitConfig(
        redis_url=table.string("redis_url", d.redis_url, non_empty=False),
        op_timeout_ms=table.integer("op_timeout_ms", d.op_timeout_ms, minimum=1, maximum=5000),
        recheck_ms=table.integer("recheck_ms", d.recheck_ms, minimum=1, maximum=600_000),
        prefix=table.string("prefix", d.prefix),
    )
    if config.redis_url and not _valid_redis_url(config.redis_url):
        raise table.error("redis_url", "a redis:// or rediss:// URL (host, port, /db), or empty",
                          config.redis_url)
    if "{" in config.prefix or "}" in config.prefix:
        raise table.error("prefix", "a prefix without braces (they are Redis hash tags)",
                          config.prefix)
    table.finish()
    return config


def _valid_redis_url(url: str) -> bool:
    try:
        parts = urlsplit(url)
        path = parts.path.strip("/")
        return (parts.scheme in _REDIS_SCHEMES and bool(parts.hostname)
                and (parts.port is None or parts.port > 0) and (not path or path.isdigit()))
    except ValueError:  # a port that is not a number, or out of range
        return False


def parse_limits(table: Table) -> LimitsConfig:
    d = LimitsConfig()
    config = LimitsConfig(
        max_json_depth=table.integer("max_json_depth", d.max_json_depth, minimum=2,
                                     maximum=1000),
        max_messages=table.integer("max_messages", d.max_messages, minimum=1),
        max_message_bytes=table.integer("max_message_bytes", d.max_message_bytes, minimum=1),
        max_headers=table.integer("max_headers", d.max_headers, minimum=8, maximum=10_000),
        max_header_bytes=table.integer("max_header_bytes", d.max_header_bytes, minimum=256,
                                       maximum=1024 * 1024),
        max_request_line_bytes=table.integer("max_request_line_bytes",
                                             d.max_request_line_bytes, minimum=256,
                                             maximum=1024 * 1024),
    )
    table.finish()
    return config
