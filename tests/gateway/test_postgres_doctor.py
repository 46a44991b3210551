"""``neotask doctor`` on ``storage.backend: postgres`` checks the database and its history index,
never the files a home kept from before its move (``neotask storage copy``): the leftover
tasks.db's history index was reported as missing, and ``--fix`` built a contexts/history.db of
runs the deployment no longer reads. The database's own findings (messages the history table has
not indexed yet after a copy) are found and fixed."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from sessions.copying import FilesEnd, PostgresEnd, copy
from tests.gateway.daemons import child_env, run_cli
from tests.gateway.test_storage_copy import _seed
from tests.support.postgres import DATABASE, PgServer, empty_database

pytestmark = [pytest.mark.realtime]


async def test_the_doctor_on_postgres_leaves_the_old_files_alone(postgres_server: PgServer, tmp_path: Path) -> None:
    dsn = await postgres_server.database(DATABASE)
    await empty_database(dsn)
    home = tmp_path / "home"
    await _seed(home)  # a files home, then moved into the database; its files stay behind
    await copy(FilesEnd(home), PostgresEnd(dsn))
    (home / "contexts" / "history.db").unlink(missing_ok=True)
    config = tmp_path / "pg.yaml"
    config.write_text(yaml.safe_dump({"storage": {"backend": "postgres", "postgres": {"dsn": dsn, "pool_size": 2}}}))

    async def doctor(*fix: str) -> list[tuple[str, bool]]:
        done = await run_cli("doctor", *fix, "--json", "--home", str(home), "--config", str(config), env=child_env())
        assert done.returncode == 0, done.stderr
        return [(a["check"], a["fixed"]) for a in json.loads(done.stdout)["actions"]]

    assert await doctor() == [("history_holes", False)]  # the database's index, filled by --fix
    assert await doctor("--fix") == [("history_holes", True)]
    assert await doctor() == []
    assert not (home / "contexts" / "history.db").exists()
