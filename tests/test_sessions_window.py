"""The forwarded prompt: stored history trimmed to the window, system message always kept."""

from __future__ import annotations

from gateway.sessions.state import HistoryLimits, Turn, apply_turn
from gateway.sessions.window import Window, build_prompt, estimate_tokens

SYSTEM = {"role": "system", "content": "You are terse."}


def history(turns: int, *, words: int = 1) -> list[dict]:
    messages = [SYSTEM]
    for n in range(turns):
        messages += [{"role": "user", "content": f"q{n} " + "w " * words},
                     {"role": "assistant", "content": f"a{n} " + "w " * words}]
    return messages


def contents(messages: list[dict]) -> list[str]:
    return [m["content"].split()[0] for m in messages]


def test_everything_fits_so_nothing_is_cut() -> None:
    new = [{"role": "user", "content": "next"}]
    assert build_prompt(history(2), new, Window()) == [*history(2), *new]


def test_trimming_by_count_keeps_the_system_message_and_the_newest() -> None:
    prompt = build_prompt(history(10), [{"role": "user", "content": "next"}],
                          Window(max_messages=6, max_tokens=100_000))
    assert len(prompt) <= 6
    assert prompt[0] == SYSTEM
    assert contents(prompt) == ["You", "q8", "a8", "q9", "a9", "next"]


def test_trimming_by_tokens_keeps_the_system_message_and_the_newest() -> None:
    long = history(10, words=100)  # about 55 tokens per message
    new = [{"role": "user", "content": "next"}]
    prompt = build_prompt(long, new, Window(max_messages=1_000, max_tokens=300))
    assert prompt[0] == SYSTEM and prompt[-1] == new[0]
    assert sum(estimate_tokens(m) for m in prompt) <= 300
    assert contents(prompt)[1:] == ["q8", "a8", "q9", "a9", "next"]


def test_history_never_starts_with_an_orphan_reply() -> None:
    # room for three history messages: a8 q9 a9 would start with an assistant reply
    prompt = build_prompt(history(10), [{"role": "user", "content": "next"}],
                          Window(max_messages=5, max_tokens=100_000))
    assert contents(prompt) == ["You", "q9", "a9", "next"]


def test_the_request_system_message_replaces_the_stored_one() -> None:
    mine = {"role": "system", "content": "Answer in French."}
    prompt = build_prompt(history(2), [mine, {"role": "user", "content": "next"}], Window())
    assert prompt[0] == mine
    assert [m for m in prompt if m["role"] == "system"] == [mine]


def test_the_request_itself_is_never_cut_even_beyond_the_window() -> None:
    new = [{"role": "user", "content": "x " * 4_000}]
    prompt = build_prompt(history(3), new, Window(max_messages=2, max_tokens=10))
    assert prompt == [SYSTEM, *new]


def test_a_session_without_system_message_gets_none() -> None:
    prompt = build_prompt(history(1)[1:], [{"role": "user", "content": "n"}], Window())
    assert [m["role"] for m in prompt] == ["user", "assistant", "user"]


def test_stored_history_is_compacted_and_the_system_message_survives() -> None:
    state = None
    limits = HistoryLimits(max_stored_messages=6, idempotency_window=3)
    for n in range(10):
        turn = Turn(f"r{n}", ({"role": "user", "content": f"q{n}"},
                              {"role": "assistant", "content": f"a{n}"}),
                    SYSTEM if n == 0 else None, ts_ms=n)
        state = apply_turn(state, turn, "t", "s", limits) or state
    assert state is not None
    assert state.messages[0] == SYSTEM
    assert contents(list(state.messages)) == ["You", "q7", "a7", "q8", "a8", "q9", "a9"]
    assert (state.turns, state.version, state.recent_turn_ids) == (10, 10, ("r7", "r8", "r9"))


def test_token_estimate_counts_text_parts_and_tool_calls() -> None:
    assert estimate_tokens({"role": "user", "content": "abcd" * 10}) == 4 + 10
    assert estimate_tokens({"role": "assistant", "content": None}) == 4
    parts = {"role": "user", "content": [{"type": "text", "text": "hello"}]}
    assert estimate_tokens(parts) > 4
    call = {"role": "assistant", "content": None, "tool_calls": [{"id": "c", "function": {}}]}
    assert estimate_tokens(call) > 4
