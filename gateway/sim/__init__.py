"""A simulated OpenAI-compatible inference backend (vLLM-like), for demos, tests and benchmarks.

It is a real aiohttp server whose timing (time to first token, inter-token
latency), answer and failures are set per process, per request (``X-Sim-*``
headers) or at run time (``/sim/*`` control API). Its text is deterministic,
so tests can predict every token. Modules, in reading order:

- ``settings``: the frozen settings (``SimSettings``, ``Faults``)
- ``text``: the deterministic answer text and embeddings
- ``overrides``: ``X-Sim-*`` headers and control updates, checked
- ``state``: the one mutable object: current defaults and counters
- ``validation``, ``shapes``, ``errors``: request bodies in, OpenAI JSON out
- ``handlers``, ``control``: the endpoints
- ``server``: the application, ``SimServer`` and ``serve_forever``
"""

from gateway.sim.server import SimServer, build_app, serve_forever, start_sim
from gateway.sim.settings import DEFAULT_MODEL, Faults, SimSettings
from gateway.sim.state import SimState
from gateway.sim.text import answer_text, answer_tokens

__all__ = [
    "DEFAULT_MODEL",
    "Faults",
    "SimServer",
    "SimSettings",
    "SimState",
    "answer_text",
    "answer_tokens",
    "build_app",
    "serve_forever",
    "start_sim",
]
