"""The outbox streams in Redis: the commands the archive readers use, on a budget.

Each bucket has a stream ``{prefix}{shard_NN}:outbox`` beside its sessions
(same hash tag, same slot). A record enters it inside the session's
compare-and-set script; readers take it through one consumer group, so each
record goes to one reader at a time, and a record whose reader died stays
pending until another claims it (XAUTOCLAIM). After the rows are committed
the reader acknowledges *and deletes* the entry in one script, so a stream
holds only records not yet archived: its length is the backlog, and the
bound on it (checked in the append script) counts only those.

The archive has its own Redis clients: a blocking read would hold one of the
session store's few pooled connections, and its socket timeout is far
shorter than a read's block time.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from redis.asyncio import Redis, RedisCluster
from redis.asyncio.cluster import ClusterNode
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.driver_info import DriverInfo
from redis.exceptions import RedisClusterException, RedisError, ResponseError

from gateway.archive.tasks import reraise_if_cancelled
from gateway.sessions.keys import KeyScheme
from gateway.sessions.settings import SessionsConfig

RedisClient = Redis | RedisCluster
RECORD_FIELD = b"r"
"""The stream field holding the record (see ``append_script``)."""
_FAILURES = (RedisError, RedisClusterException, OSError, TimeoutError)
_IDS_PER_CALL = 1000

ACK_SCRIPT = """
-- KEYS[1] an outbox stream; ARGV[1] the consumer group; ARGV[2..] entry ids.
-- Acknowledge and delete together: an entry acknowledged but left in the
-- stream would count as backlog for ever; one deleted but still pending
-- would be claimed again as a deleted id.
local acked = redis.call('XACK', KEYS[1], ARGV[1], unpack(ARGV, 2))
redis.call('XDEL', KEYS[1], unpack(ARGV, 2))
return acked
"""


class OutboxUnavailable(Exception):
    """Redis failed or exceeded the budget: the reader backs off."""


class NoGroup(OutboxUnavailable):
    """A stream lost its consumer group (Redis restarted empty, or was flushed)."""


@dataclass(frozen=True, slots=True)
class StreamEntry:
    stream: str
    entry_id: bytes
    raw: bytes
    """The record (empty when the entry has no record field: a dead letter)."""


@dataclass(frozen=True, slots=True)
class Partition:
    """One Redis server (or one cluster) and the outbox streams it holds."""

    client: RedisClient
    streams: tuple[str, ...]


def build_partitions(sessions: SessionsConfig, socket_timeout_s: float) -> list[Partition]:
    """Clients of their own for the configured session store (nothing connected yet)."""
    keys = KeyScheme(sessions.prefix, sessions.buckets)
    options: dict[str, Any] = {
        "socket_timeout": socket_timeout_s, "socket_connect_timeout": socket_timeout_s,
        "retry": Retry(NoBackoff(), 1), "decode_responses": False,
        "driver_info": DriverInfo(name=None, lib_version=None)}
    if sessions.store == "redis":
        every = tuple(keys.outbox_key(b) for b in range(sessions.buckets))
        return [Partition(Redis.from_url(sessions.url, **options), every)]
    if sessions.store == "cluster":
        nodes = [ClusterNode(host, int(port)) for host, _, port in
                 (node.rpartition(":") for node in sessions.nodes)]
        every = tuple(keys.outbox_key(b) for b in range(sessions.buckets))
        return [Partition(RedisCluster(startup_nodes=nodes, **options), every)]
    if sessions.store == "sharded":
        return [Partition(Redis.from_url(shard.url, **options),
                          tuple(keys.outbox_key(b) for b in shard.buckets))
                for shard in sessions.shards]
    return []


class OutboxOps:
    """The outbox commands for some streams of one partition, each within a budget."""

    def __init__(self, client: RedisClient, streams: Sequence[str], group: str,
                 consumer: str, budget_s: float) -> None:
        self._client = client
        self.streams = tuple(streams)
        self._group = group
        self.consumer = consumer
        self._budget = budget_s
        self._cluster = isinstance(client, RedisCluster)

    async def _bounded(self, call: Awaitable[Any], extra_s: float = 0.0) -> Any:
        try:
            async with asyncio.timeout(self._budget + extra_s):
                return await call
        except ResponseError as exc:
            reraise_if_cancelled()
            raise _refusal(exc) from exc
        except _FAILURES as exc:
            reraise_if_cancelled()
            raise OutboxUnavailable(repr(exc)) from exc

    async def _pipelined(self, add: Callable[[Any, str], Any], streams: Iterable[str],
                         tolerate: str = "") -> list[Any]:
        """``add(pipe, stream)`` for each stream, sent as one pipeline (which the
        cluster client splits per node); a reply error starting with ``tolerate``
        is returned, any other raises."""
        pipe = self._client.pipeline(transaction=False)
        for stream in streams:
            add(pipe, stream)
        replies = list(await self._bounded(pipe.execute(raise_on_error=False)))
        for reply in replies:
            if isinstance(reply, Exception) and not (tolerate and
                                                     str(reply).startswith(tolerate)):
                raise _refusal(reply)
        return replies

    async def ensure_groups(self) -> None:
        """Create the group on every stream, from the start: no record is skipped."""
        await self._pipelined(lambda pipe, stream: pipe.execute_command(
            "XGROUP", "CREATE", stream, self._group, "0", "MKSTREAM"), self.streams,
            tolerate="BUSYGROUP")

    async def read_new(self, count: int, block_ms: int | None) -> list[StreamEntry]:
        """Records never delivered to a reader: one multi-stream read on a server,
        blocking ``block_ms`` (None: not at all; 0 would block for ever); on a cluster
        (streams in many slots), a non-blocking read per stream."""
        if not self._cluster:
            streams = dict.fromkeys(self.streams, ">")
            reply = await self._bounded(self._client.xreadgroup(
                self._group, self.consumer, streams, count=count, block=block_ms or None),
                extra_s=(block_ms or 0) / 1000)
            return _read_entries(reply)
        replies = await self._pipelined(lambda pipe, stream: pipe.xreadgroup(
            self._group, self.consumer, {stream: ">"}, count=count), self.streams)
        return [entry for reply in replies for entry in _read_entries(reply)]

    async def claim_stale(self, min_idle_ms: int, count: int) -> list[StreamEntry]:
        """Records another reader (or this one, in an earlier life) holds unacknowledged
        for ``min_idle_ms``: now this reader's."""
        replies = await self._pipelined(lambda pipe, stream: pipe.xautoclaim(
            stream, self._group, self.consumer, min_idle_ms, "0-0", count=count),
            self.streams)
        return [StreamEntry(stream, entry_id, (fields or {}).get(RECORD_FIELD, b""))
                for stream, reply in zip(self.streams, replies, strict=True)
                for entry_id, fields in reply[1]]

    async def touch(self, entries: Sequence[StreamEntry]) -> None:
        """Reset the idle time of records this reader still works on (XCLAIM JUSTID),
        so that no other reader claims them while the database is down."""
        by_stream = _ids_by_stream(entries)
        await self._pipelined(lambda pipe, stream: pipe.xclaim(
            stream, self._group, self.consumer, 0, by_stream[stream], justid=True),
            by_stream)

    async def ack(self, entries: Sequence[StreamEntry]) -> None:
        """Acknowledge and delete records whose rows are committed."""
        by_stream = _ids_by_stream(entries)
        pipe = self._client.pipeline(transaction=False)
        for stream, ids in by_stream.items():
            for start in range(0, len(ids), _IDS_PER_CALL):
                pipe.eval(ACK_SCRIPT, 1, stream, self._group, *ids[start:start + _IDS_PER_CALL])
        for reply in await self._bounded(pipe.execute(raise_on_error=False)):
            if isinstance(reply, Exception):
                raise _refusal(reply)

    async def backlog(self) -> int:
        """Records in these streams, read or not (acknowledged ones are deleted)."""
        replies = await self._pipelined(lambda pipe, stream: pipe.xlen(stream), self.streams)
        return sum(int(reply) for reply in replies)

    async def forget_idle_consumers(self, idle_ms: int) -> int:
        """Remove consumers that hold nothing and were idle for ``idle_ms`` (gateways
        that are gone); each gateway start adds consumers of its own."""
        replies = await self._pipelined(lambda pipe, stream: pipe.xinfo_consumers(
            stream, self._group), self.streams)
        gone = [(stream, consumer["name"]) for stream, consumers in
                zip(self.streams, replies, strict=True) for consumer in consumers
                if consumer["pending"] == 0 and consumer["idle"] >= idle_ms
                and _text(consumer["name"]) != self.consumer]
        pipe = self._client.pipeline(transaction=False)
        for stream, name in gone:
            pipe.xgroup_delconsumer(stream, self._group, name)
        if gone:
            await self._bounded(pipe.execute(raise_on_error=False))
        return len(gone)


def _refusal(reply: BaseException) -> OutboxUnavailable:
    text = str(reply)
    return NoGroup(text) if text.startswith("NOGROUP") else OutboxUnavailable(repr(reply))


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


def _read_entries(reply: Any) -> list[StreamEntry]:
    """XREADGROUP's reply (RESP2 list or RESP3 map) as entries."""
    if not reply:
        return []
    resp3 = isinstance(reply, dict)
    entries = []
    for stream, items in reply.items() if resp3 else reply:
        if resp3:
            items = items[0] if items else []  # RESP3 nests the entries one level deeper
        name = _text(stream)
        entries += [StreamEntry(name, entry_id, (fields or {}).get(RECORD_FIELD, b""))
                    for entry_id, fields in items]
    return entries


def _ids_by_stream(entries: Sequence[StreamEntry]) -> dict[str, list[bytes]]:
    by_stream: dict[str, list[bytes]] = {}
    for entry in entries:
        by_stream.setdefault(entry.stream, []).append(entry.entry_id)
    return by_stream
