"""Moving a home's sessions from one backend to another (``neotask storage copy --to TARGET``).

The source is read whole into a ``Snapshot`` (a backend-neutral copy of every run with its
messages, context lines, summaries, tool calls and plans, the keys' entries and the delivery and
OpenAI-compatible records) by the source backend's ``dump``; the target backend's ``load`` writes
it in one go (``sessions.files.bulk``, ``sessions.postgres.bulk``). The target must be empty:
nothing is written otherwise. After the load the target is read back the same way and compared
run by run (counts of each kind and a sha256 of the canonical JSON of its messages), so a copy
that lost or changed anything fails loudly.

The Protocol has no call that lists every idempotency or compat record, nor one that reads an
ended run's context, so both sides work on their backend's storage directly (the daemon must not
run on the source: the CLI holds the home lock while it reads).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import asyncpg

Row = dict[str, Any]
Line = str  # one JSON line as stored, byte for byte (a message, a context line, a summary, a tool call, a plan)

RECORD_TABLES = ("idempotency", "hook_deliveries", "openai_conversations", "openai_responses")


@dataclass
class RunCopy:
    row: Row  # the run's ledger columns (``sessions.records.RunRow``, ``uuid`` the run id)
    messages: list[Line] = field(default_factory=list)
    context: list[Line] = field(default_factory=list)
    summaries: list[Line] = field(default_factory=list)
    tools: list[Line] = field(default_factory=list)
    plans: list[Line] = field(default_factory=list)
    final_summary: str | None = None
    archives: dict[str, list[Line]] = field(default_factory=dict)  # compactions/{id}.jsonl -> the lines it replaced

    @property
    def run_id(self) -> str:
        return str(self.row["uuid"])

    def counts(self) -> dict[str, int]:
        return {
            "messages": len(self.messages),
            "context": len(self.context),
            "summaries": len(self.summaries),
            "tools": len(self.tools),
            "plans": len(self.plans),
            "archives": len(self.archives),
        }

    def checksum(self) -> str:
        """sha256 of the canonical JSON of everything the run holds (messages first)."""

        def parsed(lines: list[Line]) -> list[Any]:
            return [json.loads(line) for line in lines]

        body = [parsed(self.messages), parsed(self.context), parsed(self.summaries), parsed(self.tools),
                parsed(self.plans), self.final_summary, {k: parsed(v) for k, v in self.archives.items()}]  # fmt: skip
        return hashlib.sha256(canonical(body).encode("utf-8")).hexdigest()


@dataclass
class Snapshot:
    runs: list[RunCopy] = field(default_factory=list)
    entries: dict[str, Row] = field(default_factory=dict)  # key -> the entry's fields (with its key)
    records: dict[str, list[Row]] = field(default_factory=lambda: {t: [] for t in RECORD_TABLES})
    skipped: list[str] = field(default_factory=list)  # what the source holds and the copy cannot carry

    def empty(self) -> bool:
        return not self.runs and not self.entries and not any(self.records.values())

    def report(self) -> dict[str, Any]:
        return {
            "runs": [
                {"run_id": r.run_id, "status": r.row.get("status"), **r.counts(), "sha256": r.checksum()}
                for r in sorted(self.runs, key=lambda r: r.run_id)
            ],
            "entries": len(self.entries),
            "records": {t: len(rows) for t, rows in self.records.items()},
            "skipped": list(self.skipped),
        }


def canonical(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, sort_keys=True, separators=(",", ":"))


def line_text(value: Any) -> str:
    """A value as a backend stores a JSON line (no newline)."""
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


class CopyRefused(Exception):
    """The target is not empty, or the copy did not verify: what to do in the message."""


def differences(source: Snapshot, target: Snapshot) -> list[str]:
    """What differs between the source and the copy read back (empty: the copy is faithful)."""
    problems: list[str] = []
    mine = {r.run_id: r for r in source.runs}
    theirs = {r.run_id: r for r in target.runs}
    for run_id in sorted(mine.keys() | theirs.keys()):
        a, b = mine.get(run_id), theirs.get(run_id)
        if a is None or b is None:
            problems.append(f"run {run_id}: {'missing in the copy' if b is None else 'not in the source'}")
        elif a.counts() != b.counts() or a.checksum() != b.checksum():
            problems.append(
                f"run {run_id}: source {a.counts()} {a.checksum()[:12]}, copy {b.counts()} {b.checksum()[:12]}"
            )
        elif _columns(a.row) != _columns(b.row):
            problems.append(f"run {run_id}: its ledger row differs")
    if canonical(source.entries) != canonical(target.entries):
        problems.append(f"entries: {len(source.entries)} in the source, {len(target.entries)} in the copy (or changed)")
    for table in RECORD_TABLES:
        if canonical(_sorted(source.records[table])) != canonical(_sorted(target.records[table])):
            problems.append(
                f"{table}: {len(source.records[table])} in the source, {len(target.records[table])} in the copy"
            )
    return problems


def _columns(row: Row) -> Row:
    return {k: v for k, v in row.items() if v is not None}


def _sorted(rows: list[Row]) -> list[Row]:
    return sorted(rows, key=canonical)


# -- the two ends of a copy -------------------------------------------------------------------------


@dataclass(frozen=True)
class FilesEnd:
    root: Path

    def describe(self) -> str:
        return f"files {self.root}"


@dataclass(frozen=True)
class PostgresEnd:
    dsn: str
    password: str | None = None

    def describe(self) -> str:
        from sessions.postgres.store import redact

        return f"postgres {redact(self.dsn)}"


End = FilesEnd | PostgresEnd
POSTGRES_SCHEMES = ("postgres://", "postgresql://")


def parse_target(text: str) -> End:
    """``--to``: a postgres DSN or a files home directory (``CopyRefused`` for anything else)."""
    if text.startswith(POSTGRES_SCHEMES):
        return PostgresEnd(text)
    if "://" in text:
        raise CopyRefused(
            f"--to {text!r}: not a postgres:// DSN nor a directory; give postgres://user@host:port/db or a path"
        )
    path = Path(text).expanduser().absolute()
    if path.exists() and not path.is_dir():
        raise CopyRefused(f"--to {text}: exists and is not a directory; give a new or empty home directory")
    return FilesEnd(path)


async def dump(end: End) -> Snapshot:
    if isinstance(end, FilesEnd):
        from sessions.files import bulk as files_bulk

        return await asyncio.to_thread(files_bulk.dump, end.root)
    from sessions.postgres import bulk as pg_bulk

    async with _connection(end) as conn:
        return await pg_bulk.dump(conn)


async def copy(source: End, target: End) -> Snapshot:
    """Copy everything ``source`` holds into the empty ``target`` and verify it; the source's
    snapshot (its ``report()`` is what was copied). ``CopyRefused``: nothing written (a non-empty
    target) or the copy does not match its source (what differs in the message)."""
    if source == target:
        raise CopyRefused(f"the target is the source ({source.describe()}); give another --to")
    snapshot = await dump(source)
    if isinstance(target, FilesEnd):
        from sessions.files import bulk as files_bulk

        held = await asyncio.to_thread(files_bulk.is_empty, target.root)
        if held:
            raise CopyRefused(f"{held}: copy into a new or empty home (nothing was written)")
        await asyncio.to_thread(files_bulk.load, target.root, snapshot)
    else:
        from sessions.postgres import bulk as pg_bulk

        async with _connection(target) as conn:
            held = await pg_bulk.is_empty(conn, target.describe())
            if held:
                raise CopyRefused(f"{held}: copy into an empty database (nothing was written)")
            await pg_bulk.load(conn, snapshot, target.describe())
    problems = differences(snapshot, await dump(target))
    if problems:
        raise CopyRefused(f"the copy in {target.describe()} does not match its source: " + "; ".join(problems))
    return snapshot


@contextlib.asynccontextmanager
async def _connection(end: PostgresEnd) -> AsyncIterator[asyncpg.Connection]:
    import asyncpg

    try:
        conn = await asyncpg.connect(end.dsn, password=end.password, timeout=10)
    except (OSError, asyncpg.PostgresError, TimeoutError, ValueError) as exc:
        raise CopyRefused(f"cannot connect to {end.describe()}: {exc}; check the DSN and that the server runs") from exc
    try:
        yield conn
    finally:
        await conn.close()
