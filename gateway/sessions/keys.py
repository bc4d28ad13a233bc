"""Where a session lives: ``{prefix}{shard_NN}:{tenant}:{session_id}``.

NN is ``CRC32(session_id) % buckets``, zero-padded to at least two digits. The
braces are a Redis Cluster hash tag: every key of a bucket hashes to one slot,
so a session write and its bucket's archive outbox (``{prefix}{shard_NN}:outbox``,
issue 5) can change together in one atomic script. The ``sharded`` store moves
whole buckets between servers for the same reason.

The tenant sits after the tag, inside the key, so two tenants using the same
session id never share a value (the tenant is checked again on every read).
It is not part of the bucket: a bucket depends on the session id alone.

With few buckets a cluster is filled unevenly: 32 buckets are 32 slots, and
with 3 masters one master gets 12 of them and another 10. For a cluster,
configure several hundred buckets or more (e.g. 1024), so that every master
owns many of them and the load evens out.
"""

from __future__ import annotations

import re
import zlib
from dataclasses import dataclass, field

TENANT_PATTERN = re.compile(r"^[A-Za-z0-9._-]{1,64}$")
"""Tenant ids: no ``:`` (it separates key segments), no braces (hash tags)."""


@dataclass(frozen=True, slots=True)
class SessionKey:
    """A session's identity and its storage key, computed once per request."""

    tenant: str
    session_id: str
    bucket: int
    redis_key: str


@dataclass(frozen=True, slots=True)
class KeyScheme:
    """How session ids map to buckets and keys, for one key prefix."""

    prefix: str = "chat:session:"
    buckets: int = 32
    _tags: dict[int, str] = field(default_factory=dict, init=False, repr=False,
                                  compare=False)
    """bucket → ``{shard_NN}``, filled as buckets are used (at most ``buckets``
    entries): every turn needs its key and its outbox key, and formatting the tag
    each time cost a few µs of a session turn."""

    def __post_init__(self) -> None:
        if self.buckets < 1:
            raise ValueError(f"buckets must be >= 1, got {self.buckets}")

    @property
    def digits(self) -> int:
        """Width of NN: two digits at least, more when there are more buckets."""
        return max(2, len(str(self.buckets - 1)))

    def bucket(self, session_id: str) -> int:
        return zlib.crc32(session_id.encode()) % self.buckets

    def shard_tag(self, bucket: int) -> str:
        tag = self._tags.get(bucket)
        if tag is None:
            tag = self._tags[bucket] = f"{{shard_{bucket:0{self.digits}d}}}"
        return tag

    def key(self, tenant: str, session_id: str) -> SessionKey:
        """The key of a session; the tenant must be a plain id (ValueError otherwise)."""
        if not TENANT_PATTERN.match(tenant):
            raise ValueError(f"tenant id {tenant!r} is not 1-64 characters of [A-Za-z0-9._-]")
        bucket = self.bucket(session_id)
        redis_key = f"{self.prefix}{self.shard_tag(bucket)}:{tenant}:{session_id}"
        return SessionKey(tenant, session_id, bucket, redis_key)

    def outbox_key(self, bucket: int) -> str:
        """The bucket's archive outbox stream (same hash tag as its sessions)."""
        return f"{self.prefix}{self.shard_tag(bucket)}:outbox"
