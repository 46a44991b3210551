"""Homes with many active sessions, for the session engine benchmarks.

Starting 10,000 runs through ``SessionStore.start_run`` takes minutes (each start rewrites the
whole sessions.json at once, as lifecycle changes must, so building the home is quadratic). So one
run is made through the real store — its metadata.json, messages.jsonl, current.jsonl, tasks.db
row and sessions.json entry are the template — and then cloned on disk with a fresh run id and
key. Every byte format is therefore the store's own; only the ids differ.
"""

from __future__ import annotations

import json
import os
import sqlite3
import uuid
from collections.abc import Sequence
from contextlib import closing
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from config.clock import Clock
from config.settings import Settings
from home import layout
from home.atomic import write_json_atomic
from home.layout import Home
from sessions.files.ledger import Ledger
from sessions.files.registry import SessionRegistry
from sessions.files.store import SessionStore
from sessions.records import RUN_COLUMNS, NewMessage, RunStart, RunState, TaskKey

CHANNEL = "telegram"
TEMPLATE_KEY = f"agent:main:{CHANNEL}:dm:template"


def peer_key(index: int) -> str:
    """The key ``route`` gives a direct message from peer ``user<index>`` under per-channel-peer."""
    return f"agent:main:{CHANNEL}:dm:{peer_id(index)}"


def peer_id(index: int) -> str:
    return f"user{index}"


def conversation(turns: int) -> list[NewMessage]:
    """A short chat: alternating user and assistant messages of a realistic length."""
    out = []
    for i in range(turns):
        if i % 2 == 0:
            out.append(NewMessage(role="user", content=f"question {i}: " + "what about the plan? " * 4, sender_id="u"))
        else:
            out.append(NewMessage(role="assistant", content=f"answer {i}: " + "here is the next step. " * 8))
    return out


async def start_chat_run(store: SessionStore, key: str) -> RunState:
    return await store.start_run(
        RunStart(key, agent_id="main", chat_type="direct", channel=CHANNEL, task_key=TaskKey("agent", key))
    )


@dataclass(frozen=True)
class Template:
    metadata: dict[str, Any]
    messages: bytes
    current: bytes
    row: dict[str, Any]
    entry: dict[str, Any]


async def make_template(root: Path, settings: Settings, clock: Clock, messages: int) -> Template:
    """One run with ``messages`` messages, written by the real store, read back as a template."""
    store = await SessionStore.open(root, settings, clock=clock)
    try:
        run = await start_chat_run(store, TEMPLATE_KEY)
        for message in conversation(messages):
            await store.append(run, message)
    finally:
        await store.close()
    home = Home(root)
    folder = home.run_dir(run.run_id, "running")
    with closing(sqlite3.connect(home.tasks_db)) as conn:
        conn.row_factory = sqlite3.Row
        row = dict(conn.execute("SELECT * FROM tasks WHERE uuid = ?", (run.run_id,)).fetchone())
    sessions = json.loads(home.sessions_json.read_text(encoding="utf-8"))["sessions"]
    return Template(
        metadata=json.loads((folder / layout.METADATA).read_text(encoding="utf-8")),
        messages=(folder / layout.MESSAGES).read_bytes(),
        current=(folder / layout.CURRENT).read_bytes(),
        row=row,
        entry=sessions[TEMPLATE_KEY],
    )


def write_home(root: Path, template: Template, keys: Sequence[str], *, flush_ms: int) -> None:
    """A home where each of ``keys`` has one running run cloned from ``template`` (blocking)."""
    home = Home(root)
    home.ensure()
    rows = []
    entries: dict[str, dict[str, Any]] = {}
    for key in keys:
        run_id = str(uuid.uuid4())
        folder = home.run_dir(run_id, "running")
        folder.mkdir()
        metadata = {**template.metadata, "uuid": run_id, "session_key": key, "task_identifier": key}
        write_json_atomic(folder / layout.METADATA, metadata, sync=False)
        (folder / layout.MESSAGES).write_bytes(template.messages)
        (folder / layout.CURRENT).write_bytes(template.current)
        rows.append(
            {
                **template.row,
                "uuid": run_id,
                "session_key": key,
                "task_identifier": key,
                "metadata": json.dumps(metadata, ensure_ascii=False),
            }
        )
        entries[key] = {**template.entry, "run_id": run_id}

    columns = [c for c in RUN_COLUMNS if c in template.row]
    sql = f"INSERT INTO tasks ({', '.join(columns)}) VALUES ({', '.join('?' for _ in columns)})"
    ledger = Ledger(home.tasks_db)
    ledger.open_sync()
    try:
        ledger.submit(lambda c: c.executemany(sql, [[r[k] for k in columns] for r in rows]))
    finally:
        ledger.close_sync()

    # Written once plainly, then loaded and re-flushed so the bytes are the registry's own format.
    home.sessions_json.write_text(json.dumps({"format_version": 1, "sessions": entries}), encoding="utf-8")
    registry = SessionRegistry(home.sessions_json, flush_ms=flush_ms)
    problem = registry.load()
    if problem is not None:
        raise RuntimeError(f"the generated sessions.json is {problem}")
    registry.flush_sync()
    # A daemon starts on files written back long ago. Unsynced clones would make the first fsync
    # of each run write its whole file, a cost of how the home was made, not of how many keys it has.
    os.sync()
