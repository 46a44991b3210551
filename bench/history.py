"""Conversation history benchmarks, each a ratio against a baseline of the same run:

1. ingest with the history index on vs off: appends per second through ``SessionStore.append``
   (64 keys at once, fsync batch), the index fed from the durable appends, rounds interleaved
   (target ≥ 0.9x);
2. search over 1,000,000 indexed messages: p95 of a query mix (rare, middling and common English
   words, Japanese words, two-word queries) (target < 50 ms), and the cost at 1,000,000 vs 10,000
   messages (printed; building the big index takes minutes: ``--rows`` sets it);
3. export of a 100,000-message run, JSON Lines and Markdown, in a child process: peak RSS growth
   over the process's RSS before the export (target < 50 MB).

``python -m bench.history [--quick] [--rows N] [--skip-ingest] [--skip-search] [--skip-export]``
"""

from __future__ import annotations

import asyncio
import json
import random
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

from bench.common import Report, Summary, fmt_seconds, now, parser, print_table, section
from config.clock import system_clock
from config.loader import build_settings, deep_merge, load_defaults
from sessions.files.history import HistoryIndex, connect, create_schema
from sessions.files.history_search import search
from sessions.files.store import SessionStore
from sessions.history_index import HistoryQuery
from sessions.history_text import index_text
from sessions.records import NewMessage, RunStart, RunState, TaskKey
from sessions.store_hooks import StoreHooks

INGEST_LIMIT = 0.9
SEARCH_P95_MS = 50.0
EXPORT_MB = 50.0
WORDS = [f"w{i:05d}" for i in range(20_000)]  # a Zipf vocabulary: w00000 most common
JAPANESE = ["会議", "予算", "東京", "設計", "確認", "障害", "顧客", "契約", "資料", "開発", "週末", "報告"]


def sentence(rng: random.Random) -> str:
    words = [WORDS[min(int(rng.paretovariate(1.1)) - 1, len(WORDS) - 1)] for _ in range(rng.randint(6, 24))]
    if rng.random() < 0.2:
        words.insert(rng.randrange(len(words)), "".join(rng.sample(JAPANESE, 2)) + "について")
    return " ".join(words)


# -- 1. ingest --------------------------------------------------------------------------------------


async def _ingest_round(store: SessionStore, runs: list[RunState], count: int, rng: random.Random) -> float:
    texts = [NewMessage(role="user", content=sentence(rng)) for _ in range(256)]
    start = now()
    done = 0
    while done < count:
        await asyncio.gather(*(store.append(run, texts[(done + i) % len(texts)]) for i, run in enumerate(runs)))
        done += len(runs)
    return done / (now() - start)


