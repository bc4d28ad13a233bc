"""Per-key limits as GCRA (the generic cell rate algorithm), locally and in Redis.

GCRA keeps one number per limit, the *theoretical arrival time* (TAT): when the
key would be back to a full allowance. A limit of ``N`` per minute has an
emission interval ``T = 60 s / N`` and a burst window ``W = 60 s``: a request
passes when ``max(TAT, now) + T - now <= W`` and then moves TAT by ``T``.
From idle a key may thus spend a whole minute's allowance at once, then one
unit every ``T``: a token bucket of capacity ``N`` refilled at ``N`` per minute,
with a single number of state and an exact ``Retry-After``.

Two limits per key:

- requests: checked and consumed on admission;
- tokens: only *checked* on admission (the allowance must not be in debt:
  one more token must fit), and *charged* after the answer with its
  ``usage.total_tokens``. A charge may push TAT past the window; the key
  then waits until it is paid off.

A refused request changes no state: neither limit is consumed. The Redis
script does the same arithmetic atomically, with Redis's own clock, so every
replica sees one allowance per key.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

WINDOW_US = 60_000_000
"""The burst window: a minute's allowance may be spent at once."""
REQUESTS = "requests"
TOKENS = "tokens"


@dataclass(frozen=True, slots=True)
class Rates:
    """One key's GCRA parameters, in microseconds, computed once at start."""

    request_interval_us: float = 0.0
    """0: no request limit."""
    token_interval_us: float = 0.0
    """0: no token limit."""
    requests_per_minute: int | None = None
    tokens_per_minute: int | None = None

    @classmethod
    def per_minute(cls, requests: int | None, tokens: int | None) -> Rates:
        return cls(request_interval_us=WINDOW_US / requests if requests else 0.0,
                   token_interval_us=WINDOW_US / tokens if tokens else 0.0,
                   requests_per_minute=requests, tokens_per_minute=tokens)

    @property
    def limited(self) -> bool:
        return self.request_interval_us > 0 or self.token_interval_us > 0

    def max_charge(self) -> int:
        """The most tokens one answer may charge: ten minutes of allowance.

        A backend reporting absurd usage must not lock a key out for days.
        """
        return 10 * (self.tokens_per_minute or 0)


@dataclass(frozen=True, slots=True)
class Decision:
    allowed: bool
    retry_after_s: float = 0.0
    limit: str = ""
    """Which limit refused: ``requests`` or ``tokens``."""


ALLOWED = Decision(True)


def _over(tat: float, interval: float, now: float) -> float:
    """Microseconds until one more unit fits (<= 0: it fits now)."""
    return max(tat, now) + interval - WINDOW_US - now


class LocalLimiter:
    """GCRA in this process: the fallback when Redis is unreachable, or the only
    limiter without ``redis_url``. State is one float per key and limit."""

    __slots__ = ("_clock", "_requests", "_tokens")

    def __init__(self, clock: Callable[[], int] = time.monotonic_ns) -> None:
        self._clock = clock
        self._requests: dict[str, float] = {}
        self._tokens: dict[str, float] = {}

    def _now_us(self) -> float:
        return self._clock() / 1000

    def admit(self, key: str, rates: Rates) -> Decision:
        now = self._now_us()
        if rates.request_interval_us:
            over = _over(self._requests.get(key, now), rates.request_interval_us, now)
            if over > 0:
                return Decision(False, over / 1e6, REQUESTS)
        if rates.token_interval_us:
            over = _over(self._tokens.get(key, now), rates.token_interval_us, now)
            if over > 0:
                return Decision(False, over / 1e6, TOKENS)
        if rates.request_interval_us:
            tat = self._requests.get(key, now)
            self._requests[key] = max(tat, now) + rates.request_interval_us
        return ALLOWED

    def charge(self, key: str, rates: Rates, tokens: int) -> None:
        if not rates.token_interval_us or tokens <= 0:
            return
        now = self._now_us()
        tat = self._tokens.get(key, now)
        self._tokens[key] = max(tat, now) + tokens * rates.token_interval_us


GCRA_SCRIPT = """
-- KEYS[1]: request TAT, KEYS[2]: token TAT (one hash tag: one cluster slot)
-- ARGV: mode ("admit" | "charge"), window_us, request_interval_us,
--       token_interval_us, tokens to charge
-- Returns {allowed (0|1), retry_after_us, limit (0 none, 1 requests, 2 tokens)}.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local window = tonumber(ARGV[2])
local req_i = tonumber(ARGV[3])
local tok_i = tonumber(ARGV[4])

local function tat_of(key)
  local v = tonumber(redis.call('GET', key))
  if v == nil or v < now then return now end
  return v
end

local function store(key, tat)
  local ttl = math.ceil((tat - now) / 1000) + 1000
  redis.call('SET', key, string.format('%.0f', tat), 'PX', ttl)
end

if ARGV[1] == 'charge' then
  store(KEYS[2], tat_of(KEYS[2]) + tonumber(ARGV[5]) * tok_i)
  return {1, 0, 0}
end

local req_tat = 0
if req_i > 0 then
  req_tat = tat_of(KEYS[1])
  local over = req_tat + req_i - window - now
  if over > 0 then return {0, math.ceil(over), 1} end
end
if tok_i > 0 then
  local over = tat_of(KEYS[2]) + tok_i - window - now
  if over > 0 then return {0, math.ceil(over), 2} end
end
if req_i > 0 then store(KEYS[1], req_tat + req_i) end
return {1, 0, 0}
"""


def decision_from_reply(reply: list[int]) -> Decision:
    """The script's ``{allowed, retry_after_us, limit}`` as a :class:`Decision`."""
    if int(reply[0]) == 1:
        return ALLOWED
    limit = REQUESTS if int(reply[2]) == 1 else TOKENS
    return Decision(False, int(reply[1]) / 1e6, limit)
