"""The ``gateway`` command: ``serve``, ``sim`` and ``check-config``."""

from __future__ import annotations

import argparse
import dataclasses
import logging
import sys
from collections.abc import Sequence

from gateway.config import ConfigError, GatewayConfig, config_path, load_config

EXIT_CONFIG_ERROR = 2


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    return int(args.run(args) or 0)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="gateway", description=__doc__)
    commands = parser.add_subparsers(required=True, metavar="COMMAND")

    serve = commands.add_parser("serve", help="run the gateway")
    serve.add_argument("--config", help="configuration file (default: $GATEWAY_CONFIG "
                                        "or ./config.toml)")
    serve.add_argument("--host", help="listen address (overrides server.host)")
    serve.add_argument("--port", type=int, help="listen port (overrides server.port)")
    serve.add_argument("--workers", type=int, help="worker processes sharing the port "
                                                   "(overrides server.workers)")
    serve.set_defaults(run=_serve)

    check = commands.add_parser("check-config", help="validate a configuration and summarize it")
    check.add_argument("path", nargs="?", help="configuration file (default: $GATEWAY_CONFIG "
                                               "or ./config.toml)")
    check.set_defaults(run=_check_config)

    sim = commands.add_parser("sim", help="run a simulated OpenAI-compatible inference backend")
    sim.add_argument("--host", default="127.0.0.1")
    sim.add_argument("--port", type=int, default=8001)
    sim.add_argument("--ttft-ms", type=float, default=0.0, help="time to first token")
    sim.add_argument("--itl-ms", type=float, default=0.0, help="time between tokens")
    sim.add_argument("--tokens", type=int, default=16, help="tokens in a full answer")
    sim.add_argument("--seed", type=int, default=0, help="seed of the deterministic text")
    sim.add_argument("--model", action="append", default=[], dest="models",
                     help="model name to accept (repeatable; default: any)")
    sim.set_defaults(run=_sim)
    return parser


def _load_or_report(path: str | None) -> GatewayConfig | None:
    try:
        return load_config(path)
    except ConfigError as exc:
        print(f"gateway: {exc}", file=sys.stderr)
        return None


def _serve(args: argparse.Namespace) -> int:
    from gateway.server import serve

    config = _load_or_report(args.config)
    if config is None:
        return EXIT_CONFIG_ERROR
    config = _with_overrides(config, args)
    if problems := _serve_problems(config):
        for problem in problems:
            print(f"gateway: {config.source}: {problem}", file=sys.stderr)
        return EXIT_CONFIG_ERROR
    return serve(config)


def _with_overrides(config: GatewayConfig, args: argparse.Namespace) -> GatewayConfig:
    overrides = {name: getattr(args, name) for name in ("host", "port", "workers")
                 if getattr(args, name) is not None}
    if not overrides:
        return config
    return dataclasses.replace(config, server=dataclasses.replace(config.server, **overrides))


def _serve_problems(config: GatewayConfig) -> list[str]:
    problems = config.missing_secrets()
    if not 0 <= config.server.port <= 65535:
        problems.append(f"--port: expected 0..65535, got {config.server.port}")
    if config.server.workers < 1:
        problems.append(f"--workers: expected at least 1, got {config.server.workers}")
    if config.server.workers > 1 and config.server.port == 0:
        problems.append("several workers need a fixed port (port 0 would give each its own)")
    if config.server.workers > 1 and config.sessions.enabled and config.sessions.store == "memory":
        problems.append('sessions.store = "memory" keeps sessions inside one process: with '
                        'several workers use "redis", "cluster" or "sharded"')
    return problems


def _check_config(args: argparse.Namespace) -> int:
    config = _load_or_report(args.path)
    if config is None:
        return EXIT_CONFIG_ERROR
    print(f"{config_path(args.path)}: OK")
    for line in summarize(config):
        print(f"  {line}")
    for warning in config.missing_secrets():
        print(f"  warning: {warning}")
    return 0


def summarize(config: GatewayConfig) -> list[str]:
    """A few lines an operator can check at a glance."""
    server, t = config.server, config.timeouts
    lines = [
        f"listen: {server.host}:{server.port} ({server.workers} worker(s)), "
        f"max body {server.max_body_bytes} bytes",
        f"timeouts: connect {t.connect:g} s, read {t.read:g} s, total {t.total:g} s, "
        f"stream_max {'unlimited' if not t.stream_max else f'{t.stream_max:g} s'}",
        f"models: {', '.join(config.models)}",
    ]
    for backend in config.backends:
        key = f", key from ${backend.api_key_env}" if backend.api_key_env else ""
        lines.append(f"backend {backend.name}: {backend.url} serves "
                     f"{', '.join(backend.models)} (weight {backend.weight:g}, "
                     f"max_concurrency {backend.max_concurrency}{key})")
    return lines


def _sim(args: argparse.Namespace) -> int:
    from gateway.sim import SimSettings, serve_forever

    settings = SimSettings(ttft_ms=args.ttft_ms, itl_ms=args.itl_ms, tokens=args.tokens,
                           seed=args.seed, models=tuple(args.models))
    serve_forever(settings, args.host, args.port)
    return 0


if __name__ == "__main__":
    sys.exit(main())
