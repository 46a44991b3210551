"""Chunking: a pure function, checked with tables and hypothesis properties."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from memory.chunking import chunk_markdown, cut_line, estimate_tokens, file_date, paragraph_blocks, turn_lines


@pytest.mark.parametrize(
    ("text", "tokens"),
    [("", 0), ("a", 1), ("abcd" * 10, 10), ("こんにちは世界", 3), ("日本語 text", 2), ("abc", 1)],
)
def test_estimate_tokens_follows_spec_section_4(text: str, tokens: int) -> None:
    assert estimate_tokens(text) == tokens


def test_headings_and_paragraphs_are_boundaries() -> None:
    text = "# Title\n\nIntro para.\n\n## Work\nLine one\nLine two\n\nSecond para\n\n## Home\nTea.\n"
    chunks = chunk_markdown("MEMORY.md", text)
    assert [(c.start_line, c.end_line, c.heading) for c in chunks] == [
        (1, 4, "Title"),
        (5, 8, "Title > Work"),
        (9, 10, "Title > Work"),
        (11, 12, "Title > Home"),
    ]
    assert chunks[1].text == "## Work\nLine one\nLine two\n"
    assert chunks[1].embed_text.startswith("Title > Work\n\n")


def test_fenced_code_is_one_block() -> None:
    text = "intro\n\n```\n# not a heading\n\nstill code\n```\n\nafter\n"
    chunks = chunk_markdown("memory/a.md", text)
    assert [(c.start_line, c.end_line) for c in chunks] == [(1, 2), (3, 8), (9, 9)]
    assert all(c.heading == "" for c in chunks)


def test_big_paragraph_is_windowed_with_overlap() -> None:
    lines = [f"line {i} " + "word " * 15 for i in range(40)]  # ~21 tokens a line
    chunks = chunk_markdown("memory/big.md", "\n".join(lines), chunk_tokens=100, overlap_tokens=30)
    assert len(chunks) > 5
    for a, b in itertools.pairwise(chunks):
        assert b.start_line <= a.end_line  # overlapping windows
        assert b.start_line > a.start_line  # always progressing
    assert all(estimate_tokens(c.text) <= 100 for c in chunks)


def test_one_huge_line_is_cut_by_characters() -> None:
    text = "x" * 5000
    chunks = chunk_markdown("memory/x.md", text, chunk_tokens=200)
    assert len(chunks) > 1
    assert "".join(c.text for c in chunks) == text
    assert all((c.start_line, c.end_line) == (1, 1) for c in chunks)


def test_model_input_limit_is_never_exceeded() -> None:
    text = "東京の歯医者の予約は火曜日の午後三時です。" * 30  # 630 chars, ~315 estimated tokens
    chunks = chunk_markdown(
        "memory/ja.md", text, chunk_tokens=400, overlap_tokens=40, max_input_tokens=128, count_model_tokens=len
    )
    assert len(chunks) >= 5
    assert all(len(c.embed_text) <= 128 for c in chunks)


def test_blank_document_has_no_chunks() -> None:
    assert chunk_markdown("MEMORY.md", "\n\n  \n") == []
    assert chunk_markdown("MEMORY.md", "") == []


# --- properties ----------------------------------------------------------------------------------

_WORDS = ["alpha", "beta", "gamma", "delta", "tea", "budget", "東京", "予約", "会議", "x" * 30, "1234"]
_word = st.sampled_from(_WORDS)
_line = st.lists(_word, min_size=1, max_size=14).map(" ".join)
_para = st.lists(_line, min_size=1, max_size=12).map(lambda ls: "\n".join(ls))
_heading = st.tuples(st.integers(1, 3), st.lists(_word, min_size=1, max_size=3)).map(
    lambda t: "#" * t[0] + " " + " ".join(t[1])
)
_block = st.one_of(_para, _para, _heading, st.tuples(_heading, _para).map("\n".join))
_doc = st.lists(_block, min_size=1, max_size=12).map(lambda bs: "\n\n".join(bs) + "\n")
_sizes = st.sampled_from([(16, 4), (40, 10), (200, 40)])


def _lines(text: str) -> list[str]:
    lines = text.split("\n")
    return lines[:-1] if lines[-1] == "" else lines


@settings(max_examples=80, deadline=None)
@given(doc=_doc, sizes=_sizes)
def test_every_line_is_covered_and_sizes_are_respected(doc: str, sizes: tuple[int, int]) -> None:
    chunk_tokens, overlap = sizes
    chunks = chunk_markdown("memory/p.md", doc, chunk_tokens=chunk_tokens, overlap_tokens=overlap)
    lines = _lines(doc)
    covered = set()
    for c in chunks:
        assert 1 <= c.start_line <= c.end_line <= len(lines)
        covered.update(range(c.start_line, c.end_line + 1))
        assert estimate_tokens(c.text) <= chunk_tokens
        if c.text in "\n".join(lines[c.start_line - 1 : c.end_line]):
            continue
        pytest.fail(f"chunk text is not the text of its lines: {c}")
    assert covered == set(range(1, len(lines) + 1))


@settings(max_examples=40, deadline=None)
@given(doc=_doc, sizes=_sizes)
def test_same_text_gives_same_chunks(doc: str, sizes: tuple[int, int]) -> None:
    a = chunk_markdown("memory/p.md", doc, chunk_tokens=sizes[0], overlap_tokens=sizes[1])
    b = chunk_markdown("memory/p.md", doc, chunk_tokens=sizes[0], overlap_tokens=sizes[1])
    assert a == b


@settings(max_examples=80, deadline=None)
@given(doc=_doc, sizes=_sizes, data=st.data())
def test_an_edit_inside_a_paragraph_changes_only_its_chunks(
    doc: str, sizes: tuple[int, int], data: st.DataObject
) -> None:
    lines = _lines(doc)
    blocks = [
        b
        for b in paragraph_blocks(lines)
        if any(lines[i] and not lines[i].startswith("#") for i in range(b.start, b.end))
    ]
    assume(blocks)
    block = data.draw(st.sampled_from(blocks))
    editable = [i for i in range(block.start, block.end) if lines[i] and not lines[i].startswith("#")]
    i = data.draw(st.sampled_from(editable))
    new_line = data.draw(_line.filter(lambda s: s != lines[i]))
    edited = [*lines[:i], new_line, *lines[i + 1 :]]
    kw = {"chunk_tokens": sizes[0], "overlap_tokens": sizes[1]}
    before = chunk_markdown("memory/p.md", "\n".join(lines) + "\n", **kw)
    after = chunk_markdown("memory/p.md", "\n".join(edited) + "\n", **kw)
    lo, hi = block.start + 1, block.end  # 1-based inclusive range of the edited paragraph
    outside_before = [c for c in before if c.end_line < lo or c.start_line > hi]
    outside_after = [c for c in after if c.end_line < lo or c.start_line > hi]
    assert outside_after == outside_before
    assert all(lo <= c.start_line and c.end_line <= hi for c in after if c not in outside_after)


# --- word boundaries and conversation context ------------------------------------------------------


def test_a_long_line_is_cut_between_sentences_then_words() -> None:
    line = "I ran a charity race for mental health last Saturday with my sister. " * 12 + "Word " * 80
    chunks = chunk_markdown("memory/long.md", line, chunk_tokens=40, overlap_tokens=0)
    assert len(chunks) > 5
    assert "".join(c.text for c in chunks) == line
    for a, b in itertools.pairwise(chunks):
        assert a.text[-1:].isspace() or not b.text[:1].isalnum() or not a.text[-1:].isalnum(), (a.text, b.text)
    sentences = [c for c in chunks if "charity" in c.text]
    assert all(c.text.rstrip().endswith(".") for c in sentences[:-1])


def test_cut_line_keeps_words_whole_with_a_model_limit() -> None:
    text = " ".join(f"word{i}" for i in range(300))
    pieces = cut_line(text, lambda s: len(s) <= 50)
    assert "".join(pieces) == text and all(len(p) <= 50 for p in pieces)
    assert all(p.split() and all(w.startswith("word") and w[4:].isdigit() for w in p.split()) for p in pieces)
    words = [w for p in pieces for w in p.split()]
    assert words == text.split()


TRANSCRIPT = """# Caroline and Melanie, 8 May 2023

