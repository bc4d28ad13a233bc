"""The ``[sessions]`` configuration table, typed and checked.

Every key is read through :class:`gateway.configreader.Table`, so an error
names the file and the key path (``config.toml: sessions.shards[1].buckets:
...``). Store-specific keys are refused with the wrong store, so a typo in
``store`` cannot leave a Redis URL silently unused.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TypeVar
from urllib.parse import urlsplit

from gateway.configreader import ConfigError, Table
from gateway.sessions.codec import CODECS_BY_NAME

STORES = ("memory", "redis", "cluster", "sharded")
_REDIS_SCHEMES = ("redis", "rediss")
_T = TypeVar("_T")


@dataclass(frozen=True, slots=True)
class ShardConfig:
    """One standalone Redis server of the ``sharded`` store and the buckets it owns."""

    url: str
    buckets: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class CompensationConfig:
    """The log of writes Redis missed, and its replay."""

    max_entries: int = 100_000
    """Pending writes kept at most; beyond that new ones are dropped (and counted)."""
    backoff_initial_ms: int = 50
    """First wait after a failed replay; doubles (with jitter) up to ``backoff_max_ms``."""
    backoff_max_ms: int = 5_000
    flush_on_close_ms: int = 2_000
    """How long ``close()`` keeps replaying what is pending before giving up."""


@dataclass(frozen=True, slots=True)
class SessionsConfig:
    """Server-side chat sessions (issue 4); see config.toml for every key."""

    enabled: bool = True
    store: str = "memory"
    url: str = ""
    """``redis``: the server, e.g. ``redis://127.0.0.1:6379/0``."""
    nodes: tuple[str, ...] = ()
    """``cluster``: startup nodes as ``host:port``."""
    shards: tuple[ShardConfig, ...] = ()
    """``sharded``: the servers; together their buckets cover 0..buckets-1 once."""
    prefix: str = "chat:session:"
    buckets: int = 32
    codec: str = "snappy"
    ttl_seconds: float = 86_400.0
    """Idle time after which a session expires; every write starts it again."""
    op_timeout_ms: int = 50
    """Budget of one Redis call; past it the call counts as failed (fallback)."""
    startup_timeout_ms: int = 2_000
    """Budget of the first contact (cluster topology) in ``start()``."""
    commit_timeout_ms: int = 1_000
    """Budget of a whole append (all compare-and-set attempts) before the fallback."""
    cas_max_attempts: int = 100
    wait_replicas: int = 0
    """Replicas that must acknowledge a write (WAIT); default 1 for ``cluster``."""
    max_connections: int | None = None
    """Connections per server. ``redis``/``sharded``: a pool that callers queue for
    (within ``op_timeout_ms``), 32 by default. ``cluster``: per node, and the cluster
    client fails at once beyond it (NOTES.md), so 256 by default."""
    warm_connections: int = 32
    """Connections opened by ``start()`` (per server or master), so that a burst
    does not pay for new connections inside its small time budget."""
    lru_max_entries: int = 10_000
    lru_max_bytes: int = 64 * 1024 * 1024
    window_max_messages: int = 64
    window_max_tokens: int = 8_000
    max_stored_messages: int = 1_000
    idempotency_window: int = 64
    compensation: CompensationConfig = field(default_factory=CompensationConfig)

    @property
    def connection_limit(self) -> int:
        """``max_connections``, or the store's default."""
        if self.max_connections is not None:
            return self.max_connections
        return 256 if self.store == "cluster" else 32

    @property
    def remote(self) -> bool:
        """Whether the store is Redis (and so needs the fallback)."""
        return self.store != "memory"


def parse_sessions(table: Table) -> SessionsConfig:
    """Read the ``[sessions]`` table (an empty table gives the defaults)."""
    d = SessionsConfig()
    store = table.string("store", d.store, choices=STORES)
    buckets = table.integer("buckets", d.buckets, minimum=1, maximum=65_536)
    config = SessionsConfig(
        enabled=table.boolean("enabled", d.enabled),
        store=store,
        url=_redis_url(table, "url") if store == "redis" else _refuse(table, "url", store, ""),
        nodes=_nodes(table) if store == "cluster" else _refuse(table, "nodes", store, ()),
        shards=(_shards(table, buckets) if store == "sharded"
                else _refuse(table, "shards", store, ())),
        prefix=table.string("prefix", d.prefix),
        buckets=buckets,
        codec=table.string("codec", d.codec, choices=tuple(CODECS_BY_NAME)),
        ttl_seconds=table.seconds("ttl_seconds", d.ttl_seconds),
        op_timeout_ms=table.integer("op_timeout_ms", d.op_timeout_ms, minimum=1),
        startup_timeout_ms=table.integer("startup_timeout_ms", d.startup_timeout_ms, minimum=1),
        commit_timeout_ms=table.integer("commit_timeout_ms", d.commit_timeout_ms, minimum=1),
        cas_max_attempts=table.integer("cas_max_attempts", d.cas_max_attempts, minimum=1),
        wait_replicas=table.integer("wait_replicas", 1 if store == "cluster" else 0),
        max_connections=(table.integer("max_connections", 0, minimum=1)
                         if table.has("max_connections") else None),
        warm_connections=table.integer("warm_connections", d.warm_connections),
        lru_max_entries=table.integer("lru_max_entries", d.lru_max_entries, minimum=1),
        lru_max_bytes=table.integer("lru_max_bytes", d.lru_max_bytes, minimum=1024),
        window_max_messages=table.integer("window_max_messages", d.window_max_messages,
                                          minimum=1),
        window_max_tokens=table.integer("window_max_tokens", d.window_max_tokens, minimum=1),
        max_stored_messages=table.integer("max_stored_messages", d.max_stored_messages,
                                          minimum=1),
        idempotency_window=table.integer("idempotency_window", d.idempotency_window,
                                         minimum=1),
        compensation=_compensation(table.table("compensation")),
    )
    _check_prefix(table, config.prefix)
    table.finish()
    return config


