"""Typed, immutable configuration loaded from a TOML file.

The file is read once with :mod:`tomllib` and turned into frozen dataclasses;
nothing else in the gateway looks at raw TOML. Every error names the file, the
key path and what was expected (see :mod:`gateway.configreader`). Secrets are
never in the file: a backend names the environment variable holding its key.
"""

from __future__ import annotations

import os
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

from gateway.archive.settings import ArchiveConfig, parse_archive
from gateway.configreader import ConfigError, Table
from gateway.resilience.breaker_config import BreakerConfig, parse_breaker
from gateway.resilience.settings import RetryConfig, SheddingConfig, parse_retry, parse_shedding
from gateway.security.keys import missing_secrets as auth_missing_secrets
from gateway.security.settings import SecurityConfig, parse_security
from gateway.sessions.settings import SessionsConfig, parse_sessions
from gateway.telemetry.settings import TelemetryConfig, parse_telemetry
from gateway.upstream.stream_policy import StreamPolicy, parse_stream_policy

DEFAULT_CONFIG_PATH = "config.toml"
CONFIG_ENV = "GATEWAY_CONFIG"
BACKEND_KINDS = ("openai",)

__all__ = [
    "BackendConfig",
    "ConfigError",
    "GatewayConfig",
    "ModelConfig",
    "ServerConfig",
    "Timeouts",
    "config_path",
    "load_config",
    "parse_config",
]


@dataclass(frozen=True, slots=True)
class Timeouts:
    """The layered timeouts, in seconds (see DESIGN.md, "Timeouts")."""

    connect: float = 3.0
    """Opening a TCP connection to a backend."""
    read: float = 15.0
    """Silence between bytes from a backend (for a stream: between tokens)."""
    total: float = 20.0
    """The request's deadline until its response starts, across all attempts."""
    stream_max: float = 0.0
    """Longest a started response may last; 0 means unlimited."""


@dataclass(frozen=True, slots=True)
class ServerConfig:
    host: str = "127.0.0.1"
    port: int = 8080
    max_body_bytes: int = 4 * 1024 * 1024
    workers: int = 1
    drain_seconds: float = 30.0
    """At shutdown, how long requests and streams in flight may take to finish."""
    shutdown_grace_seconds: float = 1.0
    """At shutdown, how long new connections are still accepted after /readyz turned 503."""


@dataclass(frozen=True, slots=True)
class BackendConfig:
    name: str
    url: str
    """Base URL without the ``/v1`` suffix, e.g. ``http://10.0.0.7:8000``."""
    models: tuple[str, ...]
    kind: str = "openai"
    weight: float = 1.0
    max_concurrency: int = 256
    api_key_env: str | None = None
    timeouts: Timeouts = field(default_factory=Timeouts)

    def api_key(self) -> str | None:
        """The backend's key, read from the environment variable it names."""
        return os.environ.get(self.api_key_env) if self.api_key_env else None


@dataclass(frozen=True, slots=True)
class ModelConfig:
    """Per-model settings; a model needs a table only to have some."""

    name: str
    fallbacks: tuple[str, ...] = ()
    """Models to try, in order, when no backend of this one admits a call."""
    streams: StreamPolicy = field(default_factory=StreamPolicy)
    """This model's streaming policy (``[models.streams]`` over ``[streams]``)."""


@dataclass(frozen=True, slots=True)
class GatewayConfig:
    source: str
    server: ServerConfig
    timeouts: Timeouts
    backends: tuple[BackendConfig, ...]
    model_settings: tuple[ModelConfig, ...] = ()
    retry: RetryConfig = field(default_factory=RetryConfig)
    breaker: BreakerConfig = field(default_factory=BreakerConfig)
    shedding: SheddingConfig = field(default_factory=SheddingConfig)
    streams: StreamPolicy = field(default_factory=StreamPolicy)
    sessions: SessionsConfig = field(default_factory=SessionsConfig)
    security: SecurityConfig = field(default_factory=SecurityConfig)
    telemetry: TelemetryConfig = field(default_factory=TelemetryConfig)
    archive: ArchiveConfig = field(default_factory=ArchiveConfig)

    @property
    def models(self) -> tuple[str, ...]:
        """Every model a client may ask for, in the order first named."""
        seen: dict[str, None] = {}
        for backend in self.backends:
            for model in backend.models:
                seen.setdefault(model)
        for model in self.model_settings:
            seen.setdefault(model.name)
        return tuple(seen)

    def fallbacks(self, model: str) -> tuple[str, ...]:
        for settings in self.model_settings:
            if settings.name == model:
                return settings.fallbacks
        return ()

    def stream_policy(self, model: str) -> StreamPolicy:
        for settings in self.model_settings:
            if settings.name == model:
                return settings.streams
        return self.streams

    def missing_secrets(self) -> list[str]:
        """Environment variables named by the file but not set."""
        return [
            f"backends.{b.name}.api_key_env: environment variable {b.api_key_env} is not set"
            for b in self.backends
            if b.api_key_env and b.api_key_env not in os.environ
        ] + auth_missing_secrets(self.security.auth)


