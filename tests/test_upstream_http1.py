"""The lean HTTP/1.1 client of the backend hop, against real TCP servers on loopback.

The servers here are small asyncio stream servers that write exact bytes,
because the cases under test are the ones a well-behaved framework would
not produce: a connection closed under a reused keep-alive, a body cut
short, a head that never ends, a backend that stops sending.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest

from gateway.upstream import http1
from gateway.upstream.connections import ConnectionPool
from gateway.upstream.http1 import (
    HIGH_WATER,
    ConnectFailed,
    ConnectionBroken,
    DeadlinePassed,
    ReadTimedOut,
)

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter, int], Awaitable[None]]
OK = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}"


class Server:
    """Counts connections; ``handler(reader, writer, n)`` serves connection number n."""

    def __init__(self, handler: Handler) -> None:
        self.handler = handler
        self.connections = 0
        self.requests: list[bytes] = []
        self.closed_by_client = asyncio.Event()
        self.server: asyncio.Server | None = None

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            await self.handler(reader, writer, self.connections)
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()

    async def read_request(self, reader: asyncio.StreamReader) -> bytes:
        head = await reader.readuntil(b"\r\n\r\n")
        length = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
        request = head + await reader.readexactly(length)
        self.requests.append(request)
        return request

    @property
    def url(self) -> str:
        assert self.server is not None
        port = self.server.sockets[0].getsockname()[1]
        return f"http://127.0.0.1:{port}"


@pytest.fixture
async def serve() -> AsyncIterator[Callable[[Handler], Awaitable[Server]]]:
    servers: list[Server] = []

    async def start(handler: Handler) -> Server:
        server = Server(handler)
        server.server = await asyncio.start_server(server._serve, "127.0.0.1", 0)
        servers.append(server)
        return server

    yield start
    for server in servers:
        assert server.server is not None
        server.server.close()


def pool_for(server: Server, connect_timeout: float = 2.0) -> ConnectionPool:
    pool = ConnectionPool(server.url + "/base", connect_timeout=connect_timeout)
    pool.start(asyncio.get_running_loop())
    return pool


def deadline(seconds: float) -> float:
    return asyncio.get_running_loop().time() + seconds


async def replying(serve, raw: bytes, *, keep_open: bool = False) -> Server:
    """A server that answers each connection's first request with ``raw``, then closes
    the connection (or, with ``keep_open``, waits for the client to close it)."""
    async def handler(reader, writer, _):
        await server.read_request(reader)
        writer.write(raw)
        await writer.drain()
        if keep_open:
            await reader.read()

    server = await serve(handler)
    return server


async def test_keep_alive_connection_is_reused(serve) -> None:
    async def handler(reader, writer, _):
        while True:
            await server.read_request(reader)
            writer.write(OK)

    server = await serve(handler)
    pool = pool_for(server)
    for _ in range(3):
        response = await pool.post("/v1/x", b'{"a":1}', {"X-Test": "1"}, read=5,
                                   deadline=deadline(5))
        assert (response.status, await response.read()) == (200, b"{}")
        response.release()
    assert server.connections == 1
    assert pool.idle_count == 1
    first = server.requests[0]
    assert first.startswith(b"POST /base/v1/x HTTP/1.1\r\nHost: 127.0.0.1:")
    assert b"\r\nX-Test: 1\r\nContent-Length: 7\r\n\r\n{\"a\":1}" in first
    pool.close()


async def test_idle_connection_closed_by_the_backend_is_replaced(serve) -> None:
    # The first connection answers once, then closes without answering the
    # second request: what a keep-alive timeout racing a new request looks like.
    async def handler(reader, writer, number):
        await server.read_request(reader)
        if number == 1:
            writer.write(OK)
            await writer.drain()
            await server.read_request(reader)
            return
        writer.write(OK)
        await writer.drain()

    server = await serve(handler)
    pool = pool_for(server)
    for _ in range(2):
        response = await pool.post("/x", b"{}", {}, read=5, deadline=deadline(5))
        assert await response.read() == b"{}"
        response.release()
    assert server.connections == 2
    pool.close()


async def test_a_connection_cut_mid_head_is_not_retried(serve) -> None:
    server = await replying(serve, b"HTTP/1.1 200 OK\r\nContent-Len")
    pool = pool_for(server)
    with pytest.raises(ConnectionBroken) as broken:
        await pool.post("/x", b"{}", {}, read=5, deadline=deadline(5))
    assert not broken.value.nothing_received
    assert server.connections == 1


async def test_body_cut_short_is_a_broken_connection(serve) -> None:
    server = await replying(serve, b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nabc")
    pool = pool_for(server)
    response = await pool.post("/x", b"{}", {}, read=5, deadline=deadline(5))
    with pytest.raises(ConnectionBroken):
        await response.read()
    response.release()
    assert pool.idle_count == 0


async def test_chunked_stream_arrives_piece_by_piece(serve) -> None:
    sent = asyncio.Event()
    go_on = asyncio.Event()

    async def handler(reader, writer, _):
        await server.read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream; charset=utf-8\r\n"
                     b"Transfer-Encoding: chunked\r\n\r\n6\r\ndata:1\r\n")
        await writer.drain()
        sent.set()
        await go_on.wait()
        writer.write(b"6\r\ndata:2\r\n0\r\n\r\n")
        await writer.drain()
        await reader.read()  # keep the connection until the client is done

    server = await serve(handler)
    pool = pool_for(server)
    response = await pool.post("/x", b"{}", {}, read=5, deadline=deadline(5))
    assert response.content_type == "text/event-stream"
    chunks = aiter(response)
    assert await anext(chunks) == b"data:1"
    go_on.set()
    rest = [chunk async for chunk in chunks]
    assert b"".join(rest) == b"data:2"
    assert response.complete
    response.release()
    assert pool.idle_count == 1
    pool.close()


async def test_body_delimited_by_the_end_of_the_connection(serve) -> None:
    server = await replying(serve, b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\nall of it")
    pool = pool_for(server)
    response = await pool.post("/x", b"{}", {}, read=5, deadline=deadline(5))
    assert await response.read() == b"all of it"
    response.release()
    assert pool.idle_count == 0


async def test_informational_response_is_skipped(serve) -> None:
    server = await replying(serve, b"HTTP/1.1 100 Continue\r\n\r\n" + OK, keep_open=True)
    pool = pool_for(server)
    response = await pool.post("/x", b"{}", {}, read=5, deadline=deadline(5))
    assert (response.status, await response.read()) == (200, b"{}")
    response.release()
    pool.close()


async def test_silence_after_the_head_is_a_read_timeout(serve) -> None:
    server = await replying(
        serve, b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n1\r\na\r\n", keep_open=True)
    pool = pool_for(server)
    response = await pool.post("/x", b"{}", {}, read=0.3, deadline=deadline(5))
    started = time.monotonic()
    assert await anext(aiter(response)) == b"a"
    with pytest.raises(ReadTimedOut):
        await anext(aiter(response))
    assert 0.25 <= time.monotonic() - started < 1.0
    response.release()


async def test_no_head_before_the_deadline(serve) -> None:
    async def handler(reader, writer, _):
        await server.read_request(reader)
        await reader.read()

    server = await serve(handler)
    pool = pool_for(server)
    started = time.monotonic()
    with pytest.raises(DeadlinePassed):
        await pool.post("/x", b"{}", {}, read=5, deadline=deadline(0.3))
    assert 0.25 <= time.monotonic() - started < 1.0


async def test_whole_body_bounded_by_within(serve) -> None:
    async def handler(reader, writer, _):
        await server.read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
        for _ in range(50):
            writer.write(b"1\r\na\r\n")
            await writer.drain()
            await asyncio.sleep(0.05)

    server = await serve(handler)
    pool = pool_for(server)
    response = await pool.post("/x", b"{}", {}, read=1, deadline=deadline(5))
    started = time.monotonic()
    with pytest.raises(DeadlinePassed):
        await response.read(within=0.4)
    assert 0.35 <= time.monotonic() - started < 1.2
    response.release()


async def test_slow_reader_pushes_back_on_the_backend(serve) -> None:
    # More than loopback's socket buffers can hold (a few MB each way): the
    # backend can only finish if the client reads.
    body = b"x" * (32 * 1024 * 1024)
    backend_done = asyncio.Event()

    async def handler(reader, writer, _):
        await server.read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(body))
        for offset in range(0, len(body), 256 * 1024):
            writer.write(body[offset:offset + 256 * 1024])
            await writer.drain()
        backend_done.set()
        await reader.read()

    server = await serve(handler)
    pool = pool_for(server)
    response = await pool.post("/x", b"{}", {}, read=5, deadline=deadline(5))
    async with asyncio.timeout(5):
        # Nobody has read a byte yet. The client's pausing has no event to await
        # (it is a transport state), so this polls it, bounded by the timeout.
        while not response.reading_paused:  # noqa: ASYNC110
            await asyncio.sleep(0.01)
    assert response.buffered <= HIGH_WATER + 256 * 1024
    assert not backend_done.is_set()
    received = 0
    async for chunk in response:
        received += len(chunk)
        assert response.buffered <= HIGH_WATER + 256 * 1024
    assert received == len(body)
    assert backend_done.is_set()
    response.release()
    pool.close()


async def test_cancelled_wait_closes_the_connection(serve) -> None:
    request_seen = asyncio.Event()

    async def handler(reader, writer, _):
        await server.read_request(reader)
        request_seen.set()
        await reader.read()  # returns once the client closes
        server.closed_by_client.set()

    server = await serve(handler)
    pool = pool_for(server)
    call = asyncio.create_task(pool.post("/x", b"{}", {}, read=5, deadline=deadline(5)))
    await asyncio.wait_for(request_seen.wait(), 2)
    call.cancel()
    with pytest.raises(asyncio.CancelledError):
        await call
    await asyncio.wait_for(server.closed_by_client.wait(), 2)
    assert pool.idle_count == 0


async def test_oversized_or_invalid_heads_are_refused(serve) -> None:
    async def handler(reader, writer, number):
        await server.read_request(reader)
        if number == 1:
            writer.write(b"HTTP/1.1 200 OK\r\n" + b"X-Big: " + b"y" * 70_000)
        else:
            writer.write(b"NOT HTTP AT ALL\r\n\r\n")
        await writer.drain()
        await reader.read()

    server = await serve(handler)
    pool = pool_for(server)
    with pytest.raises(ConnectionBroken, match="too large"):
        await pool.post("/x", b"{}", {}, read=5, deadline=deadline(5))
    with pytest.raises(ConnectionBroken, match="invalid HTTP response"):
        await pool.post("/x", b"{}", {}, read=5, deadline=deadline(5))


async def test_header_injection_is_refused_before_sending(serve) -> None:
    async def handler(reader, writer, _):
        await server.read_request(reader)

    server = await serve(handler)
    pool = pool_for(server)
    with pytest.raises(ValueError, match="line break"):
        await pool.post("/x", b"{}", {"X-A": "1\r\nX-Injected: 2"}, read=5, deadline=deadline(5))
    assert server.connections == 0


async def test_refused_connection() -> None:
    probe = await asyncio.start_server(lambda r, w: None, "127.0.0.1", 0)
    port = probe.sockets[0].getsockname()[1]
    probe.close()
    await probe.wait_closed()
    pool = ConnectionPool(f"http://127.0.0.1:{port}", connect_timeout=2)
    pool.start(asyncio.get_running_loop())
    with pytest.raises(ConnectFailed) as failed:
        await pool.post("/x", b"{}", {}, read=5, deadline=deadline(5))
    assert isinstance(failed.value.os_error, ConnectionRefusedError)


async def test_finished_reader_keeps_the_connection_for_the_end_of_the_message(serve) -> None:
    # An SSE backend sends [DONE], then (a moment later) the chunked body's end.
    end_of_message = asyncio.Event()

    async def handler(reader, writer, _):
        while True:
            await server.read_request(reader)
            writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
                         b"e\r\ndata: [DONE]\n\n\r\n")
            await writer.drain()
            await end_of_message.wait()
            end_of_message.clear()
            writer.write(b"0\r\n\r\n")
            await writer.drain()

    server = await serve(handler)
    pool = pool_for(server)
    for _ in range(2):
        response = await pool.post("/x", b"{}", {}, read=5, deadline=deadline(5))
        assert await anext(aiter(response)) == b"data: [DONE]\n\n"
        response.release(finished=True)
        assert pool.idle_count == 0  # not before the message ended
        end_of_message.set()
        async with asyncio.timeout(2):
            while not pool.idle_count:  # noqa: ASYNC110 (the pool has no event to await)
                await asyncio.sleep(0.01)
    assert server.connections == 1
    pool.close()


async def test_finished_reader_drops_a_connection_whose_message_never_ends(serve, monkeypatch
                                                                           ) -> None:
    monkeypatch.setattr(http1, "LINGER_S", 0.2)

    async def handler(reader, writer, _):
        await server.read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
                     b"e\r\ndata: [DONE]\n\n\r\n")
        await writer.drain()
        await reader.read()  # returns when the client closes
        server.closed_by_client.set()

    server = await serve(handler)
    pool = pool_for(server)
    response = await pool.post("/x", b"{}", {}, read=5, deadline=deadline(5))
    assert await anext(aiter(response)) == b"data: [DONE]\n\n"
    started = time.monotonic()
    response.release(finished=True)
    await asyncio.wait_for(server.closed_by_client.wait(), 2)
    assert 0.15 <= time.monotonic() - started < 1.5
    assert pool.idle_count == 0


async def test_a_large_whole_body_is_read_without_holding_the_backend_back(serve) -> None:
    # A non-streaming answer bigger than the streaming high-water mark (embeddings
    # of a large batch): read() takes it all, nothing pauses, nothing stalls.
    body = b"e" * (4 * 1024 * 1024)

    async def handler(reader, writer, _):
        await server.read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(body))
        writer.write(body)
        await writer.drain()
        await reader.read()

    server = await serve(handler)
    pool = pool_for(server)
    response = await pool.post("/x", b"{}", {}, read=2, deadline=deadline(5))
    started = time.monotonic()
    assert await response.read() == body
    assert time.monotonic() - started < 1.5  # not a read timeout's worth of stall
    response.release()
    pool.close()
