"""Counters of the session layer, for metrics (issue 6 exports them).

The service mutates one :class:`Counters`; readers get a frozen
:class:`SessionStats` snapshot, so a scrape never sees half an update.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(slots=True)
class Counters:
    """Running totals since start; incremented on the event loop only."""

    fallback_reads: int = 0
    """Loads answered from the local LRU because Redis failed or was slow."""
    fallback_writes: int = 0
    """Writes kept in the LRU and the compensation log instead of Redis."""
    replayed: int = 0
    """Compensation entries written to Redis (or found already there)."""
    conflicts: int = 0
    """Compare-and-set attempts that lost to a concurrent writer and retried."""
    unreplicated: int = 0
    """Writes WAIT could not confirm on enough replicas (kept for a replay)."""
    dropped: int = 0
    """Compensation entries lost: the log was full, or the stored value is unreadable."""


@dataclass(frozen=True, slots=True)
class SessionStats:
    """A snapshot of :class:`Counters` plus the compensation backlog."""

    fallback_reads: int
    fallback_writes: int
    backlog: int
    """Writes waiting in the compensation log now."""
    replayed: int
    conflicts: int
    unreplicated: int
    dropped: int

    @classmethod
    def of(cls, counters: Counters, backlog: int) -> SessionStats:
        return cls(fallback_reads=counters.fallback_reads,
                   fallback_writes=counters.fallback_writes, backlog=backlog,
                   replayed=counters.replayed, conflicts=counters.conflicts,
                   unreplicated=counters.unreplicated, dropped=counters.dropped)
