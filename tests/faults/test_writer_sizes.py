"""The append writer keeps each open file's size instead of an ``fstat`` per append (issue 14).
What a failed append cuts back to must still be the file's true size before it: after a ``call``
shrank or grew the file by other means, after a failed append, and when a closed descriptor's
number is reused by another file. The failures are real: a full tmpfs refuses the write."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable
from pathlib import Path

import pytest

from sessions.files.writer import AppendWriter
from tests.faults.conftest import fill

BIG = b'{"content": "' + b"x" * 200_000 + b'"}\n'  # needs fresh pages: refused once the disk is full


def _truncate(path: Path, size: int) -> Callable[[], None]:
    return lambda: os.truncate(path, size)


def _append_elsewhere(path: Path, data: bytes) -> Callable[[], None]:
    def run() -> None:
        with path.open("ab") as handle:
            handle.write(data)

    return run


@pytest.mark.parametrize("how", ["shrunk", "grown"])
async def test_a_failed_append_after_a_call_changed_the_file_cuts_to_its_true_size(tmpfs: Path, how: str) -> None:
    path = tmpfs / "messages.jsonl"
    writer = AppendWriter("batch")
    writer.start()
    try:
        for i in range(3):
            await writer.append(path, f'{{"seq": {i}}}\n'.encode(), durable=True)  # the size is now known
        change = _truncate(path, 11) if how == "shrunk" else _append_elsewhere(path, b'{"seq": "from a call"}\n')
        await writer.call(change)
        expected = path.read_bytes()
        await asyncio.to_thread(fill, tmpfs)
        with pytest.raises(OSError):
            await writer.append(path, BIG, durable=True)
        assert path.read_bytes() == expected  # neither the call's bytes cut nor a partial line left
    finally:
        await writer.close()


async def test_after_a_failed_append_the_next_failure_still_cuts_to_the_true_size(tmpfs: Path) -> None:
    path = tmpfs / "messages.jsonl"
    writer = AppendWriter("batch")
    writer.start()
    try:
        await writer.append(path, b'{"seq": 1}\n', durable=True)
        filler = await asyncio.to_thread(fill, tmpfs)
        with pytest.raises(OSError):
            await writer.append(path, BIG, durable=True)
        assert path.read_bytes() == b'{"seq": 1}\n'
        filler.unlink()
        await writer.append(path, b'{"seq": 2}\n', durable=True)
        await asyncio.to_thread(fill, tmpfs)
        with pytest.raises(OSError):
            await writer.append(path, BIG, durable=True)
        assert path.read_bytes() == b'{"seq": 1}\n{"seq": 2}\n'
    finally:
        await writer.close()


async def test_a_reused_descriptor_does_not_inherit_a_closed_files_size(tmpfs: Path) -> None:
    first, second, third = tmpfs / "a.jsonl", tmpfs / "b.jsonl", tmpfs / "c.jsonl"
    writer = AppendWriter("batch", max_open=1)  # handles beyond one are closed after each batch
    writer.start()
    try:
        await writer.append(first, b'{"seq": 1}\n' * 50, durable=True)
        await writer.append(second, b'{"seq": 1}\n', durable=True)  # a's descriptor closed after this batch
        await writer.append(third, b'{"seq": 1}\n', durable=True)  # so c may be given a's number
        await asyncio.to_thread(fill, tmpfs)
        with pytest.raises(OSError):
            await writer.append(third, BIG, durable=True)
        assert third.read_bytes() == b'{"seq": 1}\n'
        assert first.read_bytes() == b'{"seq": 1}\n' * 50
    finally:
        await writer.close()
