"""The context rewrite of a compaction or an uncompact, stored in one transaction.

Today's protocol hands the store a callable that rewrites a run folder's files (``current.jsonl``,
``summaries.jsonl``, ``compactions/``). Until the port gives the rewrite as data, this bridge
lays the run's context, summaries and archives out in a scratch folder (the run's ``dir``), runs
the callable there on a worker thread, reads back what it changed, and replaces the context lines,
adds the summary records and archives, and sets the run's counters in ONE transaction: a crash or
a lost connection leaves the old context or the new one, never a mix. The scratch folder is
removed whatever happens; nothing in it is ever read again.
"""

from __future__ import annotations

import asyncio
import json
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import asyncpg

from sessions import layout
from sessions.postgres.faults import unavailable
from sessions.records import ContextRewrite, RunState


@dataclass(frozen=True)
class _Changes:
    done: ContextRewrite
    lines: list[str]  # the new context, one JSON text per line
    summaries: list[tuple[int, str]]  # (id, record) appended by the commit
    archives: list[tuple[str, str]]  # (name, JSON array of lines) written by the commit


async def apply_rewrite(
    pool: asyncpg.Pool, run: RunState, folder: Path, commit: Callable[[], ContextRewrite | None]
) -> ContextRewrite | None:
    with unavailable("the compaction"):
        async with pool.acquire() as conn:
            lines = [r[0] for r in await conn.fetch(
                "SELECT line::text FROM context_lines WHERE run_id = $1 ORDER BY pos", run.run_id
            )]  # fmt: skip
            summaries = [r[0] for r in await conn.fetch(
                "SELECT record::text FROM summaries WHERE run_id = $1 ORDER BY id", run.run_id
            )]  # fmt: skip
            archives = {r[0]: r[1] for r in await conn.fetch(
                "SELECT name, lines::text FROM context_archives WHERE run_id = $1", run.run_id
            )}  # fmt: skip
    changes = await asyncio.to_thread(_stage_and_commit, folder, lines, summaries, archives, commit)
    if changes is None:
        return None
    done = changes.done
    with unavailable("the compaction"):
        async with pool.acquire() as conn, conn.transaction():
            await conn.execute("DELETE FROM context_lines WHERE run_id = $1", run.run_id)
            await conn.execute(
                "INSERT INTO context_lines (run_id, pos, line)"
                " SELECT $1, u.ord, u.line FROM unnest($2::json[]) WITH ORDINALITY AS u(line, ord)",
                run.run_id,
                changes.lines,
            )
            if changes.summaries:
                await conn.executemany(
                    "INSERT INTO summaries (run_id, id, record) VALUES ($1, $2, $3::json)",
                    [(run.run_id, i, text) for i, text in changes.summaries],
                )
            if changes.archives:
                await conn.executemany(
                    "INSERT INTO context_archives (run_id, name, lines) VALUES ($1, $2, $3::json)"
                    " ON CONFLICT (run_id, name) DO NOTHING",  # an archive is never overwritten
                    [(run.run_id, name, text) for name, text in changes.archives],
                )
            await conn.execute(
                "UPDATE runs SET next_pos = $2, context_lines = $3, context_tokens = $4, context_bytes = $5,"
                " compaction_count = $6, last_summary_id = greatest(last_summary_id, $7) WHERE run_id = $1",
                run.run_id, len(changes.lines) + 1, len(changes.lines), done.tokens_after, done.context_bytes,
                done.compaction_count, done.summary_id,
            )  # fmt: skip
    return done


def _stage_and_commit(
    folder: Path,
    lines: list[str],
    summaries: list[str],
    archives: dict[str, str],
    commit: Callable[[], ContextRewrite | None],
) -> _Changes | None:
    shutil.rmtree(folder, ignore_errors=True)
    (folder / layout.COMPACTIONS).mkdir(mode=0o700, parents=True)
    try:
        _write_lines(folder / layout.CURRENT, lines)
        _write_lines(folder / layout.SUMMARIES, summaries)
        for name, text in archives.items():
            _write_lines(folder / name, [json.dumps(x, ensure_ascii=False) for x in json.loads(text)])
        done = commit()
        if done is None:
            return None
        after = _read_lines(folder / layout.CURRENT)
        added = _read_lines(folder / layout.SUMMARIES)[len(summaries) :]
        new_summaries = [(int(json.loads(text)["id"]), text) for text in added]
        new_archives = []
        for path in sorted((folder / layout.COMPACTIONS).iterdir()):
            name = f"{layout.COMPACTIONS}/{path.name}"
            if name not in archives:
                new_archives.append((name, "[" + ",".join(_read_lines(path)) + "]"))
        return _Changes(done, after, new_summaries, new_archives)
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _write_lines(path: Path, lines: list[str]) -> None:
    path.write_text("".join(f"{line}\n" for line in lines), encoding="utf-8")


def _read_lines(path: Path) -> list[str]:
    return [line for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
