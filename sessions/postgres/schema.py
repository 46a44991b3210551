"""The PostgreSQL schema, as numbered migrations applied at open (under an advisory lock, so two
gateways starting together apply each once), and the refusal of a database newer than this code.

Payloads (message lines, context lines, summaries, tool calls, plans) are ``json``: kept as written,
read back byte for byte. What is queried has its own column. ``runs`` carries the live counters of
an active run; an append claims its seqs there, in the transaction that inserts the lines.
"""

from __future__ import annotations

import asyncpg

from home.damage import DamagedState
from sessions.postgres import usage as usage_daily
from sessions.postgres.history import MIGRATION as HISTORY_MIGRATION
from sessions.postgres.leader import MIGRATION as CLAIMS_MIGRATION
from sessions.postgres.leader import SEEN_MIGRATION

MIGRATION_LOCK = 0x6E656F74  # pg_advisory_xact_lock key while migrating ("neot")

MIGRATIONS: tuple[str, ...] = (
    # 1: runs, entries, messages, the context, summaries, archives, tool calls, plans, records
    """
    CREATE TABLE runs (
        run_id text PRIMARY KEY,
        session_key text,
        status text NOT NULL CHECK (status IN ('running', 'paused', 'completed', 'failed')),
        task_type text NOT NULL,
        task_identifier text,
        repository text,
        "user" text,
        created_at text NOT NULL,
        updated_at text,
        completed_at text,
        metadata text,
        total_messages bigint NOT NULL DEFAULT 0,
        total_summaries bigint NOT NULL DEFAULT 0,
        total_tool_calls bigint NOT NULL DEFAULT 0,
        final_token_count bigint,
        final_message_count bigint,
        error_message text,
        agent_id text,
        channel text,
        chat_type text,
        parent_uuid text,
        input_tokens bigint NOT NULL DEFAULT 0,
        output_tokens bigint NOT NULL DEFAULT 0,
        cache_read_tokens bigint NOT NULL DEFAULT 0,
        cache_write_tokens bigint NOT NULL DEFAULT 0,
        compaction_count bigint NOT NULL DEFAULT 0,
        pinned integer NOT NULL DEFAULT 0,
        archived_at text,
        final_summary text,
        -- the live counters (sessions.records.Counters) and the next numbers of an active run
        next_seq bigint NOT NULL DEFAULT 1,
        next_pos bigint NOT NULL DEFAULT 1,
        context_tokens bigint NOT NULL DEFAULT 0,
        context_bytes bigint NOT NULL DEFAULT 0,
        context_lines bigint NOT NULL DEFAULT 0,
        last_context_seq bigint NOT NULL DEFAULT 0,
        last_summary_id bigint NOT NULL DEFAULT 0,
        messages_bytes bigint NOT NULL DEFAULT 0,
        next_tool_seq bigint NOT NULL DEFAULT 1,
        next_plan_id bigint NOT NULL DEFAULT 1,
        opening boolean NOT NULL DEFAULT false,  -- started for a message not stored yet
        inherit boolean NOT NULL DEFAULT true  -- false once its session is deleted (a new one starts clean)
    );
    -- at most one active run per key: a constraint, not a hope
    CREATE UNIQUE INDEX runs_one_active_per_key ON runs (session_key) WHERE status IN ('running', 'paused');
    CREATE INDEX runs_by_key ON runs (session_key, created_at DESC, run_id DESC);
    CREATE INDEX runs_by_time ON runs (created_at DESC, run_id DESC);

    CREATE TABLE entries (key text PRIMARY KEY, body json NOT NULL);

    CREATE TABLE messages (
        run_id text NOT NULL REFERENCES runs ON DELETE CASCADE,
        seq bigint NOT NULL,
        created_at text NOT NULL,
        client_message_id text,
        reply_to bigint,
        record json NOT NULL,
        PRIMARY KEY (run_id, seq)
    );
    CREATE INDEX messages_by_delivery ON messages (run_id, client_message_id) WHERE client_message_id IS NOT NULL;

    CREATE TABLE context_lines (
        run_id text NOT NULL REFERENCES runs ON DELETE CASCADE,
        pos bigint NOT NULL,
        line json NOT NULL,
        PRIMARY KEY (run_id, pos)
    );
    CREATE TABLE summaries (
        run_id text NOT NULL REFERENCES runs ON DELETE CASCADE,
        id bigint NOT NULL,
        record json NOT NULL,
        PRIMARY KEY (run_id, id)
    );
    CREATE TABLE context_archives (
        run_id text NOT NULL REFERENCES runs ON DELETE CASCADE,
        name text NOT NULL,
        lines json NOT NULL,
        PRIMARY KEY (run_id, name)
    );
    CREATE TABLE tool_calls (
        run_id text NOT NULL REFERENCES runs ON DELETE CASCADE,
        seq bigint NOT NULL,
        record json NOT NULL,
        PRIMARY KEY (run_id, seq)
    );
    CREATE TABLE plans (
        run_id text NOT NULL REFERENCES runs ON DELETE CASCADE,
        id bigint NOT NULL,
        record json NOT NULL,
        PRIMARY KEY (run_id, id)
    );

    CREATE TABLE idempotency (
        session_key text NOT NULL,
        client_message_id text NOT NULL,
        created_at text NOT NULL,
        run_id text,
        message_seq bigint,
        response text,
        PRIMARY KEY (session_key, client_message_id)
    );
    CREATE TABLE hook_deliveries (
        delivery_id text PRIMARY KEY,
        hook text NOT NULL,
        created_at text NOT NULL,
        session_key text,
        message_seq bigint
    );
    CREATE TABLE openai_conversations (
        session_key text PRIMARY KEY,
        epoch bigint NOT NULL,
        base_count bigint NOT NULL,
        request_count bigint NOT NULL,
        request_digest text NOT NULL,
        answered_count bigint NOT NULL,
        answered_digest text NOT NULL,
        answer text,
        updated_at text NOT NULL
    );
    CREATE TABLE openai_responses (
        response_id text PRIMARY KEY,
        ord bigserial NOT NULL,
        session_key text NOT NULL,
        run_id text,
        seq bigint,
        created_at text NOT NULL
    );
    CREATE INDEX openai_responses_latest ON openai_responses (session_key, ord DESC);

    -- what a purge removed (the key and run ids, never the content), so copies and doctors know
    CREATE TABLE purge_tombstones (
        id bigserial PRIMARY KEY,
        session_key text NOT NULL,
        run_id text,
        purged_at text NOT NULL,
        reason text
    );
    """,
    # 2: the history index (a tsvector of the simple configuration, CJK as bigrams; GIN)
    HISTORY_MIGRATION,
    # 3: token usage per UTC day, agent and key (GET /v1/usage, agents.<id>.limits)
    usage_daily.MIGRATION,
    # 4: a purge's totals on its tombstones (what tasks.db's tombstones hold, so a copy carries them)
    """
    ALTER TABLE purge_tombstones ADD COLUMN runs bigint, ADD COLUMN messages bigint;
    """,
    # 5: the scheduled firings a leader has claimed (a cron firing runs once across a takeover)
    CLAIMS_MIGRATION,
    # 6: the history index holds the words of the files index's tokenizer (sessions.history_words):
    # the rows indexed before are emptied, and the next open rebuilds them (the index is empty while
    # messages are stored)
    """
    DELETE FROM history;
    """,
    # 7: when the leader last checked its lock (a lock nobody held lately is led without a grace)
    SEEN_MIGRATION,
)