def _refuse(table: Table, key: str, store: str, neutral: _T) -> _T:
    """Refuse a key that belongs to another store; its neutral value otherwise."""
    if table.has(key):
        raise ConfigError(f"{table.source}: {_path(table, key)}: "
                          f"not used with store = \"{store}\"")
    return neutral


def _path(table: Table, key: str) -> str:
    return f"{table.path}.{key}" if table.path else key


def _redis_url(table: Table, key: str) -> str:
    url = table.string(key)
    parts = urlsplit(url)
    if parts.scheme not in _REDIS_SCHEMES or not parts.hostname:
        raise table.error(key, "a redis:// or rediss:// URL with a host", url)
    return url


def _nodes(table: Table) -> tuple[str, ...]:
    nodes = table.strings("nodes", non_empty=True)
    for node in nodes:
        host, _, port = node.rpartition(":")
        if not host or not port.isdigit() or not 0 < int(port) < 65_536:
            raise table.error("nodes", 'a list of "host:port" strings', node)
    return nodes


def _shards(table: Table, buckets: int) -> tuple[ShardConfig, ...]:
    shards: list[ShardConfig] = []
    owner: dict[int, str] = {}
    for shard_table in table.tables("shards"):
        url = _redis_url(shard_table, "url")
        owned = _bucket_set(shard_table, buckets)
        for bucket in owned:
            if bucket in owner:
                raise shard_table.error("buckets", f"buckets no other shard owns (bucket "
                                        f"{bucket} is also in {owner[bucket]})", bucket)
            owner[bucket] = _path(shard_table, "buckets")
        shard_table.finish()
        shards.append(ShardConfig(url=url, buckets=owned))
    missing = [b for b in range(buckets) if b not in owner]
    if missing:
        raise ConfigError(f"{table.source}: {_path(table, 'shards')}: every bucket "
                          f"0-{buckets - 1} needs a shard; missing {_ranges(missing)}")
    return tuple(shards)


def _bucket_set(table: Table, buckets: int) -> tuple[int, ...]:
    """``buckets = "0-15,20"``: ranges and single buckets, all below ``buckets``."""
    spec = table.string("buckets")
    expected = f'bucket numbers and ranges in 0-{buckets - 1}, like "0-15,20"'
    owned: list[int] = []
    for item in spec.split(","):
        low, _, high = item.strip().partition("-")
        if not low.isdigit() or (high and not high.isdigit()):
            raise table.error("buckets", expected, spec)
        first, last = int(low), int(high or low)
        if first > last or last >= buckets:
            raise table.error("buckets", expected, spec)
        owned.extend(range(first, last + 1))
    return tuple(sorted(set(owned)))


def _ranges(numbers: list[int]) -> str:
    """``[0, 1, 2, 5]`` → ``"0-2,5"``, for error messages."""
    runs: list[str] = []
    start = prev = numbers[0]
    for n in [*numbers[1:], None]:
        if n is not None and n == prev + 1:
            prev = n
            continue
        runs.append(f"{start}-{prev}" if prev != start else f"{start}")
        if n is not None:
            start = prev = n
    return ",".join(runs)


def _compensation(table: Table) -> CompensationConfig:
    d = CompensationConfig()
    config = CompensationConfig(
        max_entries=table.integer("max_entries", d.max_entries, minimum=1),
        backoff_initial_ms=table.integer("backoff_initial_ms", d.backoff_initial_ms, minimum=1),
        backoff_max_ms=table.integer("backoff_max_ms", d.backoff_max_ms, minimum=1),
        flush_on_close_ms=table.integer("flush_on_close_ms", d.flush_on_close_ms, minimum=0),
    )
    if config.backoff_max_ms < config.backoff_initial_ms:
        raise table.error("backoff_max_ms", f">= backoff_initial_ms "
                          f"({config.backoff_initial_ms})", config.backoff_max_ms)
    table.finish()
    return config


def _check_prefix(table: Table, prefix: str) -> None:
    """Braces in the prefix would become the hash tag instead of the bucket's."""
    if "{" in prefix or "}" in prefix:
        raise table.error("prefix", "a prefix without { or } (the bucket is the hash tag)",
                          prefix)
