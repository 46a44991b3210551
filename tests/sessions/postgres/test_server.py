"""The test server itself: a real PostgreSQL, reachable over TCP and over its unix socket."""

from __future__ import annotations

import os
import subprocess
import tempfile
from pathlib import Path

import asyncpg
import pytest

from tests.support.postgres import OWNER_FILE, PREFIX, PgServer, find_binaries, reap_orphans

pytestmark = pytest.mark.realtime  # real processes


async def test_the_server_answers_over_tcp_and_its_socket(postgres_server: PgServer) -> None:
    conn = await asyncpg.connect(postgres_server.dsn())
    try:
        assert int(await conn.fetchval("SHOW server_version_num")) >= 150000
        assert await conn.fetchval("SHOW server_encoding") == "UTF8"
    finally:
        await conn.close()
    conn = await asyncpg.connect(host=str(postgres_server.socket_dir), port=postgres_server.port, user="postgres")
    try:
        assert await conn.fetchval("SELECT 1") == 1
    finally:
        await conn.close()


def test_clusters_of_dead_test_processes_are_reaped(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A pytest killed by a timeout leaves its postmaster running; the next start stops and
    removes it. A cluster whose owner lives (another xdist worker, another run) is left alone."""
    monkeypatch.setattr(tempfile, "gettempdir", lambda: str(tmp_path))
    dead = _dead_pid()
    orphan, alive = tmp_path / f"{PREFIX}orphan", tmp_path / f"{PREFIX}alive"
    for root, owner in ((orphan, dead), (alive, os.getpid())):
        (root / "data").mkdir(parents=True)
        (root / OWNER_FILE).write_text(str(owner))
    bindir = find_binaries()
    if bindir is None:
        pytest.skip("PostgreSQL binaries not found")
    reap_orphans(bindir)
    assert not orphan.exists() and alive.exists()


def _dead_pid() -> int:
    child = subprocess.Popen(["true"])
    child.wait()
    return child.pid
