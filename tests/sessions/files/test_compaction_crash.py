"""SIGKILL at every step of a compaction commit leaves the old or the new context, never a broken
one, and summaries.jsonl consistent with it after reopening."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import FakeClock
from tests.sessions.helpers import open_store

pytestmark = pytest.mark.realtime  # reads the real clock: CI runs it at shifted dates too

ROOT = Path(__file__).resolve().parents[3]


@pytest.mark.slow
@pytest.mark.parametrize(("point", "committed"), [("saved", False), ("summary", True), ("current_tmp", True),
                                                  ("none", True)])  # fmt: skip
async def test_a_crash_mid_compaction_leaves_a_valid_context(
    tmp_path: Path, clock: FakeClock, point: str, committed: bool
) -> None:
    child = await __import__("asyncio").create_subprocess_exec(
        sys.executable, "-m", "tests.sessions.files.compact_crasher", str(tmp_path), point, cwd=ROOT,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip
    out, err = await child.communicate()
    assert b"filled" in out, err.decode()
    assert (b"completed" in out) == (point == "none")

    store = await open_store(tmp_path, clock)
    try:
        run = store.active_run("agent:main:main")
        assert run is not None
        current = [json.loads(x) for x in (run.dir / "current.jsonl").read_text().splitlines()]
        summaries = [json.loads(x) for x in (run.dir / "summaries.jsonl").read_text().splitlines()] if (
            run.dir / "summaries.jsonl").exists() else []  # fmt: skip
        seqs = [x["seq"] for x in current if x.get("seq") is not None]
        if committed:
            assert len(summaries) == 1 and current[0]["kind"] == "summary"
            assert current[0]["summary_id"] == summaries[0]["id"]
            assert seqs == list(range(summaries[0]["end_seq"] + 1, 31))
            assert run.compaction_count == 1
        else:
            assert summaries == [] and seqs == list(range(1, 31)) and run.compaction_count == 0
        assert run.context_tokens == sum(x["tokens"] for x in current)
        messages = [json.loads(x) for x in (run.dir / "messages.jsonl").read_text().splitlines()]
        assert [m["seq"] for m in messages] == list(range(1, 31))
    finally:
        await store.close()
