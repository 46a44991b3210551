"""bench.workers_ingest's floor (issue 28): the bare echo server, in N processes on one port."""

from __future__ import annotations

import asyncio
import re
import shutil
import signal
import sys
from pathlib import Path

import aiohttp
import pytest

from bench.workers_ingest import REPO, tree

pytestmark = pytest.mark.realtime  # a real server process and its workers


@pytest.mark.slow
@pytest.mark.timeout(120)
async def test_echo_server_workers_share_one_port_and_stop_together() -> None:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "bench.echo_server", "--port", "0", "--workers", "2",
        stdout=asyncio.subprocess.PIPE, cwd=REPO,
    )  # fmt: skip
    try:
        assert proc.stdout is not None
        line = (await asyncio.wait_for(proc.stdout.readline(), 60)).decode()
        match = re.search(r"^listening on http://127\.0\.0\.1:(\d+)$", line.strip())
        assert match, line
        workers = set(tree(proc.pid)) - {proc.pid}
        assert len(workers) == 2
        answered: set[int] = set()
        url = f"http://127.0.0.1:{match.group(1)}/v1/sessions/agent%3Amain%3Ak1/messages"
        # a connection each: the kernel spreads new connections over the listening workers
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True)) as session:
            for n in range(60):
                async with session.post(url, json={"content": f"message {n}"}) as resp:
                    assert resp.status == 200
                    ack = await resp.json()
                assert ack["session_key"] == "agent:main:k1" and ack["length"] == len(f"message {n}")
                answered.add(ack["pid"])
                if answered == workers:
                    break
        assert answered == workers  # both workers serve the one port
        proc.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(proc.wait(), 30) == 0
        assert not [pid for pid in workers if Path(f"/proc/{pid}").exists()]  # the supervisor waited for them
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()


@pytest.mark.slow
@pytest.mark.timeout(120)
@pytest.mark.skipif(shutil.which("wrk") is None, reason="wrk is not installed (make test installs it as root)")
async def test_paced_wrk_sends_about_one_request_per_pause_and_connection() -> None:
    """bench.workers_ingest's paced cases (wrk_post.lua with a pause): each connection waits ``pause_ms``
    before each request, so the load is what was asked for, not what the server takes."""
    from bench.load import wrk_load

    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "bench.echo_server", "--port", "0", stdout=asyncio.subprocess.PIPE, cwd=REPO,
    )  # fmt: skip
    try:
        assert proc.stdout is not None
        line = (await asyncio.wait_for(proc.stdout.readline(), 60)).decode()
        port = int(line.strip().rsplit(":", 1)[1])
        common = {"connections": 2, "keys": 2, "prefix": "agent%3Amain%3Ap", "seconds": 2, "tag": "t"}
        paced = await wrk_load(port, "paced", pause_ms=100, **common)  # type: ignore[arg-type]
        free = await wrk_load(port, "free", **common)  # type: ignore[arg-type]
        # 2 connections x 2 s / (100 ms + a fast answer): about 40
        assert 25 <= paced.ok <= 42 and paced.failed == 0, paced
        assert free.ok > 10 * paced.ok, (free, paced)
    finally:
        proc.send_signal(signal.SIGTERM)
        await asyncio.wait_for(proc.wait(), 30)
