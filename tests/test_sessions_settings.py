"""The [sessions] table: defaults, every store's keys, and errors that name the key."""

from __future__ import annotations

import tomllib

import pytest

from gateway.configreader import ConfigError, Table
from gateway.sessions.settings import SessionsConfig, ShardConfig, parse_sessions


def parse(text: str) -> SessionsConfig:
    return parse_sessions(Table("test.toml", "sessions", tomllib.loads(text)))


def test_an_empty_table_gives_the_embedded_defaults() -> None:
    config = parse("")
    assert config == SessionsConfig()
    assert (config.enabled, config.store, config.prefix, config.buckets) == (
        True, "memory", "chat:session:", 32)
    assert config.op_timeout_ms == 50 and config.wait_replicas == 0 and not config.remote


def test_redis_cluster_and_sharded_stores() -> None:
    assert parse('store = "redis"\nurl = "redis://127.0.0.1:6379/0"').url == (
        "redis://127.0.0.1:6379/0")
    cluster = parse('store = "cluster"\nnodes = ["127.0.0.1:7000", "10.0.0.2:7001"]')
    assert cluster.nodes == ("127.0.0.1:7000", "10.0.0.2:7001")
    assert cluster.wait_replicas == 1  # acknowledged means on a replica too
    sharded = parse('store = "sharded"\nbuckets = 4\n'
                    '[[shards]]\nurl = "redis://a:1"\nbuckets = "0-1"\n'
                    '[[shards]]\nurl = "redis://b:2"\nbuckets = "2,3"\n')
    assert sharded.shards == (ShardConfig("redis://a:1", (0, 1)),
                              ShardConfig("redis://b:2", (2, 3)))


def test_every_tunable_is_read() -> None:
    config = parse('ttl_seconds = 60\nop_timeout_ms = 20\nlru_max_entries = 5\n'
                   'window_max_messages = 10\nwindow_max_tokens = 100\n'
                   '[compensation]\nmax_entries = 9\nbackoff_max_ms = 900\n')
    assert (config.ttl_seconds, config.op_timeout_ms, config.lru_max_entries) == (60, 20, 5)
    assert (config.window_max_messages, config.window_max_tokens) == (10, 100)
    assert (config.compensation.max_entries, config.compensation.backoff_max_ms) == (9, 900)


@pytest.mark.parametrize("text,message", [
    ('store = "mongo"', 'sessions.store: expected one of "memory", "redis"'),
    ('store = "redis"', "sessions.url: expected a string (this key is required)"),
    ('store = "redis"\nurl = "http://x"', "sessions.url: expected a redis:// or rediss://"),
    ('url = "redis://x:1"', 'sessions.url: not used with store = "memory"'),
    ('store = "redis"\nurl = "redis://x"\nnodes = ["a:1"]',
     'sessions.nodes: not used with store = "redis"'),
    ('store = "cluster"', "sessions.nodes: expected a non-empty list of strings"),
    ('store = "cluster"\nnodes = ["nohost"]', 'sessions.nodes: expected a list of "host:port"'),
    ('store = "sharded"\nbuckets = 4\n[[shards]]\nurl = "redis://a"\nbuckets = "0-2"',
     "sessions.shards: every bucket 0-3 needs a shard; missing 3"),
    ('store = "sharded"\nbuckets = 4\n[[shards]]\nurl = "redis://a"\nbuckets = "0-3"\n'
     '[[shards]]\nurl = "redis://b"\nbuckets = "3"',
     "sessions.shards[1].buckets: expected buckets no other shard owns (bucket 3 is also in "
     "sessions.shards[0].buckets)"),
    ('store = "sharded"\nbuckets = 4\n[[shards]]\nurl = "redis://a"\nbuckets = "0-9"',
     "sessions.shards[0].buckets: expected bucket numbers and ranges in 0-3"),
    ('store = "sharded"\n[[shards]]\nurl = "redis://a"\nbuckets = "0-31"\nweight = 2',
     "sessions.shards[0].weight: unknown key"),
    ("buckets = 0", "sessions.buckets: expected an integer >= 1"),
    ("op_timeout_ms = 0", "sessions.op_timeout_ms: expected an integer >= 1"),
    ('op_timeout_ms = "fast"', 'sessions.op_timeout_ms: expected an integer >= 1, got "fast"'),
    ("ttl_seconds = -1", "sessions.ttl_seconds: expected seconds > 0"),
    ('prefix = "a{b}:"', "sessions.prefix: expected a prefix without { or }"),
    ('codec = "lz4"', 'sessions.codec: expected one of "snappy"'),
    ("enabled = 1", "sessions.enabled: expected true or false"),
    ("windw_max_messages = 3", "sessions.windw_max_messages: unknown key"),
    ("[compensation]\nbackoff_initial_ms = 100\nbackoff_max_ms = 50",
     "sessions.compensation.backoff_max_ms: expected >= backoff_initial_ms (100)"),
    ("[compensation]\nmax_entrys = 1", "sessions.compensation.max_entrys: unknown key"),
])
def test_errors_name_the_file_and_key_path(text: str, message: str) -> None:
    with pytest.raises(ConfigError) as error:
        parse(text)
    assert str(error.value).startswith("test.toml: ")
    assert message in str(error.value)
