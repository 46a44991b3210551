"""Telegram ingest benchmark: how many updates per second one Telegram account stores
in store-only mode, against the same messages posted to ``POST /v1/messages``, in the same run
and the same daemon process.

One real daemon (``python -m gateway.cli gateway``, store-only, the default fsync ``batch``) has
one Telegram account on the local Bot API server (``tests/support/telegram_server.py``, in this
process), ``dm_policy: open`` and ``session.dm_scope: per-channel-peer``. Per round:

- *telegram*: N direct messages from C senders are queued on the Bot API server at once; the time
  is from then until the connector's ``getUpdates`` carries an offset past the last one (so every
  update is durable: the offset is committed only after the store);
- *http*: the same N messages (other senders, so new keys alike) posted to ``/v1/messages`` by C
  concurrent clients, one sender per client, each message with its ``client_message_id``.

Rounds alternate the two so drift on a shared machine hits both; the pooled ratio is checked
against the target (telegram ≥ 0.8x http). Every message is then counted in the messages.jsonl
files. ``python -m bench.telegram_ingest [--quick] [--messages N] [--chats C] [--rounds R]``.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import tempfile
import time
import zlib
from collections.abc import Sequence
from pathlib import Path

import aiohttp
import yaml

from bench.common import Report, parser, print_table, section

TOKEN = "7000:bench-token"
TARGET = 0.8


async def start_daemon(home: Path, config: Path) -> tuple[asyncio.subprocess.Process, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("NEOTASK_")}
    env.update(TG_BENCH=TOKEN, NEOTASK_MEMORY__WATCH__POLL_SECONDS="3600")
    root = Path(__file__).resolve().parents[1]
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "gateway.cli", "gateway", "--home", str(home), "--config", str(config), "--port", "0",
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.DEVNULL, env=env, cwd=root,
    )  # fmt: skip
    assert proc.stdout is not None
    async with asyncio.timeout(180):
        while True:
            line = (await proc.stdout.readline()).decode()
            if not line:
                raise RuntimeError("the daemon exited before listening")
            if "listening on " in line:
                return proc, line.split("listening on ")[1].split()[0]


async def telegram_round(bots: object, messages: int, chats: int, tag: str) -> float:
    from tests.support.telegram_server import TelegramServer

    assert isinstance(bots, TelegramServer)
    bot = bots.bots[TOKEN]
    started = time.perf_counter()
    last = 0
    for n in range(messages):
        sender = 10_000 + zlib.crc32(tag.encode()) % 1000 * 1000 + n % chats
        last = bots.message(TOKEN, chat_id=sender, from_id=sender, text=f"message {n} of {tag}: the quick brown fox")
    await bots.wait_for(lambda: bot.confirmed > last, timeout=600)
    return messages / (time.perf_counter() - started)


async def http_round(url: str, messages: int, chats: int, tag: str) -> float:
    per_client = [list(range(i, messages, chats)) for i in range(chats)]

    async def client(i: int, numbers: list[int], http: aiohttp.ClientSession) -> None:
        sender = f"{tag}-{i}"
        for n in numbers:
            text = f"message {n} of {tag}: the quick brown fox"
            body = {"channel": "telegram", "chat_type": "direct", "chat_id": sender, "sender_id": sender,
                    "text": text, "client_message_id": f"{tag}:{n}"}  # fmt: skip
            async with http.post(f"{url}/v1/messages", json=body) as resp:
                await resp.read()
                if resp.status != 200:
                    raise RuntimeError(f"HTTP {resp.status}")

    connector = aiohttp.TCPConnector(limit=chats)
    async with aiohttp.ClientSession(connector=connector) as http:
        started = time.perf_counter()
        await asyncio.gather(*(client(i, nums, http) for i, nums in enumerate(per_client)))
        return messages / (time.perf_counter() - started)


def count_stored(home: Path) -> int:
    total = 0
    for path in (home / "contexts" / "running").glob("*/messages.jsonl"):
        total += sum(1 for line in path.read_text().splitlines() if json.loads(line)["role"] == "user")
    return total


async def run(messages: int, chats: int, rounds: int) -> int:
    from tests.support.telegram_server import TelegramServer

    report = Report("telegram_ingest")
    with tempfile.TemporaryDirectory(prefix="neotask-bench-tg-") as tmp:
        home = Path(tmp) / "home"
        async with TelegramServer() as bots:
            bots.add_bot(TOKEN, "bench_bot")
            config = Path(tmp) / "config.yaml"
            account = {"token_env": "TG_BENCH", "api_base": bots.url, "dm_policy": "open", "poll_timeout_s": 1}
            config.write_text(yaml.safe_dump({
                "session": {"dm_scope": "per-channel-peer"},
                "channels": {"telegram": {"accounts": {"bench": account}}},
            }))  # fmt: skip
            proc, url = await start_daemon(home, config)
            try:
                section(f"telegram_ingest: {messages} messages from {chats} senders per phase, {rounds} round(s)")
                rows = []
                tg_rates: list[float] = []
                http_rates: list[float] = []
                await telegram_round(bots, chats, chats, "warm-tg")  # connector and keys warm
                await http_round(url, chats, chats, "warm-http")
                for r in range(rounds):
                    tg = await telegram_round(bots, messages, chats, f"tg{r}")
                    web = await http_round(url, messages, chats, f"http{r}")
                    tg_rates.append(tg)
                    http_rates.append(web)
                    rows.append((str(r + 1), f"{tg:,.0f}", f"{web:,.0f}", f"{tg / web:.2f}x"))
                pooled_tg = len(tg_rates) / sum(1 / x for x in tg_rates)
                pooled_http = len(http_rates) / sum(1 / x for x in http_rates)
                rows.append(("pooled", f"{pooled_tg:,.0f}", f"{pooled_http:,.0f}", f"{pooled_tg / pooled_http:.2f}x"))
                print_table(("round", "telegram updates/s", "/v1/messages msgs/s", "ratio"), rows)
            finally:
                proc.terminate()
                await proc.wait()
        expected = rounds * messages * 2 + 2 * chats
        stored = count_stored(home)
        print(f"  stored user messages: {stored} (expected {expected})")
        report.check("stored messages missing", float(expected - stored), 0.0, unit="", digits=0)
        report.check("http / telegram (target telegram >= 0.8x http)", pooled_http / pooled_tg, 1 / TARGET)
    return report.finish()


def main(argv: Sequence[str] | None = None) -> int:
    p = parser("bench.telegram_ingest", __doc__ or "")
    p.add_argument("--messages", type=int, default=2000)
    p.add_argument("--chats", type=int, default=64)
    p.add_argument("--rounds", type=int, default=3)
    args = p.parse_args(argv)
    if args.quick:
        args.messages, args.chats, args.rounds = 100, 8, 1
    return asyncio.run(run(args.messages, args.chats, args.rounds))


if __name__ == "__main__":
    raise SystemExit(main())
