"""Issue 24 item 17: ``contexts/`` turning read-only under a running daemon (a bind mount of its
own remounted read-only). SIGTERM then ends it with exit 78 and one line, not a traceback and 1;
the next start refuses with exit 78 and one line (not 70 lines of traceback, and without marking
healthy runs failed); once writable again, every acknowledged message is there. ``gateway
stop`` reports that exit status (item 8)."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
from pathlib import Path
from urllib.parse import quote

import aiohttp
import pytest

from home.damage import EXIT_STATE
from tests.faults.state_support import failed_start, one_clear_line
from tests.gateway.daemons import daemon, run_cli

pytestmark = pytest.mark.realtime  # reads the real clock: CI runs it at shifted dates too

KEY = "agent:main:main"


def _sh(*args: str) -> None:
    subprocess.run(args, check=True, capture_output=True)


@pytest.mark.slow
@pytest.mark.timeout(240)
async def test_contexts_turning_read_only_stops_with_78_and_one_line(tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("a read-only bind mount needs root")
    home = tmp_path / "home"
    contexts = home / "contexts"
    home.mkdir()
    # sessions.json is written at shutdown, not a second after the message: the SIGTERM meets it
    (home / "config.yaml").write_text("storage: {sessions_flush_ms: 600000}\n")
    async with daemon(home) as running, aiohttp.ClientSession() as session:
        url = f"{running.url}/v1/sessions/{quote(KEY, safe='')}/messages"
        async with session.post(url, json={"content": "kept"}) as resp:
            assert resp.status == 200
            run_id = (await resp.json())["run_id"]
        try:
            await asyncio.to_thread(_sh, "mount", "--bind", str(contexts), str(contexts))
        except subprocess.CalledProcessError as exc:
            pytest.skip(f"cannot bind-mount here: {exc.stderr!r}")
        try:
            await asyncio.to_thread(_sh, "mount", "-o", "remount,bind,ro", str(contexts))
            async with session.post(url, json={"content": "also kept"}) as resp:  # its run's files are open
                assert resp.status == 200
            stopped = await run_cli("gateway", "stop", "--home", str(home))
            status = await running.wait()
            stderr = running.stderr()
            assert status == EXIT_STATE, stderr
            line = one_clear_line(stderr, "read-only")
            assert str(contexts) in line
            # gateway stop reports the daemon's real exit, not "gateway stopped"
            assert stopped.returncode == 1 and "gateway stopped" not in stopped.stdout, stopped.stdout
            assert f"the gateway (pid {running.pid}) stopped with exit status {EXIT_STATE}" in stopped.stderr

            code, stderr = await failed_start(home)
            assert code == EXIT_STATE
            one_clear_line(stderr, str(contexts), "read-only")
        finally:
            await asyncio.to_thread(subprocess.run, ["umount", str(contexts)], check=False, capture_output=True)

    async with daemon(home) as again, aiohttp.ClientSession() as session:
        async with session.get(f"{again.url}/v1/sessions/{quote(KEY, safe='')}") as resp:
            entry = await resp.json()
        assert await again.stop() == 0
    assert entry["run_id"] == run_id and entry["message_count"] == 2, entry
    stored = (contexts / "running" / run_id / "messages.jsonl").read_text().splitlines()
    assert [json.loads(line)["content"] for line in stored] == ["kept", "also kept"]