Melanie: Hey! How was the street festival?

Caroline: So much fun. I went with my little sister Lena.

Melanie: Aww, I love that.

Caroline: We ate way too much though.
"""


def test_a_transcript_turn_carries_the_turn_before_and_the_date() -> None:
    chunks = chunk_markdown("memory/chats/caroline/2023-05-08.md", TRANSCRIPT)
    reply = next(c for c in chunks if "sister Lena" in c.text)
    assert reply.text == "Caroline: So much fun. I went with my little sister Lena.\n"  # shown once
    assert reply.context == "8 May 2023 (Monday)\nMelanie: Hey! How was the street festival?"
    assert reply.embed_text.startswith("Caroline and Melanie, 8 May 2023\n8 May 2023 (Monday)\nMelanie: Hey!")
    assert reply.embed_text.endswith(reply.text)
    first = chunks[0]
    assert "Melanie: Hey!" not in first.context  # nothing before the first turn


def test_timestamped_lines_are_turns_and_carry_the_line_before() -> None:
    text = "\n".join(
        [
            "[10:01] Tom: did you book the table?",
            "[10:02] Ann: yes, Tuesday at 3",
            "[10:03] Tom: great",
            "[10:04] Ann: see you then",
            "[10:05] Tom: bye",
        ]
    )
    chunks = chunk_markdown("notes/chat.md", text, chunk_tokens=12, overlap_tokens=0)
    yes = next(c for c in chunks if c.text.startswith("[10:02]"))
    assert yes.context == "[10:01] Tom: did you book the table?"
    assert turn_lines(text.split("\n")) == [0, 1, 2, 3, 4]


def test_notes_are_not_transcripts_and_a_daily_log_carries_its_date() -> None:
    notes = "# Garden\n\nPlant tomatoes in May.\n\nNote: water daily.\n\nThe basil went to seed.\n"
    assert turn_lines(notes.split("\n")) is None
    assert [c.context for c in chunk_markdown("memory/projects/garden.md", notes)] == ["", "", ""]
    daily = chunk_markdown("memory/2026-11-30.md", "- Booked the dentist for Tuesday.\n")
    assert daily[0].context == "30 November 2026 (Monday)"
    assert file_date("memory/2026-02-30.md") == ""


def test_editing_a_turn_changes_only_it_and_the_turn_after() -> None:
    before = {c.start_line: c.content_hash for c in chunk_markdown("memory/c/2023-05-08.md", TRANSCRIPT)}
    edited = TRANSCRIPT.replace("street festival", "food market")
    after = {c.start_line: c.content_hash for c in chunk_markdown("memory/c/2023-05-08.md", edited)}
    assert sorted(k for k in before if before[k] != after[k]) == [1, 5]


def test_a_title_with_nothing_but_its_sections_under_it_joins_the_first_section() -> None:
    """``# About the user`` alone is a chunk of three words, which a retrieval model places near any
    question: it is cut with the section right under it, whose heading carries it anyway."""
    doc = "# About the user\n\n## Preferences\nGenmaicha at 80 degrees.\n\n## Work\nThe billing service.\n"
    chunks = chunk_markdown("MEMORY.md", doc)
    assert [(c.start_line, c.end_line, c.heading) for c in chunks] == [
        (1, 5, "About the user > Preferences"),
        (6, 7, "About the user > Work"),
    ]
    assert chunks[0].text.startswith("# About the user\n\n## Preferences\n")
    # a title with no section under it, and a title before a sibling, stay chunks of their own
    assert [c.text for c in chunk_markdown("a.md", "# Todo\n")] == ["# Todo"]
    assert [c.heading for c in chunk_markdown("a.md", "# A\n\n# B\ntext\n")] == ["A", "B"]
