"""How to hold a key across gateway processes (``sessions/postgres/keylocks.py``): a
session-level advisory lock on the key's hash vs a row lock (``SELECT ... FOR UPDATE`` on the key's
row in an open transaction), each on a connection held for the hold, as the lease does. Every
hold takes the lock, does one statement's work (``SELECT 1``) and gives it back.

Cases: 64 tasks on 64 keys (no contention: what a lease costs) and 64 tasks on 4 keys (hand-over
between holders). Each on a durable server this script starts; holds/s and p99 per method,
alternated rounds, ratios in the same run.

``python -m bench.key_locks [--seconds S] [--rounds R]``
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from collections.abc import Awaitable, Callable

import asyncpg

from sessions.postgres.keylocks import key_lock_id
from tests.support.postgres import start_server, stop_server

Hold = Callable[[asyncpg.Connection, str], Awaitable[None]]


async def advisory(conn: asyncpg.Connection, key: str) -> None:
    lock = key_lock_id(key)
    await conn.execute("SELECT pg_advisory_lock($1)", lock)
    await conn.fetchval("SELECT 1")
    await conn.execute("SELECT pg_advisory_unlock($1)", lock)


async def row(conn: asyncpg.Connection, key: str) -> None:
    async with conn.transaction():
        await conn.execute("SELECT 1 FROM bench_keys WHERE key = $1 FOR UPDATE", key)
        await conn.fetchval("SELECT 1")


async def phase(pool: asyncpg.Pool, hold: Hold, *, tasks: int, keys: int, seconds: float) -> tuple[float, float]:
    latencies: list[float] = []
    end = time.perf_counter() + seconds

    async def worker(i: int) -> None:
        key = f"agent:main:dm:k{i % keys}"
        async with pool.acquire() as conn:
            while time.perf_counter() < end:
                began = time.perf_counter()
                await hold(conn, key)
                latencies.append(time.perf_counter() - began)

    began = time.perf_counter()
    await asyncio.gather(*(worker(i) for i in range(tasks)))
    elapsed = time.perf_counter() - began
    return len(latencies) / elapsed, statistics.quantiles(latencies, n=100)[98]


async def run(seconds: float, rounds: int) -> None:
    server = await asyncio.to_thread(start_server, durable=True)
    try:
        dsn = await server.database("locks")
        pool = await asyncpg.create_pool(dsn, min_size=64, max_size=64)
        await pool.execute("CREATE TABLE IF NOT EXISTS bench_keys (key text PRIMARY KEY)")
        await pool.execute(
            "INSERT INTO bench_keys SELECT 'agent:main:dm:k' || i FROM generate_series(0, 63) i ON CONFLICT DO NOTHING"
        )
        methods: dict[str, Hold] = {"advisory": advisory, "row": row}
        for tasks, keys in ((64, 64), (64, 4)):
            results: dict[str, list[tuple[float, float]]] = {name: [] for name in methods}
            for r in range(rounds):
                for name in methods if r % 2 == 0 else reversed(methods):
                    results[name].append(await phase(pool, methods[name], tasks=tasks, keys=keys, seconds=seconds))
            rates = {name: statistics.mean(rate for rate, _ in rs) for name, rs in results.items()}
            p99s = {name: max(p for _, p in rs) for name, rs in results.items()}
            print(f"{tasks} tasks on {keys} keys, {rounds}x{seconds:g} s:")
            for name in methods:
                print(f"  {name:8} {rates[name]:8.0f} holds/s  p99 {p99s[name] * 1000:6.2f} ms")
            print(f"  advisory vs row: {rates['advisory'] / rates['row']:.2f}x holds/s")
        await pool.close()
    finally:
        await asyncio.to_thread(stop_server, server)


def main() -> None:
    parser = argparse.ArgumentParser(description="advisory vs row locks for a key held across processes")
    parser.add_argument("--seconds", type=float, default=5)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    asyncio.run(run(args.seconds, args.rounds))


if __name__ == "__main__":
    main()
