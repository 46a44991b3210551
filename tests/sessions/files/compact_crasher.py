"""A child process for compaction crash tests: fills a run, then compacts and SIGKILLs itself at
a chosen point of the commit (fault injection around the real commit steps)."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from pathlib import Path
from typing import Any

import sessions.files.context_rewrite as rewrite_module
from config.clock import system_clock
from sessions.compactor import Compactor, extractive
from sessions.files.store import SessionStore
from sessions.records import NewMessage, RunStart, TaskKey
from tests.sessions.helpers import settings_with


def die() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def inject(point: str) -> None:
    real_write = rewrite_module.write_records_atomic
    real_append = rewrite_module._append_synced
    calls = {"write": 0}

    def write(path: Path, records: Any, *, sync: bool = True) -> None:
        calls["write"] += 1
        if point == "current_tmp" and path.name == "current.jsonl":
            tmp = path.with_name(f".{path.name}.tmp")
            tmp.write_text('{"seq": null, "role": "system", "kind": "summary", "cont')  # torn temp file
            die()
        real_write(path, records, sync=sync)
        if point == "saved" and calls["write"] == 1:
            die()

    def append(path: Path, record: dict[str, Any]) -> None:
        real_append(path, record)
        if point == "summary":
            die()

    rewrite_module.write_records_atomic = write  # type: ignore[assignment]
    rewrite_module._append_synced = append


async def main(home: Path, point: str) -> None:
    store = await SessionStore.open(home, settings_with(), clock=system_clock)
    run = await store.start_run(
        RunStart("agent:main:main", agent_id="main", chat_type="direct", channel=None, task_key=TaskKey("agent", "k"))
    )
    for i in range(30):
        await store.append(run, NewMessage(role="user", content=f"message {i} " + "padding words " * 20))
    print("filled", flush=True)
    inject(point)
    compactor = Compactor(store, extractive, store.settings.compaction)
    await compactor.compact(run, trigger="manual", threshold=100000)
    print("completed", flush=True)
    await store.close()


if __name__ == "__main__":
    asyncio.run(main(Path(sys.argv[1]), sys.argv[2]))
