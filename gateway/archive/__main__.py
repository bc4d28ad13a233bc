"""Run an archiver alone: ``python -m gateway.archive --config config.toml``.

It reads the ``[sessions]`` and ``[archive]`` tables of a gateway
configuration and drains the Redis outbox into the database like a gateway's
own readers do (same consumer group), without serving requests: an extra
replica for the archive, e.g. to catch up a backlog. The ``memory`` session
store has no outbox to read (its queue lives inside the gateway process).
SIGTERM or SIGINT stop it after the batch in hand.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import signal
import sys
import tomllib
from pathlib import Path

from gateway.archive.service import ArchiveService
from gateway.archive.settings import ArchiveConfig, parse_archive
from gateway.configreader import ConfigError, Table
from gateway.sessions.settings import SessionsConfig, parse_sessions


def _load(path: str) -> tuple[SessionsConfig, ArchiveConfig]:
    data = tomllib.loads(Path(path).read_text(encoding="utf-8"))
    root = Table(path, "", data)
    return parse_sessions(root.table("sessions")), parse_archive(root.table("archive"))


async def _run(sessions: SessionsConfig, archive: ArchiveConfig) -> int:
    service = ArchiveService(archive, sessions)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    await service.start()
    print(f"archiver running: {sessions.store} outbox -> {archive.safe_url}", flush=True)
    try:
        await stop.wait()
    finally:
        await service.close()
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m gateway.archive",
                                     description="drain the session archive outbox")
    parser.add_argument("--config", default="config.toml", help="gateway configuration file")
    args = parser.parse_args(argv)
    try:
        sessions, archive = _load(args.config)
    except (OSError, tomllib.TOMLDecodeError, ConfigError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if not sessions.remote:
        print('error: sessions.store is "memory": there is no outbox to archive from',
              file=sys.stderr)
        return 2
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    with contextlib.suppress(KeyboardInterrupt):
        return asyncio.run(_run(sessions, archive))
    return 0


if __name__ == "__main__":
    sys.exit(main())
