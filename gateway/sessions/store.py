"""The interface every session store implements, and how a store fails.

A store knows nothing about turns: it keeps encoded sessions under keys and
offers one atomic write, a compare-and-set on the version. The append loop
(:mod:`gateway.sessions.appender`) builds everything else on these three calls,
so the ``memory``, ``redis``, ``cluster`` and ``sharded`` stores behave alike.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from gateway.sessions.keys import SessionKey


class StoreUnavailable(Exception):
    """The store did not answer in time or failed: the caller falls back."""


@dataclass(frozen=True, slots=True)
class CasOutcome:
    """What a compare-and-set did."""

    applied: bool
    current: bytes | None = None
    """On a conflict: the value stored now (None if there is none), to retry on."""
    replicated: bool = True
    """False when the write applied but fewer replicas than asked acknowledged it."""


class SessionStore(Protocol):
    """Encoded sessions under keys, with an atomic versioned write."""

    @property
    def remote(self) -> bool:
        """True for Redis stores: they can fail, so the service keeps a fallback."""
        ...

    async def ping(self, budget: float | None = None) -> None:
        """Reach every server once (learning a cluster's topology); raise if not."""
        ...

    async def get(self, key: SessionKey) -> bytes | None:
        ...

    async def compare_and_set(self, key: SessionKey, expected_version: int,
                              blob: bytes, new_version: int) -> CasOutcome:
        """Store ``blob`` if the stored version is ``expected_version`` (0: absent).

        The idle TTL starts again with every applied write.
        """
        ...

    async def delete(self, key: SessionKey) -> bool:
        """Remove the session; whether it existed."""
        ...

    async def close(self) -> None:
        ...
