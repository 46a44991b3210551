"""A child process for crash tests: holds the home lock, appends forever from concurrent tasks,
and prints ``ack <key> <seq> <content>`` for every acknowledged (durable) append."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

from config.clock import system_clock
from home.lock import EXIT_LOCKED, HomeLock, HomeLocked
from sessions.records import NewMessage, RunStart, TaskKey
from tests.sessions.helpers import settings_with


async def main(home: Path, writers: int) -> None:
    from sessions.files.store import SessionStore

    store = await SessionStore.open(home, settings_with(), clock=system_clock)
    runs = []
    for i in range(writers):
        key = f"agent:main:dm:peer{i}"
        run = store.active_run(key) or await store.start_run(
            RunStart(key, agent_id="main", chat_type="direct", channel=None, task_key=TaskKey("agent", key))
        )
        runs.append(run)
    print("ready", flush=True)

    async def writer(index: int) -> None:
        run = runs[index % len(runs)]
        n = 0
        while True:
            n += 1
            content = f"w{index}-{n}"
            record = await store.append(run, NewMessage(role="user", content=content))
            sys.stdout.write(f"ack {run.key} {record['seq']} {content}\n")
            sys.stdout.flush()

    await asyncio.gather(*(writer(i) for i in range(writers * 4)))


if __name__ == "__main__":
    home = Path(sys.argv[1])
    lock = HomeLock(home / "gateway.lock")
    try:
        lock.acquire()
    except HomeLocked as exc:
        print(exc.message, file=sys.stderr)
        sys.exit(EXIT_LOCKED)
    asyncio.run(main(home, int(sys.argv[2]) if len(sys.argv) > 2 else 4))
