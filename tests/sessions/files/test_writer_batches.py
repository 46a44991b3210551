"""The append writer: one hand-over per loop pass, and a batch touching more files than the
handle cache holds still syncs every one of them (issue 14)."""

from __future__ import annotations

import asyncio
from pathlib import Path

from sessions.files.writer import AppendWriter


async def test_a_loop_pass_is_one_batch_and_every_touched_file_is_synced(tmp_path: Path) -> None:
    writer = AppendWriter("batch", max_open=2)
    writer.start()
    try:
        paths = [tmp_path / f"{i}.jsonl" for i in range(5)]
        futures = [writer.append(path, f'{{"seq": {i}}}\n'.encode(), durable=True) for i, path in enumerate(paths)]
        await asyncio.gather(*futures)
        assert writer.stats.batches == 1  # the five appends of this pass were handed over together
        # Handles beyond max_open are closed only after the batch's sync: a handle closed mid-batch
        # let a new file reuse its descriptor, and the two shared one sync.
        assert writer.stats.syncs == 5
        assert [p.read_text() for p in paths] == [f'{{"seq": {i}}}\n' for i in range(5)]
        await asyncio.gather(*(writer.append(p, b"x\n", durable=True) for p in paths[:1]))
        assert len(writer._handles) <= 2
    finally:
        await writer.close()
