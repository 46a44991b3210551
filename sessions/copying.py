"""Moving a home's sessions from one backend to another (``neotask storage copy --to TARGET``).

The source is read whole into a ``Snapshot`` (``sessions.copy_snapshot``: a backend-neutral copy
of every run with its messages, context lines, summaries, tool calls and plans, the keys' entries,
the delivery and OpenAI-compatible records, the usage rows and the tombstones) by the source
backend's ``dump``; the target backend's ``load`` writes
it in one go (``sessions.files.bulk``, ``sessions.postgres.bulk``). The target must be empty:
nothing is written otherwise. After the load the target is read back the same way and compared
run by run (counts of each kind and a sha256 of the canonical JSON of its messages), the usage
rows and the tombstones by count and sha256, so a copy
that lost or changed anything fails loudly.

The Protocol has no call that lists every idempotency or compat record, nor one that reads an
ended run's context, so both sides work on their backend's storage directly (the daemon must not
run on the source: the CLI holds the home lock while it reads).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from sessions.copy_snapshot import CopyRefused, Snapshot, differences

if TYPE_CHECKING:
    import asyncpg

    from config.settings import Settings

__all__ = [
    "CopyRefused",
    "End",
    "FilesEnd",
    "PostgresEnd",
    "Snapshot",
    "configured_end",
    "copy",
    "dump",
    "parse_target",
]


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


def configured_end(settings: Settings, home: Path, env: Mapping[str, str]) -> End:
    """The store ``settings`` configure (``storage.backend``) as an end of a copy."""
    if settings.storage.backend == "postgres":
        from sessions.postgres.store import connection_options

        dsn, password = connection_options(settings.storage.postgres, env)
        return PostgresEnd(dsn, password)
    return FilesEnd(home)


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
