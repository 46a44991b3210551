"""A real process killed with SIGKILL in the middle of acknowledged appends: every acknowledged
message is in the database once, seqs are gapless, the context agrees, and a new process goes on."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

from sessions.records import NewMessage
from tests.conftest import FakeClock
from tests.sessions.postgres.conftest import Opener

pytestmark = pytest.mark.realtime

ROOT = Path(__file__).resolve().parents[3]
ACKS = 1500


def _collect(child: subprocess.Popen[str], wanted: int) -> list[tuple[str, int, str]]:
    assert child.stdout is not None
    assert child.stdout.readline().strip() == "ready"
    acked: list[tuple[str, int, str]] = []
    deadline = time.monotonic() + 60
    while len(acked) < wanted and time.monotonic() < deadline:
        line = child.stdout.readline()
        if line.startswith("ack "):
            _, key, seq, content = line.split()
            acked.append((key, int(seq), content))
    os.kill(child.pid, signal.SIGKILL)
    child.communicate()
    return acked


@pytest.mark.slow
async def test_sigkill_loses_no_committed_append(
    open_store: Opener, pg_dsn: str, tmp_path: Path, clock: FakeClock
) -> None:
    # the fixture emptied the database; the child writes it, this process reads it afterwards
    child = subprocess.Popen(
        [sys.executable, "-m", "tests.sessions.postgres.appender", pg_dsn, "4"],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    acked = await asyncio.to_thread(_collect, child, ACKS)
    assert len(acked) >= ACKS

    store = await open_store()
    for key in {k for k, _, _ in acked}:
        run = store.active_run(key)
        assert run is not None
        stored = await store.read_messages(run.run_id, after_seq=0, limit=100_000)
        seqs = [m["seq"] for m in stored]
        assert seqs == list(range(1, len(seqs) + 1)), "seqs must be gapless from 1"
        assert run.next_seq == len(seqs) + 1 and run.context_lines == len(seqs)
        counts = Counter(m["content"] for m in stored)
        for _, seq, content in (a for a in acked if a[0] == key):
            assert counts[content] == 1, f"{content} stored {counts[content]} times"
            assert stored[seq - 1]["content"] == content
        assert [line["seq"] for line in await store.read_context(run)] == seqs
        assert (await store.append(run, NewMessage(role="user", content="after")))["seq"] == len(seqs) + 1
