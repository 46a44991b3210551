"""A child process for the crash test: a PostgreSQL store appending forever from concurrent tasks,
printing ``ack <key> <seq> <content>`` for every acknowledged (committed) append."""

from __future__ import annotations

import asyncio
import sys

from config.clock import system_clock
from sessions.postgres.store import PgStore
from sessions.records import NewMessage, RunStart, TaskKey
from tests.sessions.helpers import settings_with


async def main(dsn: str, writers: int) -> None:
    store = await PgStore.open(settings_with(), dsn=dsn, clock=system_clock, pool_size=2)
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
    asyncio.run(main(sys.argv[1], int(sys.argv[2])))
