"""The workers of one supervisor (``neotask gateway --workers N``) as one gateway: a reload
through the API (or ``neotask config reload``) reaches every worker, not only the one that took the
connection, and its answer lists each worker's result; ``/readyz``, ``gateway status`` and
``/v1/admin/config`` name every worker and the one that leads, whichever worker answers.

Status: each worker writes ``<home>/workers/status-<index>.json`` every second (ready, leading,
its settings' ``since`` and reloads); a file older than ``STALE_S`` is a worker not answering.

How: the worker that takes ``POST /v1/admin/config/reload`` reloads itself, writes the request
(``<home>/workers/reload.json``: an id, when, by whom) and sends SIGHUP to its supervisor, which
forwards it to every worker as it does an operator's ``kill -HUP``. Each worker's SIGHUP reload
writes its outcome to ``<home>/workers/reload-<index>.json`` with the id of the request it found
(none for an operator's signal); the asking worker waits until every other worker wrote one with
its id (``WAIT_S`` at most; a worker that does not answer is named so) and answers them all.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from home.atomic import write_json_atomic

WAIT_S = 15.0  # for the other workers' outcomes (a worker busy starting may not reload at once)
FRESH_S = 30.0  # a request older than this is an earlier one: a later SIGHUP was an operator's
POLL_S = 0.05
STALE_S = 5.0  # a status file older than this: the worker is not answering (dead, or starting again)


@dataclass(frozen=True)
class Fleet:
    """This worker's place in its supervisor's fleet."""

    folder: Path
    index: int
    count: int
    supervisor: int

    @classmethod
    def of(cls, home: Path, index: int, count: int) -> Fleet:
        folder = home / "workers"
        folder.mkdir(mode=0o700, exist_ok=True)
        return cls(folder, index, count, os.getppid())

    def _outcome_path(self, index: int) -> Path:
        return self.folder / f"reload-{index}.json"

    async def reload_others(self) -> list[dict[str, Any]]:
        """Have every other worker reload (through the supervisor's SIGHUP); their outcomes."""
        request = uuid.uuid4().hex
        body = {"id": request, "at": time.time(), "by": self.index}
        await asyncio.to_thread(write_json_atomic, self.folder / "reload.json", body, sync=False)
        os.kill(self.supervisor, signal.SIGHUP)
        others = [i for i in range(1, self.count + 1) if i != self.index]
        found: dict[int, dict[str, Any]] = {}
        deadline = time.monotonic() + WAIT_S
        while len(found) < len(others) and time.monotonic() < deadline:
            await asyncio.sleep(POLL_S)
            for index in others:
                if index not in found:
                    outcome = await asyncio.to_thread(_read, self._outcome_path(index))
                    if outcome is not None and outcome.get("request") == request:
                        found[index] = outcome
        return [
            found.get(i, {"worker": i, "error": f"worker {i} gave no outcome within {WAIT_S:.0f} s; see its log"})
            for i in others
        ]

    def write_status(self, status: dict[str, Any]) -> None:
        """This worker's status for the others (blocking; every second)."""
        body = {"worker": self.index, "pid": os.getpid(), "at": time.time(), **status}
        write_json_atomic(self.folder / f"status-{self.index}.json", body, sync=False)

    def statuses(self) -> list[dict[str, Any]]:
        """Every worker's last status (blocking), ``answering`` false when it is missing or stale."""
        out = []
        for index in range(1, self.count + 1):
            status = _read(self.folder / f"status-{index}.json")
            fresh = status is not None and isinstance(status.get("at"), (int, float))
            if status is None or not fresh or time.time() - status["at"] > STALE_S:
                out.append({"worker": index, "answering": False})
            else:
                out.append({**{k: v for k, v in status.items() if k != "at"}, "answering": True})
        return out

    def note(self, outcome: dict[str, Any]) -> None:
        """Write this worker's SIGHUP outcome (blocking) with the id of the request it answers."""
        request = _read(self.folder / "reload.json") or {}
        fresh = isinstance(request.get("at"), (int, float)) and time.time() - request["at"] < FRESH_S
        body = {"worker": self.index, "pid": os.getpid(), "request": request.get("id") if fresh else None, **outcome}
        write_json_atomic(self._outcome_path(self.index), body, sync=False)


def _read(path: Path) -> dict[str, Any] | None:
    with contextlib.suppress(OSError, ValueError):
        data = json.loads(path.read_text(encoding="utf-8"))
        return data if isinstance(data, dict) else None
    return None
