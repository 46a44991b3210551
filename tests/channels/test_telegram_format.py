"""Markdown to Telegram HTML: always well-formed (checked with the local Bot API server's own
parser), split under the limit at paragraph boundaries."""

from __future__ import annotations

import html
import random
import re
from pathlib import Path

import pytest

from channels.slack_format import split as slack_split
from channels.telegram_format import TELEGRAM_LIMIT, split, to_html, to_plain, utf16_len
from tests.support.telegram_server import parse_html


@pytest.mark.parametrize(
    ("markdown", "expected"),
    [
        ("plain & <simple>", "plain &amp; &lt;simple&gt;"),
        ("**bold** and __bold__", "<b>bold</b> and <b>bold</b>"),
        ("*it* _it_ snake_case_name 2*3*4", "<i>it</i> <i>it</i> snake_case_name 2*3*4"),
        ("~~gone~~", "<s>gone</s>"),
        ("`a<b> & **c**`", "<code>a&lt;b&gt; &amp; **c**</code>"),
        ("[site](https://e.com/?a=1&b=2)", '<a href="https://e.com/?a=1&amp;b=2">site</a>'),
        ("[bad](javascript:alert(1))", "[bad](javascript:alert(1))"),
        ("# Title", "<b>Title</b>"),
        ("- one\n* two", "• one\n• two"),
        ("> quoted <x>\n> more", "<blockquote>quoted &lt;x&gt;\nmore</blockquote>"),
        ("```py\nif a<b:\n\n    pass\n```", '<pre><code class="language-py">if a&lt;b:\n\n    pass</code></pre>'),
        ("```\nunclosed <fence>", "<pre><code>unclosed &lt;fence&gt;</code></pre>"),
        ("**a *b** c*", "<b>a *b</b> c*"),
        ("[**x**](https://e.com)", "[<b>x</b>](https://e.com)"),
    ],
)
def test_markdown_becomes_telegram_html(markdown: str, expected: str) -> None:
    assert to_html(markdown) == expected
    assert parse_html(to_html(markdown))[1] is None


def test_any_mix_of_markup_characters_renders_html_telegram_accepts() -> None:
    alphabet = ["*", "**", "_", "__", "~~", "`", "```", "[", "]", "(", ")", "https://x.y/", "<", ">", "&", "#", "> ",
                "- ", "\n", "\n\n", " ", "a", "bc", "日本", "😀", '"']  # fmt: skip
    rng = random.Random(27)
    for _ in range(3000):
        text = "".join(rng.choice(alphabet) for _ in range(rng.randint(1, 40)))
        rendered = to_html(text)
        visible, error = parse_html(rendered)
        assert error is None, (text, rendered, error)
        assert visible == to_plain(rendered)


def test_a_long_answer_is_split_under_the_limit_between_paragraphs() -> None:
    paragraphs = [f"Paragraph {i}: " + " ".join(f"word{j}" for j in range(150)) for i in range(12)]
    text = "\n\n".join(paragraphs)
    assert len(text) > 10_000
    parts = split(text)
    assert len(parts) >= 3
    assert all(utf16_len(p) <= TELEGRAM_LIMIT for p in parts)
    assert "\n\n".join(parts) == text  # cut only between paragraphs: nothing lost, nothing added
    for part in parts:
        assert part.startswith("Paragraph ")


def test_a_paragraph_longer_than_the_limit_is_cut_at_lines_then_words_then_anywhere() -> None:
    lines = "\n".join("line " + "x" * 100 for _ in range(100))
    words = " ".join("w" * 50 for _ in range(200))
    blob = "&" * 9000  # escaping makes it five times longer
    for text in (lines, words, blob):
        parts = split(text, 4096)
        assert len(parts) > 1
        for part in parts:
            assert utf16_len(part) <= 4096 and parse_html(part)[1] is None
        assert "".join(to_plain(p) for p in parts).replace("\n", "").replace(" ", "") == text.replace("\n", "").replace(
            " ", ""
        )


