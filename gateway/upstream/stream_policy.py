"""The streaming policy: how long a stream may take to start, stall, crawl or last.

One policy per model (``[streams]``, overridable in ``[models.streams]``).
Each limit, when crossed, ends that attempt with a named reason, which is
also what a client sees in the error event when the stream cannot be resumed
on another backend.
"""

from __future__ import annotations

from dataclasses import dataclass

from gateway.configreader import Table


class Violation:
    """Why a stream attempt ended early: metric label, span attribute, error code."""

    TTFT = "ttft_timeout"
    READ = "stream_read_timeout"
    MIN_THROUGHPUT = "min_throughput"
    MAX_DURATION = "stream_max_exceeded"
    DISCONNECTED = "upstream_disconnected"
    INCOMPLETE = "upstream_incomplete"


RESUMABLE = frozenset({Violation.TTFT, Violation.READ, Violation.MIN_THROUGHPUT,
                       Violation.DISCONNECTED, Violation.INCOMPLETE})
"""Violations after which the generation may continue on another backend."""


@dataclass(frozen=True, slots=True)
class StreamPolicy:
    ttft_timeout: float = 0.0
    """Seconds from the attempt's start to its first event; 0 leaves it to ``read``."""
    read: float = 0.0
    """Seconds of silence allowed between events; 0 means the backend's ``timeouts.read``."""
    min_tokens_per_second: float = 0.0
    """Slowest acceptable rate once ``min_rate_after_tokens`` have arrived; 0 is off."""
    min_rate_after_tokens: int = 8
    max_duration: float = 0.0
    """Longest a stream may last; 0 means the backend's ``timeouts.stream_max``."""
    max_resumes: int = 2
    """Continuations on another backend after a stream broke mid-way; 0 turns resuming off."""


def parse_stream_policy(table: Table, base: StreamPolicy) -> StreamPolicy:
    """Read a ``streams`` table; keys it leaves out keep the values of ``base``."""
    policy = StreamPolicy(
        ttft_timeout=table.seconds("ttft_timeout", base.ttft_timeout, allow_zero=True),
        read=table.seconds("read", base.read, allow_zero=True),
        min_tokens_per_second=table.number("min_tokens_per_second", base.min_tokens_per_second,
                                           allow_equal=True, what="tokens per second"),
        min_rate_after_tokens=table.integer("min_rate_after_tokens", base.min_rate_after_tokens,
                                            minimum=0),
        max_duration=table.seconds("max_duration", base.max_duration, allow_zero=True),
        max_resumes=table.integer("max_resumes", base.max_resumes, minimum=0, maximum=10),
    )
    table.finish()
    return policy
