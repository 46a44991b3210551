"""Backups of a PostgreSQL deployment (issue 28 item 5): ``POST /v1/admin/backup`` on a gateway
whose store is PostgreSQL, and ``neotask backup`` without a daemon, write the files home's archive
format from one REPEATABLE READ snapshot of the database: it verifies, ``neotask restore --home``
gives a files home holding every run, message, record, usage row and tombstone the database held
(compared through the copy's own dump and checksums), and ``restore --to postgres://…`` puts them
into an empty database that compares equal to the original."""

from __future__ import annotations

import asyncio
import json
import tarfile
from pathlib import Path
from typing import Any
from urllib.parse import quote

import asyncpg
import pytest
import yaml

from config.clock import system_clock
from sessions.copy_snapshot import differences
from sessions.copying import FilesEnd, PostgresEnd, copy, dump
from sessions.files import bulk as files_bulk
from tests.gateway.daemons import child_env, run_cli
from tests.gateway.helpers import make_app
from tests.gateway.test_storage_copy import KEYS, PURGED, _seed
from tests.support.postgres import DATABASE, PgServer, empty_database

pytestmark = [pytest.mark.realtime]


def _manifest(archive: Path) -> dict[str, Any]:
    with tarfile.open(archive, "r:gz") as tar:
        handle = tar.extractfile("manifest.json")
        assert handle is not None
        return dict(json.load(handle))


async def test_a_backup_of_postgres_restores_as_a_files_home_and_into_a_database(
    postgres_server: PgServer, tmp_path: Path
) -> None:
    dsn = await postgres_server.database(DATABASE)
    await empty_database(dsn)
    second = await postgres_server.database("restored")
    await empty_database(second)
    await _seed(tmp_path / "seed")
    await copy(FilesEnd(tmp_path / "seed"), PostgresEnd(dsn))
    held = await dump(PostgresEnd(dsn))
    assert held.usage and held.tombstones and len(held.runs) == 3

    home = tmp_path / "pghome"
    home.mkdir()
    config = tmp_path / "pg.yaml"
    config.write_text(yaml.safe_dump({"storage": {"backend": "postgres", "postgres": {"dsn": dsn, "pool_size": 2}}}))
    archive = tmp_path / "pg-backup.tar.gz"
    taken = await run_cli("backup", "-o", str(archive), "--home", str(home), "--config", str(config), "--json",
                          env=child_env())  # fmt: skip
    assert taken.returncode == 0, taken.stderr
    summary = json.loads(taken.stdout)
    assert summary["counts"]["runs"] == 2 and summary["counts"]["archives"] == 1  # two active, one archived
    assert sorted(summary["point"]["runs"]) == sorted(r.run_id for r in held.runs if r.row["status"] == "running")
    assert _manifest(archive)["backend"] == "postgres"
    verified = await run_cli("backup", "verify", str(archive), "--home", str(home), env=child_env())
    assert verified.returncode == 0, verified.stderr

    restored = tmp_path / "restored"
    back = await run_cli("restore", str(archive), "--home", str(restored), env=child_env())
    assert back.returncode == 0, back.stderr
    assert "NEOTASK_STORAGE__BACKEND=files" in back.stdout  # its config.yaml still names the database
    assert differences(held, await asyncio.to_thread(files_bulk.dump, restored)) == []

    into = await run_cli("restore", str(archive), "--home", str(tmp_path / "again"), "--to", second, "--json",
                         env=child_env())  # fmt: skip
    assert into.returncode == 0, into.stderr
    assert len(json.loads(into.stdout)["copy"]["runs"]) == 3
    assert differences(held, await dump(PostgresEnd(second))) == []
    refused = await run_cli("restore", str(archive), "--home", str(tmp_path / "third"), "--to", second,
                            env=child_env())  # fmt: skip
    assert refused.returncode == 1 and "already holds" in refused.stderr, refused.stderr
    bad = await run_cli("restore", str(archive), "--home", str(tmp_path / "fourth"), "--to", "mysql://x/y",
                        env=child_env())  # fmt: skip
    assert bad.returncode == 2 and "postgres://" in bad.stderr and not (tmp_path / "fourth").exists(), bad.stderr


async def test_the_backup_route_on_postgres(postgres_server: PgServer, tmp_path: Path, aiohttp_client: Any) -> None:
    dsn = await postgres_server.database(DATABASE)
    await empty_database(dsn)
    await _seed(tmp_path / "seed")
    await copy(FilesEnd(tmp_path / "seed"), PostgresEnd(dsn))
    app = make_app(tmp_path / "home", system_clock, {"storage": {"backend": "postgres", "postgres": {"dsn": dsn}}})
    client = await aiohttp_client(app)
    path = f"/v1/sessions/{quote(KEYS[1], safe='')}/messages"
    resp = await client.post(path, json={"content": "acknowledged before the backup"})
    assert resp.status == 200, await resp.text()
    out = tmp_path / "online.tar.gz"
    resp = await client.post("/v1/admin/backup", json={"output": str(out)})
    assert resp.status == 200, await resp.text()
    body = await resp.json()
    assert body["mode"] == "online" and body["counts"]["runs"] == 2
    held = await dump(PostgresEnd(dsn))
    restored = tmp_path / "restored"
    back = await run_cli("restore", str(out), "--home", str(restored), env=child_env())
    assert back.returncode == 0, back.stderr
    copied = await asyncio.to_thread(files_bulk.dump, restored)
    assert differences(held, copied) == []
    texts = [json.loads(line)["content"] for run in copied.runs for line in run.messages]
    assert "acknowledged before the backup" in texts
    conn = await asyncpg.connect(dsn)
    try:
        assert await conn.fetchval("SELECT count(*) FROM purge_tombstones WHERE session_key = $1", PURGED) == 1
    finally:
        await conn.close()


async def test_an_offline_backup_of_a_files_home_restores_equal(tmp_path: Path) -> None:
    """The files side of ``take_offline`` (split from the database side): runs, records, usage and
    tombstones come back as they were, compared by the copy's dump and checksums."""
    home = tmp_path / "home"
    await _seed(home)
    archive = tmp_path / "files.tar.gz"
    taken = await run_cli("backup", "-o", str(archive), "--home", str(home), "--json", env=child_env())
    assert taken.returncode == 0, taken.stderr
    assert json.loads(taken.stdout)["mode"] == "offline" and "backend" not in _manifest(archive)
    restored = tmp_path / "restored"
    back = await run_cli("restore", str(archive), "--home", str(restored), env=child_env())
    assert back.returncode == 0, back.stderr
    before = await asyncio.to_thread(files_bulk.dump, home)
    assert before.usage and before.tombstones
    assert differences(before, await asyncio.to_thread(files_bulk.dump, restored)) == []