SCHEMA_VERSION = len(MIGRATIONS)

_VERSION_TABLE = """
CREATE TABLE IF NOT EXISTS neotask_schema (
    version integer PRIMARY KEY,
    applied_at timestamptz NOT NULL DEFAULT now()
)
"""


async def current_version(conn: asyncpg.Connection) -> int:
    exists = await conn.fetchval("SELECT to_regclass('neotask_schema') IS NOT NULL")
    if not exists:
        return 0
    return int(await conn.fetchval("SELECT coalesce(max(version), 0) FROM neotask_schema"))


async def migrate(conn: asyncpg.Connection, where: str) -> int:
    """Apply the migrations the database has not seen, each in its own transaction; the version
    it is at. ``DamagedState`` for a database a newer neotask migrated (nothing is changed)."""
    async with conn.transaction():
        await conn.execute("SELECT pg_advisory_xact_lock($1)", MIGRATION_LOCK)
        await conn.execute(_VERSION_TABLE)
        version = await current_version(conn)
        if version > SCHEMA_VERSION:
            raise DamagedState(
                where,
                f"schema version {version} is newer than this neotask knows ({SCHEMA_VERSION})",
                "upgrade neotask, or point storage.postgres.dsn at a database this version wrote",
            )
        for number, script in enumerate(MIGRATIONS, start=1):
            if number > version:
                await conn.execute(script)
                await conn.execute("INSERT INTO neotask_schema (version) VALUES ($1)", number)
    return SCHEMA_VERSION
