"""The gateway's live routing state, and replacing it on reload without dropping a request.

A :class:`Runtime` is everything a request routes with: the configuration,
the backends (each with its breaker and connection pool), the pools per
model, the dispatcher with the retry policy. A request reads
``RuntimeHolder.current`` once, at its start, and keeps that runtime to its
end; a reload builds a new runtime and swaps it in, so requests in flight
finish on what they started with.

On reload, a backend whose settings did not change is carried over as it is
(its breaker state, its open connections); its breaker takes the new tier
table. A changed or removed backend is retired: it takes no new requests and
its connections close once its last request is done.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from gateway.config import GatewayConfig
from gateway.resilience.breaker import BreakerState, CircuitBreaker
from gateway.resilience.retry import RetryPolicy
from gateway.upstream.backend import Backend
from gateway.upstream.dispatch import Dispatcher
from gateway.upstream.pool import Pool, build_pools

log = logging.getLogger("gateway.runtime")

TransitionHook = Callable[[str, BreakerState, BreakerState], None]
ReloadHook = Callable[[GatewayConfig], Awaitable[None]]
"""Applies a new configuration to a part outside the runtime (e.g. API keys);
raises ConfigError to refuse it before anything changed."""
_RETIRE_MAX_S = 600.0


@dataclass(frozen=True, slots=True)
class Runtime:
    config: GatewayConfig
    backends: dict[str, Backend]
    pools: dict[str, Pool]
    dispatcher: Dispatcher


@dataclass(frozen=True, slots=True)
class ReloadReport:
    kept: tuple[str, ...]
    added: tuple[str, ...]
    retired: tuple[str, ...]


class RuntimeHolder:
    """Owns the current runtime, the breaker hooks, and the retiring backends."""

    def __init__(self, config: GatewayConfig) -> None:
        self.draining = False
        """Set at shutdown: readiness fails so load balancers stop sending traffic."""
        self.transition_hooks: list[TransitionHook] = []
        self.reload_hooks: list[ReloadHook] = []
        self._retiring: set[asyncio.Task[None]] = set()
        backends = {b.name: self._new_backend(b.name, config) for b in config.backends}
        self.current = _runtime(config, backends)

    async def start(self) -> None:
        for backend in self.current.backends.values():
            await backend.start()

    async def close(self) -> None:
        for task in list(self._retiring):
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        for backend in self.current.backends.values():
            await backend.close()

    async def reload(self, config: GatewayConfig) -> ReloadReport:
        """Swap in a runtime built from ``config``; requests in flight are not touched.

        The reload hooks run first: one that refuses the configuration (a key
        that cannot be read, say) stops the reload before the routes change.
        """
        for hook in self.reload_hooks:
            await hook(config)
        old = self.current
        backends: dict[str, Backend] = {}
        kept, added = [], []
        for backend_config in config.backends:
            previous = old.backends.get(backend_config.name)
            if previous is not None and previous.config == backend_config:
                previous.breaker.reconfigure(config.breaker)
                backends[backend_config.name] = previous
                kept.append(backend_config.name)
            else:
                backend = self._new_backend(backend_config.name, config)
                await backend.start()
                backends[backend_config.name] = backend
                added.append(backend_config.name)
        for pool in old.pools.values():
            pool.detach()
        self.current = _runtime(config, backends)
        retired = [b for name, b in old.backends.items() if backends.get(name) is not b]
        for backend in retired:
            task = asyncio.create_task(_retire(backend), name=f"retire-{backend.name}")
            self._retiring.add(task)
            task.add_done_callback(self._retiring.discard)
        return ReloadReport(tuple(kept), tuple(added), tuple(b.name for b in retired))

    def _new_backend(self, name: str, config: GatewayConfig) -> Backend:
        backend_config = next(b for b in config.backends if b.name == name)
        breaker = CircuitBreaker(name, config.breaker, on_transition=self._on_transition)
        return Backend(backend_config, breaker)

    def _on_transition(self, name: str, old: BreakerState, new: BreakerState) -> None:
        for hook in self.transition_hooks:
            hook(name, old, new)


def _runtime(config: GatewayConfig, backends: dict[str, Backend]) -> Runtime:
    pools = build_pools(backends.values(), config.shedding)
    return Runtime(config, backends, pools, Dispatcher(RetryPolicy(config.retry)))


async def _retire(backend: Backend) -> None:
    """Close a backend that left the configuration, once its last request is done."""
    idle = asyncio.Event()

    def check() -> None:
        if backend.in_flight <= 0:
            idle.set()

    backend.on_release(check)
    check()
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(idle.wait(), _RETIRE_MAX_S)
    await backend.close()
    log.info("backend %s retired", backend.name)
