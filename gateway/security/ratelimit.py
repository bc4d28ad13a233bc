"""Rate limits shared by every replica through Redis, local when Redis is not there.

Each decision is one call of one Lua script (:data:`gcra.GCRA_SCRIPT`): check
both limits and consume the request, atomically, on Redis's clock. Calls go
through a lean pipelined connection (:mod:`gateway.security.resp`, ~25 us of
CPU per call instead of ~150 us through ``redis.asyncio``) and each runs under
``asyncio.timeout(op_timeout)``, so Redis can never hold a request longer than
that budget.

When a call fails or times out the request is decided by the in-process
:class:`~gcra.LocalLimiter` instead, the connection is dropped, and Redis is
left alone for ``recheck_ms``: during an outage requests do not each pay the
timeout, and then one request at a time probes Redis until it answers again.
While local, each replica enforces the full per-key limits on its own (the
aggregate can reach replicas x limit); that is the price of never refusing or
stalling traffic because the limiter's store is down.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from typing import Any

from gateway.security.gcra import ALLOWED, GCRA_SCRIPT, WINDOW_US, Decision, LocalLimiter, Rates
from gateway.security.gcra import decision_from_reply as _decision
from gateway.security.keys import Principal
from gateway.security.resp import RedisUnavailable, ScriptClient
from gateway.security.settings import RateLimitConfig

log = logging.getLogger("gateway.security")
_FAILURES = (RedisUnavailable, OSError, TimeoutError)
_STARTUP_BUDGET_S = 1.0
_CLOSE_BUDGET_S = 1.0


class RateLimiter:
    """Admits requests and charges tokens per key; see the module docstring."""

    def __init__(self, config: RateLimitConfig, local: LocalLimiter | None = None) -> None:
        self._config = config
        self._local = local or LocalLimiter()
        self._timeout = config.op_timeout_ms / 1000
        self._client = ScriptClient(config.redis_url, GCRA_SCRIPT) if config.redis_url else None
        self._admit_commands: dict[tuple[str, Rates], bytes] = {}
        self._down_until = 0.0
        self._probing = False
        self._pending: set[asyncio.Task[None]] = set()
        self.redis_failures = 0
        """Redis calls that failed or timed out (for tests and metrics)."""
        self.local_decisions = 0
        """Decisions and charges made locally while Redis was configured but unavailable."""

    @property
    def shared(self) -> bool:
        """Whether decisions currently go to Redis."""
        return self._client is not None and self._down_until == 0.0

    async def start(self) -> None:
        """Connect (and load the script) now, so the first request does not wait for it.

        An unreachable Redis does not stop the gateway: it starts limiting locally.
        """
        if self._client is None:
            return
        try:
            async with asyncio.timeout(_STARTUP_BUDGET_S):
                await self._client.ping()
        except _FAILURES as exc:
            self._failed("connect", exc)

    async def close(self) -> None:
        """Finish pending charges (bounded), then close the connection."""
        if self._pending:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(_CLOSE_BUDGET_S):
                    await asyncio.gather(*self._pending, return_exceptions=True)
        if self._client is not None:
            await self._client.close()

    async def admit(self, principal: Principal) -> Decision:
        """Check both limits and consume one request; a refusal consumes nothing."""
        rates = principal.rates
        if not rates.limited:
            return ALLOWED
        reply = await self._call(self._admit_command(principal))
        if reply is None:
            return self._local.admit(principal.name, rates)
        return _decision(reply)

    async def charge(self, principal: Principal, tokens: int) -> None:
        """Charge an answer's tokens to the key's token allowance; never raises."""
        rates = principal.rates
        tokens = min(tokens, rates.max_charge())
        if not rates.token_interval_us or tokens <= 0:
            return
        reply = None
        if self._client is not None:
            command = self._client.command(self._keys_of(principal.name),
                                           ["charge", WINDOW_US, 0, rates.token_interval_us,
                                            tokens])
            reply = await self._call(command)
        if reply is None:
            self._local.charge(principal.name, rates, tokens)

    def charge_soon(self, principal: Principal, tokens: int) -> None:
        """:meth:`charge` in the background: the answer is not held up by Redis."""
        if not principal.rates.token_interval_us or tokens <= 0:
            return
        task = asyncio.get_running_loop().create_task(self.charge(principal, tokens))
        self._pending.add(task)
        task.add_done_callback(self._pending.discard)

    def _admit_command(self, principal: Principal) -> bytes:
        """A key's admission command never changes: its bytes are built once."""
        cache_key = (principal.name, principal.rates)
        command = self._admit_commands.get(cache_key)
        if command is None and self._client is not None:
            rates = principal.rates
            command = self._client.command(
                self._keys_of(principal.name),
                ["admit", WINDOW_US, rates.request_interval_us, rates.token_interval_us, 0])
            self._admit_commands[cache_key] = command
        return command or b""

    async def _call(self, command: bytes) -> Any:
        """One script call within the budget; None when it must be decided locally."""
        if self._client is None:
            return None
        if self._down_until and (time.monotonic() < self._down_until or self._probing):
            self.local_decisions += 1
            return None
        recovering = self._down_until > 0
        if recovering:
            self._probing = True  # one probe at a time; the others stay local meanwhile
        try:
            async with asyncio.timeout(self._timeout):
                reply = await self._client.call(command)
        except _FAILURES as exc:
            self._failed("call", exc)
            self.local_decisions += 1
            return None
        finally:
            if recovering:
                self._probing = False
        if recovering:
            self._down_until = 0.0
            log.warning("rate limits are shared through Redis again")
        return reply

    def _keys_of(self, name: str) -> list[str]:
        # One hash tag per key name: both limits live in one cluster slot.
        tag = f"{self._config.prefix}{{{name}}}"
        return [f"{tag}:requests", f"{tag}:tokens"]

    def _failed(self, what: str, exc: BaseException) -> None:
        self.redis_failures += 1
        first = self._down_until == 0.0
        self._down_until = time.monotonic() + self._config.recheck_ms / 1000
        if self._client is not None:
            self._client.abort()  # a connection that timed out may be stuck: start afresh
        if first:
            log.warning("rate limiter: Redis %s failed (%r); limiting in this process "
                        "until it answers again", what, exc)
