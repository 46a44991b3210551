"""Real processes: SIGKILL in the middle of acknowledged appends, and the single-instance lock."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

from home.lock import EXIT_LOCKED
from tests.conftest import FakeClock
from tests.sessions.helpers import open_store

pytestmark = pytest.mark.realtime  # reads the real clock: CI runs it at shifted dates too

ROOT = Path(__file__).resolve().parents[3]


def spawn(home: Path, writers: int = 4) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "tests.sessions.files.appender", str(home), str(writers)],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


@pytest.mark.slow
@pytest.mark.allow_blocking
async def test_sigkill_loses_no_acknowledged_append(tmp_path: Path, clock: FakeClock) -> None:
    child = spawn(tmp_path)
    assert child.stdout is not None
    assert child.stdout.readline().strip() == "ready"
    acked: list[tuple[str, int, str]] = []
    deadline = time.monotonic() + 60
    while len(acked) < 2000 and time.monotonic() < deadline:
        line = child.stdout.readline()
        if line.startswith("ack "):
            _, key, seq, content = line.split()
            acked.append((key, int(seq), content))
    os.kill(child.pid, signal.SIGKILL)
    child.communicate()
    assert len(acked) >= 2000

    store = await open_store(tmp_path, clock)
    try:
        for key in {k for k, _, _ in acked}:
            run = store.active_run(key)
            assert run is not None
            stored = [json.loads(x) for x in (run.dir / "messages.jsonl").read_text().splitlines()]
            seqs = [m["seq"] for m in stored]
            assert seqs == list(range(1, len(seqs) + 1)), "seqs must be gapless from 1"
            counts = Counter(m["content"] for m in stored)
            for _, seq, content in (a for a in acked if a[0] == key):
                assert counts[content] == 1, f"{content} stored {counts[content]} times"
                assert stored[seq - 1]["content"] == content
            current = [json.loads(x) for x in (run.dir / "current.jsonl").read_text().splitlines()]
            assert [c["seq"] for c in current] == seqs, "current.jsonl is brought level"
    finally:
        await store.close()


@pytest.mark.slow
@pytest.mark.allow_blocking
def test_a_second_process_on_the_same_home_is_refused(tmp_path: Path) -> None:
    first = spawn(tmp_path, writers=1)
    try:
        assert first.stdout is not None and first.stdout.readline().strip() == "ready"
        second = spawn(tmp_path, writers=1)
        _, err = second.communicate(timeout=60)
        assert second.returncode == EXIT_LOCKED
        assert f"gateway already running (pid {first.pid}" in err
    finally:
        first.kill()
        first.communicate()