def test_a_code_block_with_blank_lines_stays_one_block_when_it_fits() -> None:
    code = "```\n" + "\n\n".join(f"x = {i}" for i in range(50)) + "\n```"
    text = "intro\n\n" + code + "\n\noutro"
    parts = split(text, 600)
    assert any("<pre><code>x = 0\n\nx = 1" in p and "x = 49</code></pre>" in p for p in parts), parts


def test_an_empty_answer_is_one_message_saying_so() -> None:
    assert split("") == ["(empty reply)"]


REAL_CODE = (Path(__file__).parents[2] / "config" / "errors.py").read_text().rstrip("\n")  # **kwargs, <, &, _x_
_PRE = re.compile(r'<pre><code class="language-python">(.*?)</code></pre>', re.DOTALL)


def test_a_code_block_longer_than_a_message_is_closed_and_opened_again_in_each_part() -> None:
    """Before, the parts after the first lost ``<pre>``: the code was rendered as Markdown
    (``**kwargs, **more`` in bold, ``_private_`` in italics) and the closing fence opened an empty block."""
    assert len(REAL_CODE) > 2 * TELEGRAM_LIMIT and "**kwargs" in REAL_CODE
    intro = "Here is **the module, with _its errors_ and `NeotaskError`**:"
    text = f"{intro}\n\n```python\n{REAL_CODE}\n```\n\nThat was *all* of it: see `**kwargs` above."
    parts = split(text)
    assert len(parts) >= 3
    for part in parts:
        visible, error = parse_html(part)
        assert error is None, (part[:80], error)  # every tag balanced, as Telegram checks it
        assert utf16_len(part) <= TELEGRAM_LIMIT and utf16_len(visible) <= TELEGRAM_LIMIT
    assert parts[0].startswith("Here is <b>the module, with <i>its errors</i> and <code>NeotaskError</code></b>:")
    assert parts[-1].endswith("That was <i>all</i> of it: see <code>**kwargs</code> above.")
    blocks = [found for part in parts if (found := _PRE.findall(part))]
    assert len(blocks) >= 3 and all(len(found) == 1 for found in blocks), "a part holds one piece of the code"
    assert "\n".join(html.unescape(found[0]) for found in blocks) == REAL_CODE  # cut between lines, nothing lost
    outside = [_PRE.sub("", part) for part in parts]
    assert not any("def " in rest or "kwargs)" in rest for rest in outside)  # no code outside a code block


def test_a_code_line_longer_than_a_message_is_cut_inside_its_block() -> None:
    line = "{" + ", ".join(f'"key_{i}": "<v&{i}>"' for i in range(600)) + "}"  # minified JSON, no line break
    parts = split(f"```python\n{line}\n```", 1000)
    assert len(parts) > 3
    for part in parts:
        assert parse_html(part)[1] is None and utf16_len(part) <= 1000
    assert "".join(html.unescape(_PRE.findall(part)[0]) for part in parts) == line  # every character kept


def test_any_mix_of_fences_and_markup_splits_into_parts_telegram_accepts() -> None:
    alphabet = ["*", "**", "_", "`", "\n```py\n", "\n```\n", "\n", "\n\n", " ", "a", "bc", "日本", "😀", "&", "<",
                "**kwargs", "x" * 30]  # fmt: skip
    rng = random.Random(40)
    for _ in range(600):
        text = "".join(rng.choice(alphabet) for _ in range(rng.randint(1, 120)))
        limit = rng.choice([60, 100, 200])
        for part in split(text, limit):
            assert parse_html(part)[1] is None and utf16_len(part) <= limit, (text, limit, part)


def test_slack_parts_of_a_long_code_block_each_hold_a_whole_code_block() -> None:
    text = f"Look:\n\n```python\n{REAL_CODE}\n```\n\n**Done**, no `**kwargs` left."
    parts = slack_split(text)
    assert len(parts) >= 3 and all(len(part) <= 4000 for part in parts)
    code: list[str] = []
    for part in parts:
        found = re.findall(r"^```\n(.*?)\n```$", part, re.DOTALL | re.MULTILINE)
        assert len(found) == 1 and part.count("```") == 2, part[:80]
        code.append(found[0])
    assert "\n".join(code) == REAL_CODE.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
    assert parts[-1].endswith("*Done*, no `**kwargs` left.")
