"""The archive through real gateways (skipped until ``[archive]`` is wired into the app).

- A chat through one gateway: every turn archived with the model and backend
  that served it and the request id the client got.
- Issue 5's "done when", scaled to a test: two gateway processes share Redis
  and MariaDB under a load of multi-turn sessions; MariaDB is stopped for a
  few seconds and one gateway is SIGKILLed mid-load. In the end every turn the
  sessions hold has exactly one set of archive rows (the benchmark runs the
  same with a 30 s outage: ``bench/archive_bench.py --scenario outage``).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import sqlalchemy as sa

import gateway.app
from tests.gateway_harness import BackendSpec, config_text
from tests.processes import Process
from tests.services import MariaDBServer
from tests.test_archive_support import archive_config, sqlite_url, wait_until

pytestmark = pytest.mark.skipif(
    not hasattr(gateway.app, "ARCHIVE"),
    reason="gateway.app does not build the archive yet: the lead wires [archive] "
           "(ArchiveService under the app key ARCHIVE)")


def _archive_toml(url: str, table: str) -> str:
    return (f'[archive]\nurl = "{url}"\ntable = "{table}"\npoll_interval_ms = 20\n'
            "claim_idle_ms = 1000\nclaim_interval_ms = 200\nbackoff_initial_ms = 20\n"
            "backoff_max_ms = 300\nclose_timeout_ms = 2000\n")


async def _chat(http: aiohttp.ClientSession, url: str, session_id: str, n: int,
                stream: bool = False) -> str | None:
    """One turn; the request id when the gateway answered it completely, else None."""
    body: dict[str, Any] = {"model": "sim-model", "stream": stream,
                            "messages": [{"role": "user", "content": f"{session_id} q{n}"}]}
    try:
        async with http.post(f"{url}/v1/chat/completions", json=body,
                             headers={"X-Session-Id": session_id}) as response:
            await response.read()
            return response.headers["X-Request-Id"] if response.status == 200 else None
    except (TimeoutError, aiohttp.ClientError):
        return None


async def test_a_chat_through_the_gateway_is_archived_turn_by_turn(
        sim, gateways, http, tmp_path: Path) -> None:
    table = archive_config(sqlite_url(tmp_path)).table
    text = config_text([BackendSpec("a", sim.url)], extra='[sessions]\nstore = "memory"\n'
                       + _archive_toml(sqlite_url(tmp_path), table))
    running = await gateways(text)
    archive = running.app[gateway.app.ARCHIVE]
    ids = [await _chat(http, running.url, "chat-1", n, stream=n % 2 == 1) for n in range(4)]
    assert None not in ids
    await wait_until(lambda: archive.stats.records_written == 4, within=10,
                     what="4 turns archived")
    async with archive.writer.engine.connect() as conn:
        rows = (await conn.execute(sa.text(
            f"SELECT request_id, msg_index, role, content, model, backend FROM {table} "
            "ORDER BY turn_seq, msg_index"))).all()
    assert [(r[0], r[1], r[2]) for r in rows] == [
        (rid, index, role) for rid in ids for index, role in enumerate(("user", "assistant"))]
    assert [r[3] for r in rows[::2]] == [f"chat-1 q{n}" for n in range(4)]
    assert {(r[4], r[5]) for r in rows} == {("sim-model", "a")}


def _process_config(path: Path, sim_url: str, redis_url: str, db_url: str, table: str) -> str:
    path.write_text(config_text([BackendSpec("a", sim_url)],
                                extra=f'[sessions]\nstore = "redis"\nurl = "{redis_url}"\n'
                                + _archive_toml(db_url, table)))
    return str(path)


async def test_done_when_a_database_outage_and_a_killed_gateway_lose_and_double_nothing(
        sim, http, redis_url: str, mariadb: MariaDBServer, tmp_path: Path) -> None:
    table = archive_config(mariadb.url).table
    config = _process_config(tmp_path / "gw.toml", sim.url, redis_url, mariadb.url, table)
    processes = [Process("serve", "--config", config) for _ in range(2)]
    try:
        urls = [await asyncio.to_thread(p.listening_url, "gateway listening on")
                for p in processes]
        sessions = [f"load-{i}" for i in range(12)]
        turn = itertools.count()

        async def load(rounds: int) -> list[str | None]:
            """Each round, one turn on every session at once, spread over both gateways."""
            answered: list[str | None] = []
            for _ in range(rounds):
                n = next(turn)
                answered += await asyncio.gather(*(_chat(http, urls[(i + n) % 2], s, n)
                                                   for i, s in enumerate(sessions)))
            return answered

        assert None not in await load(3)
        mariadb.kill()
        # requests keep succeeding while the records wait in the outbox
        assert None not in await load(3)
        await asyncio.to_thread(mariadb.restart)
        loading = asyncio.create_task(load(4))
        await asyncio.sleep(0.2)
        processes[0].proc.kill()  # SIGKILL mid-load, possibly mid-batch
        await loading
        survivor = urls[1]
        histories = {s: await _history(http, survivor, s) for s in sessions}
        expected = sum(len(h) for h in histories.values())
        await wait_until(lambda: _count(mariadb, table) == expected, within=30,
                         what=f"{expected} archive rows")
        for session_id, history in histories.items():
            archived = mariadb.query(f"SELECT content FROM {table} WHERE session_id = "
                                     f"'{session_id}' ORDER BY turn_seq, msg_index")
            assert archived.split("\n") == [m["content"] for m in history]
        assert _count(mariadb, table) == expected  # nothing arrives twice, later either
    finally:
        for process in processes:
            with contextlib.suppress(Exception):
                process.stop()


async def _history(http: aiohttp.ClientSession, url: str, session_id: str) -> list[dict]:
    async with http.get(f"{url}/v1/sessions/{session_id}") as response:
        assert response.status == 200
        return (await response.json())["messages"]


def _count(mariadb: MariaDBServer, table: str) -> int:
    try:
        return int(mariadb.query(f"SELECT COUNT(*) FROM {table}"))
    except Exception:  # the table appears with the first gateway's start
        return -1
