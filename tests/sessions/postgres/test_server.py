"""The test server itself: a real PostgreSQL, reachable over TCP and over its unix socket."""

from __future__ import annotations

import asyncpg

from tests.support.postgres import PgServer


async def test_the_server_answers_over_tcp_and_its_socket(postgres_server: PgServer) -> None:
    conn = await asyncpg.connect(postgres_server.dsn())
    try:
        assert int(await conn.fetchval("SHOW server_version_num")) >= 150000
        assert await conn.fetchval("SHOW server_encoding") == "UTF8"
    finally:
        await conn.close()
    conn = await asyncpg.connect(host=str(postgres_server.socket_dir), port=postgres_server.port, user="postgres")
    try:
        assert await conn.fetchval("SELECT 1") == 1
    finally:
        await conn.close()
