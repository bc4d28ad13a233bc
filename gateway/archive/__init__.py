"""The session archive (issue 5): every turn, written asynchronously to SQL.

Redis holds the live session; the archive keeps every turn for analytics,
audit and recovery, in TiDB (any MySQL-protocol server) or SQLite (the
embedded default). Modules, in reading order:

- ``settings``: the ``[archive]`` configuration (``ArchiveConfig``, ``parse_archive``)
- ``service``: ``ArchiveService``, what ``app.py`` starts and stops
- ``record``: a turn's archive record, and the outbox entry a session write carries
- ``outbox``: the Redis outbox streams, read through a consumer group
- ``local_queue``: the bounded in-process queue used without Redis (``memory`` store)
- ``writer``, ``schema``: batched idempotent upserts; poison records moved aside
- ``stats``: counters, lag and backlog for metrics and ``/readyz``

Delivery is at-least-once from the outbox and idempotent in the database
(the primary key is the turn's identity), so a replay never duplicates a row.

Only light modules are imported here: the session layer imports
:mod:`gateway.archive.record` on its hot path, and SQLAlchemy is loaded by
:mod:`gateway.archive.service` when an archive is actually built.
"""

from gateway.archive.settings import ArchiveConfig, parse_archive

__all__ = ["ArchiveConfig", "parse_archive"]
