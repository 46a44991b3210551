"""Where the messages of a run are read from for the history index, its rebuilds and exports: the
run's folder, or its archive streamed out of the tar.gz."""

from __future__ import annotations

import contextlib
import logging
import tarfile
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from home import layout
from home.layout import Home
from sessions.codec import decode
from sessions.files.jsonl import iter_records

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class RunSource:
    """Where the messages of one run can be read: its folder, else its archive."""

    run_id: str
    session_key: str
    agent_id: str | None
    folder: Path | None = None
    archive: Path | None = None


def iter_run_messages(source: RunSource) -> Iterator[dict[str, Any]]:
    """The messages.jsonl records of a run folder or an archive, streamed (blocking)."""
    if source.folder is not None:
        yield from iter_records(source.folder / layout.MESSAGES)
        return
    if source.archive is None:
        return
    try:
        with tarfile.open(source.archive, mode="r:gz") as tar:
            try:
                member = tar.getmember(f"{source.run_id}/{layout.MESSAGES}")
            except KeyError:
                return
            handle = tar.extractfile(member)
            if handle is None:
                return
            for raw in handle:
                if not raw.endswith(b"\n"):
                    break
                with contextlib.suppress(ValueError):
                    record = decode(raw)
                    if isinstance(record, dict):
                        yield record
    except (FileNotFoundError, tarfile.TarError) as exc:
        log.warning("history rebuild: archive of run %s unreadable: %s", source.run_id, exc)


def sources_from_rows(rows: Iterable[Mapping[str, Any]], home: Home) -> list[RunSource]:
    """Rebuild sources from tasks.db rows: the run folder when it exists, else its archive
    (blocking: stats the files)."""
    out = []
    for row in sorted(rows, key=lambda r: (r.get("created_at") or "", r["uuid"])):
        if not row.get("session_key"):
            continue
        folder = None
        for name in layout.FOLDERS:
            candidate = home.folder(name) / row["uuid"]
            if candidate.is_dir():
                folder = candidate
                break
        archive = home.archive_file(row["uuid"])
        if folder is None and not archive.exists():
            continue
        out.append(
            RunSource(
                run_id=row["uuid"],
                session_key=row["session_key"],
                agent_id=row.get("agent_id"),
                folder=folder,
                archive=None if folder is not None else archive,
            )
        )
    return out
