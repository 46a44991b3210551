"""A context rewrite (``sessions.rewrites``: a compaction or an uncompact, given as data) carried
out in ONE transaction: the run's row locked, the old context saved as the archive the summary
record names, the record appended, the context replaced and the counters set. A crash or a lost
connection leaves the old context or the new one, never a mix."""

from __future__ import annotations

import json

import asyncpg

from sessions.codec import encode
from sessions.compaction import COMPACTIONS
from sessions.postgres.faults import unavailable
from sessions.records import ContextRewrite, RunState
from sessions.rewrites import Compaction, ContextChange, compacted, to_undo, tokens_of, uncompacted


async def apply_change(pool: asyncpg.Pool, run: RunState, change: ContextChange) -> ContextRewrite | None:
    with unavailable("the compaction was not stored"):
        async with pool.acquire() as conn, conn.transaction():
            await conn.execute("SELECT 1 FROM runs WHERE run_id = $1 FOR UPDATE", run.run_id)
            current = [
                json.loads(r[0])
                for r in await conn.fetch(
                    "SELECT line::text FROM context_lines WHERE run_id = $1 ORDER BY pos", run.run_id
                )
            ]
            if isinstance(change, Compaction):
                done = compacted(change, current)
                if done is None:
                    return None
                new_lines, record = done
                archive = str(record.get("archive") or f"{COMPACTIONS}/{change.summary_id}.jsonl")
                await conn.execute(
                    "INSERT INTO context_archives (run_id, name, lines) VALUES ($1, $2, $3::json)"
                    " ON CONFLICT (run_id, name) DO NOTHING",  # an archive is never overwritten
                    run.run_id, archive, _array(current),
                )  # fmt: skip
                count, before = change.compaction_count, int(str(record["tokens_before"]))
            else:
                summaries = [
                    json.loads(r[0])
                    for r in await conn.fetch(
                        "SELECT record::text FROM summaries WHERE run_id = $1 ORDER BY id", run.run_id
                    )
                ]
                found = to_undo(summaries)
                if found is None:
                    return None
                undone, archive = found
                saved = await conn.fetchval(
                    "SELECT lines::text FROM context_archives WHERE run_id = $1 AND name = $2", run.run_id, archive
                )
                if saved is None:
                    return None
                new_lines, record = uncompacted(change, undone, archive, json.loads(saved), current)
                count, before = change.compaction_count - 1, 0
            texts = [_text(line) for line in new_lines]
            size = sum(len(text.encode()) + 1 for text in texts)
            await conn.execute("DELETE FROM context_lines WHERE run_id = $1", run.run_id)
            await conn.execute(
                "INSERT INTO context_lines (run_id, pos, line)"
                " SELECT $1, u.ord, u.line FROM unnest($2::json[]) WITH ORDINALITY AS u(line, ord)",
                run.run_id, texts,
            )  # fmt: skip
            await conn.execute(
                "INSERT INTO summaries (run_id, id, record) VALUES ($1, $2, $3::json)",
                run.run_id, change.summary_id, _text(record),
            )  # fmt: skip
            delta = len(new_lines) - len(current)
            rewrite = ContextRewrite(tokens_of(new_lines), delta, size, count, change.summary_id, tokens_before=before)
            await conn.execute(
                "UPDATE runs SET next_pos = $2, context_lines = $3, context_tokens = $4, context_bytes = $5,"
                " compaction_count = $6, last_summary_id = greatest(last_summary_id, $7) WHERE run_id = $1",
                run.run_id, len(texts) + 1, len(texts), rewrite.tokens_after, size, count, change.summary_id,
            )  # fmt: skip
    return rewrite


def _text(record: object) -> str:
    return encode(record)[:-1].decode()  # type: ignore[arg-type]


def _array(lines: list[dict[str, object]]) -> str:
    return "[" + ",".join(_text(line) for line in lines) + "]"
