"""``parse_command`` skips its parse for a text whose first non-space character is ASCII and not
``/`` (NFKC keeps such a character first): it answers what the full parse answers."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from config.chat_commands import parse_command, parse_command_fully

SAMPLES = st.sampled_from(
    [
        " ",
        "\u3000",
        "/",
        "\uff0f",
        "s",
        "S",
        "\u017f",
        "t",
        "1",
        "-",
        "\u0301",
        "\u0338",
        "x",
        "\u2044",
        "\u00a0",
        "\n",
        "é",
        "\uff53",
        "\uff54",
        "a",
        "\u200b",
    ]
)


@settings(max_examples=4000)
@given(st.lists(SAMPLES, max_size=8).map("".join) | st.text(max_size=12))
def test_the_shortcut_answers_as_the_parse_command_fully(text: str) -> None:
    assert parse_command(text) == parse_command_fully(text)


def test_examples() -> None:
    assert parse_command("/status") == ("status", "")
    assert parse_command("\uff0fstatus now") == ("status", "now")
    assert parse_command("  hello /status") is None
    assert parse_command("/path/to/file") is None