def config_path(explicit: str | None = None) -> str:
    """The file to load: the explicit path, else ``$GATEWAY_CONFIG``, else ``config.toml``."""
    return explicit or os.environ.get(CONFIG_ENV) or DEFAULT_CONFIG_PATH


def load_config(path: str | None = None) -> GatewayConfig:
    """Read and validate a configuration file; raises :class:`ConfigError`."""
    source = config_path(path)
    try:
        text = Path(source).read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"{source}: cannot read the file: {exc.strerror or exc}") from None
    return parse_config(text, source=source)


def parse_config(text: str, source: str = DEFAULT_CONFIG_PATH) -> GatewayConfig:
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{source}: not valid TOML: {exc}") from None
    root = Table(source, "", data)
    server = _server(root.table("server"))
    timeouts = _timeouts(root.table("timeouts"), Timeouts())
    backends = _backends(root, timeouts)
    streams = parse_stream_policy(root.table("streams"), StreamPolicy())
    config = GatewayConfig(
        source=source, server=server, timeouts=timeouts, backends=backends,
        model_settings=_models(root, backends, streams), streams=streams,
        retry=parse_retry(root.table("retry")),
        breaker=parse_breaker(root.table("breaker")),
        shedding=parse_shedding(root.table("shedding")),
        sessions=parse_sessions(root.table("sessions")),
        security=parse_security(root),
        telemetry=parse_telemetry(root.table("telemetry")),
        archive=parse_archive(root.table("archive")),
    )
    root.finish()
    return config


def _models(root: Table, backends: tuple[BackendConfig, ...],
            streams: StreamPolicy) -> tuple[ModelConfig, ...]:
    tables = list(root.tables("models"))
    served = {model for backend in backends for model in backend.models}
    named = served | {t.string("name") for t in tables}
    models: list[ModelConfig] = []
    for table in tables:
        name = table.string("name")
        fallbacks = table.strings("fallbacks")
        for fallback in fallbacks:
            if fallback == name or fallback not in named:
                raise table.error("fallbacks", "names of other models served or declared here",
                                  list(fallbacks))
        if name not in served and not fallbacks:
            raise table.error("name", "a model some backend serves (or give it fallbacks)", name)
        if any(m.name == name for m in models):
            raise table.error("name", "a model no other [[models]] table names", name)
        policy = parse_stream_policy(table.table("streams"), streams)
        table.finish()
        models.append(ModelConfig(name=name, fallbacks=fallbacks, streams=policy))
    return tuple(models)


def _server(table: Table) -> ServerConfig:
    defaults = ServerConfig()
    server = ServerConfig(
        host=table.string("host", defaults.host),
        port=table.integer("port", defaults.port, minimum=0, maximum=65535),
        max_body_bytes=table.integer("max_body_bytes", defaults.max_body_bytes, minimum=1),
        workers=table.integer("workers", defaults.workers, minimum=1, maximum=512),
        drain_seconds=table.seconds("drain_seconds", defaults.drain_seconds, allow_zero=True),
        shutdown_grace_seconds=table.seconds("shutdown_grace_seconds",
                                             defaults.shutdown_grace_seconds, allow_zero=True),
    )
    table.finish()
    return server


def _timeouts(table: Table, base: Timeouts) -> Timeouts:
    """Read a ``timeouts`` table; keys it leaves out keep the values of ``base``."""
    timeouts = Timeouts(
        connect=table.seconds("connect", base.connect),
        read=table.seconds("read", base.read),
        total=table.seconds("total", base.total),
        stream_max=table.seconds("stream_max", base.stream_max, allow_zero=True),
    )
    table.finish()
    return timeouts


def _backends(root: Table, timeouts: Timeouts) -> tuple[BackendConfig, ...]:
    backends: list[BackendConfig] = []
    for table in root.tables("backends"):
        backend = _backend(table, timeouts)
        if any(b.name == backend.name for b in backends):
            raise table.error("name", "a name no other backend uses", backend.name)
        backends.append(backend)
    if not backends:
        raise ConfigError(f"{root.source}: backends: expected at least one [[backends]] table")
    return tuple(backends)


def _backend(table: Table, timeouts: Timeouts) -> BackendConfig:
    defaults = BackendConfig(name="", url="", models=())
    backend = BackendConfig(
        name=table.string("name"),
        url=_base_url(table),
        kind=table.string("kind", defaults.kind, choices=BACKEND_KINDS),
        models=table.strings("models", non_empty=True),
        weight=table.number("weight", defaults.weight, what="a weight"),
        max_concurrency=table.integer("max_concurrency", defaults.max_concurrency, minimum=1),
        api_key_env=table.env_name("api_key_env"),
        timeouts=_timeouts(table.table("timeouts"), timeouts),
    )
    table.finish()
    return backend


def _base_url(table: Table) -> str:
    url = table.string("url")
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise table.error("url", "an http:// or https:// URL with a host", url)
    if parts.query or parts.fragment:
        raise table.error("url", "a base URL without query or fragment", url)
    path = parts.path.rstrip("/")
    if path.endswith("/v1"):
        raise table.error("url", "the base URL without the /v1 suffix", url)
    return f"{parts.scheme}://{parts.netloc}{path}"
