"""SSE cutting at event boundaries: whole events pass at once, partial ones wait."""

from __future__ import annotations

from gateway.upstream.sse import EventBuffer, ends_with_done


def test_whole_events_pass_through_as_they_are() -> None:
    events = EventBuffer()
    chunk = b'data: {"a":1}\n\ndata: {"a":2}\n\n'
    assert events.feed(chunk) is chunk
    assert events.pending == b""


def test_a_partial_event_waits_for_its_end() -> None:
    events = EventBuffer()
    assert events.feed(b'data: {"a":1}\n\ndata: {"a"') == b'data: {"a":1}\n\n'
    assert events.pending == b'data: {"a"'
    assert events.feed(b":2}\n") == b""
    assert events.feed(b"\n") == b'data: {"a":2}\n\n'
    assert events.pending == b""


def test_crlf_boundaries() -> None:
    events = EventBuffer()
    assert events.feed(b"data: x\r\n\r\ndata: y") == b"data: x\r\n\r\n"
    assert events.feed(b"\r\n\r\n") == b"data: y\r\n\r\n"


def test_done_is_recognised_only_as_the_last_event() -> None:
    assert ends_with_done(b"data: x\n\ndata: [DONE]\n\n")
    assert ends_with_done(b"data:[DONE]\r\n\r\n")
    assert ends_with_done(b"data: [DONE]\n\n  \n")
    assert not ends_with_done(b"data: [DONE]\n\ndata: x\n\n")
    assert not ends_with_done(b'data: {"content": "say [DONE] now"}\n\n')
    assert not ends_with_done(b"data: x\n\n")
