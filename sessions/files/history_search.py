"""Searching the history index (blocking; ``HistoryIndex.search`` runs it on its read thread):
the query and hit records, filters, ranking, snippets."""

from __future__ import annotations

import sqlite3
from typing import Any

from sessions.history_index import HistoryHit, HistoryQuery
from sessions.history_text import match_expression, query_terms, snippet

CANDIDATES = 1000  # the newest matches ranked per search (see ``search``)
COMMON_POOL = 300  # a query matching more than CANDIDATES ranks its newest this many (see ``search``)


def search(conn: sqlite3.Connection, query: HistoryQuery) -> list[HistoryHit]:
    """Best first (BM25); filters on the message row. Blocking."""
    expression = match_expression(query.q)
    if expression is None:
        return []
    clauses = ["fts MATCH ?"]
    values: list[Any] = [expression]
    for column, value in (("m.agent_id", query.agent), ("m.session_key", query.key), ("m.role", query.role)):
        if value is not None:
            clauses.append(f"{column} = ?")
            values.append(value)
    if query.since is not None:
        clauses.append("m.timestamp >= ?")
        values.append(query.since)
    if query.until is not None:
        clauses.append("m.timestamp < ?")
        values.append(query.until)
    if query.keys is not None:
        if not query.keys:
            return []
        clauses.append(f"m.session_key IN ({', '.join('?' for _ in query.keys)})")
        values.extend(sorted(query.keys))
    # Ranking: a query matching at most CANDIDATES messages is ranked by FTS5's BM25. FTS5's bm25()
    # counts every match of every term on each call (50 ms for a word found in a million messages),
    # so a query matching more is ranked over its newest COMMON_POOL matches by term frequency and
    # length (FTS5 walks its doclists by descending rowid and stops early: milliseconds).
    cap = max(CANDIDATES, query.offset + query.limit)
    where = " AND ".join(clauses)
    join = "fts JOIN messages m ON m.id = fts.rowid"
    count = len(conn.execute(f"SELECT fts.rowid FROM {join} WHERE {where} LIMIT ?", [*values, cap + 1]).fetchall())
    if count == 0:
        return []
    columns = "m.session_key, m.run_id, m.seq, m.role, m.timestamp, m.content, m.id, m.agent_id, m.tool"
    if count <= cap:
        sql = (
            f"SELECT {columns}, -bm25(fts) AS score FROM {join} WHERE {where}"
            " ORDER BY bm25(fts), m.id DESC LIMIT ? OFFSET ?"
        )
        rows = conn.execute(sql, [*values, query.limit, query.offset]).fetchall()
        ranked = [(float(row[9]), row[:9]) for row in rows]
    else:
        pool = max(COMMON_POOL, query.offset + query.limit)
        sql = f"SELECT {columns} FROM {join} WHERE {where} ORDER BY fts.rowid DESC LIMIT ?"
        ranked = frequent(query.q, conn.execute(sql, [*values, pool]).fetchall())
        ranked = ranked[query.offset : query.offset + query.limit]
    hits = []
    for score, (key, run_id, seq, role, timestamp, content, _id, agent_id, tool) in ranked:
        hits.append(
            HistoryHit(
                session_key=key,
                run_id=run_id,
                seq=int(seq),
                role=role,
                timestamp=timestamp,
                snippet=snippet(content, query.q),
                score=round(score, 4),
                agent_id=agent_id,
                tool=bool(tool),
            )
        )
    return hits


def frequent(q: str, rows: list[tuple[Any, ...]]) -> list[tuple[float, tuple[Any, ...]]]:
    """Rows whose every term is common, best first: BM25's term-frequency and length parts with
    equal term weights (k1 1.2, b 0.75), ties newest first."""
    words, runs = query_terms(q)
    terms = [*words, *runs]
    texts = [str(row[5]).lower() for row in rows]
    lengths = [text.count(" ") + 1 for text in texts]
    average = sum(lengths) / max(1, len(lengths))
    scored = []
    for row, text, length in zip(rows, texts, lengths, strict=True):
        norm = 1.2 * (0.25 + 0.75 * length / average)
        score = sum((tf := max(1, text.count(term))) * 2.2 / (tf + norm) for term in terms)
        scored.append((score, row))
    scored.sort(key=lambda item: (-item[0], -int(item[1][6])))
    return scored
