"""The log tail behind the console's live log page, and the secrets masked in the effective
config it shows (issue 29 item 6)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from gateway.log_tail import read_tail
from gateway.masking import mask_secrets, mask_url


def test_the_last_lines_then_only_whole_lines_written_since(tmp_path: Path) -> None:
    log = tmp_path / "gateway.log"
    log.write_text("".join(f"line {i}\n" for i in range(1000)))
    first = read_tail(log, lines=3)
    assert first.lines == ["line 997", "line 998", "line 999"] and first.offset == log.stat().st_size
    with log.open("a") as f:
        f.write("line 1000\nhalf a li")
    second = read_tail(log, lines=3, after=first.offset, inode=first.inode)
    assert second.lines == ["line 1000"] and not second.rotated  # the half line waits
    with log.open("a") as f:
        f.write("ne\n")
    third = read_tail(log, lines=3, after=second.offset, inode=second.inode)
    assert third.lines == ["half a line"]
    assert read_tail(log, lines=3, after=third.offset, inode=third.inode).lines == []


def test_a_rotated_log_is_read_from_its_start(tmp_path: Path) -> None:
    log = tmp_path / "gateway.log"
    log.write_text("old 1\nold 2\nold 3\n")
    seen = read_tail(log, lines=10)
    os.rename(log, tmp_path / "gateway.log.1")
    log.write_text("new 1\nnew 2\nnew 3\nnew 4\n")  # longer than the old: only the inode tells
    after = read_tail(log, lines=10, after=seen.offset, inode=seen.inode)
    assert after.rotated and after.lines == ["new 1", "new 2", "new 3", "new 4"]
    log.write_text("x\n")  # truncated: shorter than the offset
    assert read_tail(log, lines=10, after=after.offset).rotated


def test_no_log_yet_is_no_lines(tmp_path: Path) -> None:
    assert read_tail(tmp_path / "gateway.log", lines=5).lines == []


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        (
            "https://bot:hunter2@hooks.example.com/x?api_key=SEKRIT&team=ops",
            "https://bot:***@hooks.example.com/x?api_key=***&team=ops",
        ),
        ("http://127.0.0.1:11434/v1", "http://127.0.0.1:11434/v1"),
        ("postgresql://neo:pw@db/neotask", "postgresql://neo:***@db/neotask"),
        ("https://example.com/hook?token=abc&sig=def", "https://example.com/hook?token=***&sig=***"),
        ("not a url: user:pw@host", "not a url: user:pw@host"),
    ],
)
def test_urls_lose_their_secrets(url: str, shown: str) -> None:
    assert mask_url(url) == shown


def test_mask_secrets_walks_the_settings() -> None:
    data = {"cron": {"jobs": [{"deliver_to": "https://u:p@h/x"}]}, "port": 8787, "name": "gpt"}
    assert mask_secrets(data) == {"cron": {"jobs": [{"deliver_to": "https://u:***@h/x"}]}, "port": 8787, "name": "gpt"}
