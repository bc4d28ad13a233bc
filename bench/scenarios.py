"""The suite's scenarios, as data: what the simulator does, what the clients send, how long.

Each scenario names its own simulator timings rather than sending ``X-Sim-*``
headers, so the gateway forwards exactly what a real client would send and
its CPU per request is not inflated by benchmark-only headers. Sizes are
chosen so the full suite runs in about five minutes on two cores and
``--quick`` in under two; every round is bounded in requests and in seconds.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Sizing:
    """How much one scenario runs: rounds per path, and each round's two bounds."""

    rounds: int
    requests: int
    seconds: float
    warmup: int


@dataclass(frozen=True)
class Scenario:
    name: str
    title: str
    concurrencies: tuple[int, ...]
    full: Sizing
    quick: Sizing
    stream: bool = False
    tokens: int = 16
    ttft_ms: float = 0.0
    itl_ms: float = 0.0
    sims: int = 1
    """Simulators (backends). The direct path sends to them in turn."""
    faulty_status_rate: float = 0.0
    """Share of 503s the *last* simulator answers (set with ``PUT /sim/faults``)."""
    session_turns: int = 0
    """Turns per conversation: the session scenario (gateway needs a ``[sessions]`` table)."""
    max_concurrency: int = 256
    """``max_concurrency`` of each backend in the gateway's configuration."""
    rate: float = 0.0
    """Open loop: requests per second on a fixed schedule (0: closed loop)."""
    ramp_seconds: float = 0.0
    """Workers start spread over this time. Closed-loop workers started together stay in
    lock-step (all paced streams tick at the same instant), which measures a burst, not a
    load; spreading starts over one request's duration breaks the lock-step. For 1,000
    streams it also keeps connects within the simulator's listen backlog (128)."""

    def sizing(self, quick: bool) -> Sizing:
        return self.quick if quick else self.full


SCENARIOS: tuple[Scenario, ...] = (
    Scenario(
        "chat", "non-streaming small chat request (16 tokens, no delay)", (16, 64),
        full=Sizing(rounds=3, requests=3000, seconds=6.0, warmup=200),
        quick=Sizing(rounds=2, requests=800, seconds=2.0, warmup=100)),
    Scenario(
        "chat_open", "non-streaming small chat request at a fixed 300 requests/s (open loop, "
        "at most 64 in flight): added latency without the queue a closed loop builds",
        (64,), rate=300.0,
        full=Sizing(rounds=3, requests=1500, seconds=5.0, warmup=100),
        quick=Sizing(rounds=2, requests=450, seconds=1.5, warmup=50)),
    Scenario(
        "stream32", "streaming, 32 tokens, no delay", (16, 64), stream=True, tokens=32,
        full=Sizing(rounds=3, requests=2500, seconds=6.0, warmup=200),
        quick=Sizing(rounds=2, requests=600, seconds=2.0, warmup=100)),
    Scenario(
        "stream64_paced", "realistic stream: 64 tokens, 20 ms between tokens", (64,),
        stream=True, tokens=64, itl_ms=20.0, ramp_seconds=1.3,
        full=Sizing(rounds=3, requests=2000, seconds=6.0, warmup=64),
        quick=Sizing(rounds=1, requests=400, seconds=3.0, warmup=64)),
    Scenario(
        "sessions", "session chat: 8 turns per conversation with X-Session-Id, Redis store",
        (16,), tokens=16, session_turns=8,
        full=Sizing(rounds=3, requests=2000, seconds=6.0, warmup=100),
        quick=Sizing(rounds=2, requests=500, seconds=2.0, warmup=50)),
    Scenario(
        "fault503", "two backends, one answers 503 to 30 % of requests", (16, 64),
        tokens=16, sims=2, faulty_status_rate=0.3,
        full=Sizing(rounds=3, requests=2000, seconds=6.0, warmup=100),
        quick=Sizing(rounds=1, requests=600, seconds=2.5, warmup=50)),
    Scenario(
        "streams1000", "1,000 concurrent slow streams: 64 tokens, 50 ms apart", (1000,),
        stream=True, tokens=64, itl_ms=50.0, max_concurrency=1100, ramp_seconds=3.0,
        full=Sizing(rounds=2, requests=2000, seconds=4.0, warmup=0),
        quick=Sizing(rounds=1, requests=1000, seconds=1.0, warmup=0)),
)
BY_NAME = {scenario.name: scenario for scenario in SCENARIOS}
