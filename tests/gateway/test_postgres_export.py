"""Exports on the PostgreSQL backend: the same runs (a files home copied into the database by
``sessions.copying``: an archived run, an active one with a tool call and a plan, a compacted one)
export byte for byte as on the files backend, as JSON Lines and as Markdown, per key and per run,
through the stores and through ``neotask sessions export``; the messages are read a page at a time
(a small page here) off the event loop."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import cast

import pytest
import yaml

from config.clock import system_clock
from config.errors import RunNotFound, SessionNotFound
from sessions.copying import FilesEnd, PostgresEnd, copy
from sessions.export_lines import export_lines
from sessions.files.store import SessionStore
from sessions.postgres import export as pg_export
from sessions.postgres.store import PgStore
from sessions.protocol import StoreProtocol
from tests.gateway.daemons import child_env, run_cli
from tests.gateway.test_storage_copy import KEYS, _seed
from tests.sessions.helpers import settings_with
from tests.support.postgres import DATABASE, PgServer, empty_database

pytestmark = [pytest.mark.realtime]


async def _exports(store: StoreProtocol) -> dict[str, str]:
    """Every key's and every run's export, JSON Lines and Markdown, produced off the loop."""
    out: dict[str, str] = {}
    for key in KEYS:
        runs = await store.export_runs(key=key)
        for fmt in ("jsonl", "md"):
            out[f"{key}.{fmt}"] = await asyncio.to_thread(lambda r=runs, f=fmt, k=key: "".join(
                export_lines(r, f, title=f"Session {k}")))  # fmt: skip
        for run in runs:
            (one,) = await store.export_runs(run_id=run.row["uuid"])
            out[f"{run.row['uuid']}.jsonl"] = await asyncio.to_thread(lambda o=one: "".join(
                export_lines([o], "jsonl", title="run")))  # fmt: skip
    return out


async def test_exports_are_the_same_on_both_backends(
    postgres_server: PgServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    dsn = await postgres_server.database(DATABASE)
    await empty_database(dsn)
    source = tmp_path / "source"
    await _seed(source)
    await copy(FilesEnd(source), PostgresEnd(dsn))
    files = await SessionStore.open(source, settings_with(), clock=system_clock)
    try:
        expected = await _exports(files)
    finally:
        await files.close()
    assert len(expected) == 9 and all(expected.values())
    assert "明日の会議" in expected[f"{KEYS[0]}.md"] and '"type": "compaction"' in expected[f"{KEYS[2]}.jsonl"]

    monkeypatch.setattr(pg_export, "PAGE", 3)  # 4 messages a run: two pages each
    store = await PgStore.open(settings_with(), dsn=dsn, clock=system_clock, pool_size=2)
    try:
        assert await _exports(store) == expected
        with pytest.raises(SessionNotFound):
            await store.export_runs(key="agent:main:nobody")
        with pytest.raises(RunNotFound):
            await store.export_runs(run_id="00000000-0000-0000-0000-000000000000")
        (run, *_) = await store.export_runs(key=KEYS[0])
        with pytest.raises(RuntimeError, match="off the event loop"):  # it would wait for itself
            "".join(export_lines([run], "jsonl", title="x"))
    finally:
        await store.close()

    config = tmp_path / "pg.yaml"
    config.write_text(yaml.safe_dump({"storage": {"backend": "postgres", "postgres": {"dsn": dsn, "pool_size": 2}}}))
    for fmt in ("jsonl", "md"):
        done = await run_cli("sessions", "export", KEYS[1], "--format", fmt, "--home", str(tmp_path / "pghome"),
                             "--config", str(config), env=child_env())  # fmt: skip
        assert done.returncode == 0, done.stderr
        assert done.stdout == expected[f"{KEYS[1]}.{fmt}"]


# the page's coroutine, handed to a loop that never runs, is dropped unawaited: what a stopped loop does
@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
@pytest.mark.filterwarnings("ignore:coroutine .* was never awaited:RuntimeWarning")
async def test_a_page_does_not_wait_forever_for_a_stopped_loop(monkeypatch: pytest.MonkeyPatch) -> None:
    stopped = asyncio.new_event_loop()  # never run: as the store's loop once it stopped under an export
    try:
        monkeypatch.setattr(pg_export, "WAIT_S", 0.2)
        reader = pg_export.PgRunReader(cast(PgStore, None), "run", None, stopped)
        with pytest.raises(TimeoutError):
            await asyncio.to_thread(lambda: next(reader.messages()))
    finally:
        stopped.close()
