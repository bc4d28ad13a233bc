"""Settings of the simulator: timings, answer size, and injected faults.

Both classes are frozen so that one value can be shared by every request in
flight: changing the behaviour (a header, ``PUT /sim/faults``) builds a new
value instead of mutating one that a running stream is reading.
"""

from __future__ import annotations

from dataclasses import dataclass, field

# The model that /v1/models lists when the simulator accepts any model name.
DEFAULT_MODEL = "sim-model"


@dataclass(frozen=True)
class Faults:
    """Failures to inject; the defaults inject none.

    Each field mimics one way a real inference backend fails, so that the
    gateway's timeouts, retries and breakers can be tested against it.
    """

    status: int | None = None
    """Answer this HTTP status with an OpenAI error body ..."""
    status_rate: float = 1.0
    """... for this fraction of requests (drawn from the seeded generator)."""
    retry_after: float | None = None
    """Seconds; sent as ``Retry-After`` and ``retry-after-ms`` with a status fault."""
    hang_headers: bool = False
    """Never send response headers: wait until the client goes away."""
    stall_after: int | None = None
    """After k tokens, go silent until the client goes away."""
    drop_after: int | None = None
    """After k tokens, abort the TCP connection (no terminating chunk)."""
    refuse: bool = False
    """Control API only: stop listening, so that connections are refused."""


@dataclass(frozen=True)
class SimSettings:
    """Process-wide defaults; ``X-Sim-*`` headers override them per request."""

    ttft_ms: float = 0.0
    """Time to first token."""
    itl_ms: float = 0.0
    """Inter-token latency: the gap between two tokens."""
    tokens: int = 16
    """Tokens in a full answer (``max_tokens`` may cut it shorter)."""
    seed: int = 0
    """Chooses the answer's words and the draws of ``status_rate``."""
    models: tuple[str, ...] = ()
    """Accepted model names; empty accepts any name."""
    faults: Faults = field(default_factory=Faults)
    """Faults applied to every request unless a header says otherwise."""

    def listed_models(self) -> tuple[str, ...]:
        """Model ids for ``GET /v1/models``: a client must always see one."""
        return self.models or (DEFAULT_MODEL,)