async def bench_ingest(report: Report, *, rounds: int, per_round: int, keys: int) -> None:
    section(f"1. ingest with the history index on vs off ({keys} keys at once, {per_round:,} appends a round)")
    settings = build_settings(deep_merge(load_defaults(), {"storage": {"fsync": "batch"}}))
    rng = random.Random(1)
    with tempfile.TemporaryDirectory() as on_home, tempfile.TemporaryDirectory() as off_home:
        stores: dict[str, SessionStore] = {}
        runs: dict[str, list[RunState]] = {}
        history = HistoryIndex(Path(on_home) / "contexts" / "history.db")
        for name, home in (("on", on_home), ("off", off_home)):
            feed = () if name == "off" else (lambda run, rec: history.feed(run.run_id, run.key, run.agent_id, rec),)
            hooks = StoreHooks(durable_listeners=feed)
            store = await SessionStore.open(Path(home), settings, clock=system_clock, hooks=hooks)
            stores[name] = store
            runs[name] = [
                await store.start_run(RunStart(f"agent:main:dm:p{i}", agent_id="main", chat_type="direct", channel=None,
                                      task_key=TaskKey("agent", f"agent:main:dm:p{i}")))
                for i in range(keys)
            ]  # fmt: skip
        await history.open()
        rates: dict[str, list[float]] = {"on": [], "off": []}
        for r in range(rounds):
            order = ("on", "off") if r % 2 == 0 else ("off", "on")
            for name in order:
                rates[name].append(await _ingest_round(stores[name], runs[name], per_round, rng))
        await history.flush()
        indexed = await history.count()
        await history.close()
        for store in stores.values():
            await store.close()
    ratios = [on / off for on, off in zip(rates["on"], rates["off"], strict=True)]
    print_table(
        ["side", "rounds", "median msg/s", "min msg/s", "max msg/s"],
        [[name, len(v), f"{sorted(v)[len(v) // 2]:,.0f}", f"{min(v):,.0f}", f"{max(v):,.0f}"] for name, v in
         rates.items()],
    )  # fmt: skip
    ratios.sort()
    median = ratios[len(ratios) // 2]
    print(f"  per-round ratios on/off: {', '.join(f'{x:.2f}' for x in ratios)}; messages indexed: {indexed:,}")
    report.check("ingest, index on / off (median of rounds), inverted", 1 / median, 1 / INGEST_LIMIT)
    print(f"  (on/off = {median:.3f}x; target ≥ {INGEST_LIMIT}x)")


# -- 2. search --------------------------------------------------------------------------------------


def build_index(path: Path, rows: int, seed: int) -> float:
    """A history.db of ``rows`` synthetic messages over 1,000 keys; seconds taken."""
    rng = random.Random(seed)
    pool = [sentence(rng) for _ in range(min(rows, 100_000))]  # generating text costs more than indexing it
    conn = connect(path)
    conn.execute("PRAGMA synchronous=OFF")
    conn.create_function("index_text", 1, index_text, deterministic=True)
    create_schema(conn)
    start = now()
    batch = 50_000
    sql = ("INSERT INTO messages (run_id, seq, session_key, agent_id, role, timestamp, tool, content)"
           " VALUES (?, ?, ?, ?, ?, ?, 0, ?)")  # fmt: skip
    for first in range(0, rows, batch):
        with conn:
            conn.executemany(sql, [
                (f"run{i % 5000}", i, f"agent:main:dm:p{i % 1000}", "main", "user" if i % 2 else "assistant",
                 f"2026-{1 + i * 11 // rows:02d}-15T10:00:00+00:00", pool[rng.randrange(len(pool))])
                for i in range(first, min(rows, first + batch))
            ])  # fmt: skip
            # the same rows and text the live feed writes (``_insert``), in one statement per batch
            conn.execute("INSERT INTO fts (rowid, body) SELECT id, index_text(content) FROM messages WHERE id > ?",
                         (first,))  # fmt: skip
    conn.execute("INSERT INTO fts (fts) VALUES ('optimize')")
    conn.close()
    return now() - start


def query_mix(rng: random.Random, count: int) -> list[str]:
    out = []
    for i in range(count):
        kind = i % 5
        if kind == 0:
            out.append(WORDS[rng.randrange(5_000, 20_000)])  # rare
        elif kind == 1:
            out.append(WORDS[rng.randrange(100, 5_000)])  # middling
        elif kind == 2:
            out.append(WORDS[rng.randrange(0, 100)])  # common
        elif kind == 3:
            out.append(rng.choice(JAPANESE))
        else:
            out.append(f"{WORDS[rng.randrange(0, 300)]} {WORDS[rng.randrange(300, 3_000)]}")
    return out


def time_queries(path: Path, queries: Sequence[str]) -> list[float]:
    conn = connect(path)
    for q in queries[:10]:  # warm the page cache
        search(conn, HistoryQuery(q=q))
    samples = []
    for q in queries:
        start = now()
        search(conn, HistoryQuery(q=q, limit=20))
        samples.append(now() - start)
    conn.close()
    return samples


def _index(folder: Path, rows: int, seed: int) -> tuple[Path, str]:
    path = folder / f"history-{rows}.db"
    if path.exists():
        return path, "reused"
    seconds = build_index(path, rows, seed)
    return path, f"built in {seconds:.1f} s"


def bench_search(report: Report, *, rows: int, small: int, queries: int, keep: Path | None) -> None:
    section(f"2. search over {rows:,} indexed messages vs {small:,}")
    with tempfile.TemporaryDirectory() as scratch:
        folder = keep or Path(scratch)
        folder.mkdir(parents=True, exist_ok=True)
        small_path, small_how = _index(folder, small, 2)
        big_path, big_how = _index(folder, rows, 1)
        size_mb = big_path.stat().st_size / 1e6
        print(f"  {rows:,} messages {big_how} ({size_mb:,.0f} MB); {small:,} {small_how}")
        mix = query_mix(random.Random(3), queries)
        samples: dict[str, list[float]] = {"small": [], "big": []}
        for part in range(4):  # interleaved quarters, so load spikes hit both sides
            chunk = mix[part::4]
            samples["small"] += time_queries(small_path, chunk)
            samples["big"] += time_queries(big_path, chunk)
    big, little = Summary.of(samples["big"]), Summary.of(samples["small"])
    print_table(
        ["index", "queries", "p50", "p95", "p99", "mean"],
        [[f"{rows:,} messages", big.n, fmt_seconds(big.p50), fmt_seconds(big.p95), fmt_seconds(big.p99),
          fmt_seconds(big.mean)],
         [f"{small:,} messages", little.n, fmt_seconds(little.p50), fmt_seconds(little.p95), fmt_seconds(little.p99),
          fmt_seconds(little.mean)]],
    )  # fmt: skip
    print(f"  cost at {rows:,} vs {small:,}: p50 {big.p50 / little.p50:.1f}x, p95 {big.p95 / little.p95:.1f}x")
    report.check(f"search p95 at {rows:,} messages", big.p95 * 1000, SEARCH_P95_MS, unit=" ms", digits=1)


# -- 3. export --------------------------------------------------------------------------------------

_CHILD = """
import json, sys
from pathlib import Path
from sessions.export_lines import export_lines
from sessions.exports import RunExport
from sessions.files.export import FolderReader
from sessions.files.history_sources import RunSource

def peak_kb():
    for line in open("/proc/self/status"):
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
    return 0

folder, fmt = Path(sys.argv[1]), sys.argv[2]
run = RunExport({"uuid": folder.name, "session_key": "agent:main:main", "status": "completed"},
                FolderReader(RunSource(folder.name, "agent:main:main", "main", folder=folder)))
before = peak_kb()
written = 0
with open("/dev/null", "w", encoding="utf-8") as out:
    for line in export_lines([run], fmt, title="bench"):
        written += len(line)
        out.write(line)
print(json.dumps({"before_kb": before, "after_kb": peak_kb(), "chars": written}))
"""


def write_run(folder: Path, messages: int) -> int:
    folder.mkdir(parents=True)
    rng = random.Random(4)
    size = 0
    with (folder / "messages.jsonl").open("w", encoding="utf-8") as out:
        for seq in range(1, messages + 1):
            line = json.dumps({"seq": seq, "role": "user" if seq % 2 else "assistant", "content": sentence(rng),
                               "timestamp": f"2026-11-30T10:{seq % 60:02d}:00+00:00", "tokens": 30},
                              ensure_ascii=False) + "\n"  # fmt: skip
            size += len(line.encode())
            out.write(line)
    summaries = [{"id": n, "type": "compaction", "summary": f"summary {n}", "created_at": f"2026-11-30T10:{n:02d}:30",
                  "start_seq": 1, "end_seq": n * 100} for n in range(1, 40)]  # fmt: skip
    (folder / "summaries.jsonl").write_text("".join(json.dumps(s) + "\n" for s in summaries), encoding="utf-8")
    (folder / "final_summary.txt").write_text("the final summary", encoding="utf-8")
    return size


def bench_export(report: Report, *, messages: int) -> None:
    section(f"3. export of a {messages:,}-message run (child process, peak RSS growth)")
    with tempfile.TemporaryDirectory() as folder:
        run = Path(folder) / "run-00000000"
        size = write_run(run, messages)
        rows = []
        worst = 0.0
        for fmt in ("jsonl", "md"):
            start = now()
            done = subprocess.run([sys.executable, "-c", _CHILD, str(run), fmt], capture_output=True, text=True,
                                  check=True, cwd=Path(__file__).resolve().parent.parent)  # fmt: skip
            elapsed = now() - start
            body = json.loads(done.stdout)
            growth = (body["after_kb"] - body["before_kb"]) / 1024
            worst = max(worst, growth)
            rows.append([fmt, f"{size / 1e6:.1f} MB", f"{body['chars'] / 1e6:.1f} M chars", f"{elapsed:.1f} s",
                         f"{body['before_kb'] / 1024:.1f} MB", f"{growth:.1f} MB"])  # fmt: skip
        print_table(["format", "messages.jsonl", "exported", "time", "RSS before", "peak growth"], rows)
    report.check("export peak RSS growth (worst format)", worst, EXPORT_MB, unit=" MB", digits=1)


def main(argv: Sequence[str] | None = None) -> int:
    cli = parser("python -m bench.history", __doc__ or "")
    cli.add_argument("--rows", type=int, default=None, help="messages in the big search index (default 1,000,000)")
    cli.add_argument("--keep", default=None, help="keep the built search indexes in this folder and reuse them")
    cli.add_argument("--skip-ingest", action="store_true")
    cli.add_argument("--skip-search", action="store_true")
    cli.add_argument("--skip-export", action="store_true")
    args = cli.parse_args(argv)
    report = Report("bench.history")
    if not args.skip_ingest:
        rounds, per_round = (4, 512) if args.quick else (10, 4096)
        asyncio.run(bench_ingest(report, rounds=rounds, per_round=per_round, keys=64))
    if not args.skip_search:
        rows = args.rows or (20_000 if args.quick else 1_000_000)
        bench_search(report, rows=rows, small=min(10_000, rows), queries=100 if args.quick else 1_000,
                     keep=Path(args.keep) if args.keep else None)  # fmt: skip
    if not args.skip_export:
        bench_export(report, messages=5_000 if args.quick else 100_000)
    return report.finish()


if __name__ == "__main__":
    sys.exit(main())
