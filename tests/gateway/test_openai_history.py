"""What of a resent conversation is new: the pure decision of gateway/openai_compat/history.py."""

from __future__ import annotations

import pytest

from gateway.openai_compat.history import (
    ChatMessage,
    Known,
    Record,
    after_answer,
    after_request,
    chain,
    digests,
    input_ids,
    plan,
)


def user(text: str) -> ChatMessage:
    return ChatMessage("user", text)


def bot(text: str) -> ChatMessage:
    return ChatMessage("assistant", text)


def answered(messages: list[ChatMessage], reply: ChatMessage, record: Record | None = None) -> Record:
    """The record after a call with ``messages`` was answered with ``reply``."""
    return after_answer(after_request(plan(messages, record), len(messages)), reply)


def test_a_first_call_stores_everything() -> None:
    p = plan([user("a"), bot("b"), user("c")], None)
    assert (p.kind, p.start, p.new_run) == ("fresh", 0, False)


def test_a_resent_history_continues_after_the_answer() -> None:
    first = [user("hi")]
    record = answered(first, bot("hello"))
    second = [*first, bot("hello"), user("how are you")]
    p = plan(second, record)
    assert (p.kind, p.start) == ("continue", 2)
    record = answered(second, bot("fine"), record)
    third = [*second, bot("fine"), user("bye"), user("really")]
    assert (plan(third, record).kind, plan(third, record).start) == ("continue", 4)


def test_the_same_request_again_is_a_retry_with_the_same_message_ids() -> None:
    first = [user("hi")]
    record = answered(first, bot("hello"))
    second = [user("hi"), bot("hello"), user("next")]
    p = plan(second, record)
    record = answered(second, bot("ok"), record)
    again = plan(second, record)
    assert (again.kind, again.start) == ("retry", 2)
    assert again.client_message_id(2) == p.client_message_id(2)


@pytest.mark.parametrize(
    "history",
    [
        [user("EDITED"), bot("hello"), user("next")],  # an earlier message edited
        [user("hi"), bot("a different answer"), user("next")],  # our answer altered
        [user("other chat"), bot("x"), user("y")],  # another conversation of the same user
    ],
)
def test_a_diverging_history_needs_a_new_run_with_new_message_ids(history: list[ChatMessage]) -> None:
    record = answered([user("hi")], bot("hello"))
    p = plan(history, record)
    assert (p.kind, p.start, p.new_run) == ("diverged", 0, True)
    assert p.epoch == record.epoch + 1
    assert p.client_message_id(0) != plan([user("hi")], None).client_message_id(0)


def test_a_client_that_sends_only_the_new_message_is_never_diverged() -> None:
    record = answered([user("hi")], bot("hello"))
    p = plan([user("hi")], answered([user("x")], bot("y"), record))
    assert (p.kind, p.start, p.new_run) == ("fresh", 0, False)
    assert p.client_message_id(0) != plan([user("hi")], None).client_message_id(0)


def test_whitespace_around_text_does_not_diverge_and_tool_calls_count() -> None:
    call = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
    record = answered([user("hi")], ChatMessage("assistant", "", tool_calls=(call,)))
    resent = [
        user("hi "),
        ChatMessage("assistant", "", tool_calls=(call,)),
        ChatMessage("tool", "42", tool_call_id="c1"),
    ]
    assert plan(resent, record).kind == "continue"
    other = {**call, "function": {"name": "f", "arguments": '{"x": 1}'}}
    changed = [
        user("hi"),
        ChatMessage("assistant", "", tool_calls=(other,)),
        ChatMessage("tool", "42", tool_call_id="c1"),
    ]
    assert plan(changed, record).kind == "diverged"


def test_known_digests_are_reused_only_for_the_equal_prefix() -> None:
    """A key's last conversation in memory gives the digests of the equal prefix; the rest is
    hashed. Whatever it holds, the plan is the one computed from scratch."""
    first = [user("hi"), bot("hello"), user("how are you")]
    known = Known(tuple(first), digests(first)).extended(bot("fine"), chain(digests(first)[-1], bot("fine")))
    resent = [*first, bot("fine"), user("bye")]
    assert digests(resent, known) == digests(resent)
    edited = [user("hi"), bot("HELLO"), user("how are you"), bot("fine"), user("bye")]
    assert digests(edited, known) == digests(edited) != digests(resent)
    shorter = [user("hi")]
    assert digests(shorter, known) == digests(shorter)
    record = answered(first, bot("fine"))
    for messages in (resent, edited, shorter, [*first, bot("other"), user("x")]):
        assert plan(messages, record, known) == plan(messages, record)


def test_responses_input_ids_follow_the_response_they_continue() -> None:
    items = [user("a"), user("b")]
    ids = input_ids("resp_1", items)
    assert ids == input_ids("resp_1", [user("a"), user("b")]) and len(set(ids)) == 2
    assert ids[0] not in input_ids("resp_2", items)
    assert ids[1] not in input_ids("resp_1", [user("a"), user("c")])
    assert input_ids(None, items) == [None, None]
