"""``parse_command`` skips its parse for a text whose first non-space character is ASCII and not
``/`` (NFKC keeps such a character first): it answers what the full parse answers."""

from __future__ import annotations

import re
import unicodedata

from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.commands import parse_command

_NAME = re.compile(r"^/([^\W\d_][\w-]*)$")


def full_parse(text: str) -> tuple[str, str] | None:
    parts = text.strip().split(maxsplit=1)
    if not parts:
        return None
    match = _NAME.match(unicodedata.normalize("NFKC", parts[0]))
    if match is None:
        return None
    return match.group(1).casefold(), (parts[1] if len(parts) > 1 else "").strip()


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
def test_the_shortcut_answers_as_the_full_parse(text: str) -> None:
    assert parse_command(text) == full_parse(text)


def test_examples() -> None:
    assert parse_command("/status") == ("status", "")
    assert parse_command("\uff0fstatus now") == ("status", "now")
    assert parse_command("  hello /status") is None
    assert parse_command("/path/to/file") is None
