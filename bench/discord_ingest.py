"""Discord ingest benchmark: how many messages per second one Discord account stores in
store-only mode, against the same messages posted to ``POST /v1/messages``, in the same run and
the same daemon process.

One real daemon (``python -m gateway.cli gateway``, store-only, the default fsync ``batch``) has
one Discord account on the local Discord (``tests/support/discord_server.py``, in this process:
discord.py's gateway connection and REST), ``dm_policy: open`` and ``session.dm_scope:
per-channel-peer``. Per round:

- *discord*: N direct messages from C senders are dispatched over the gateway (MESSAGE_CREATE) at
  once; the time is from then until the account's ``messages_in`` (``GET /v1/channels``, counted
  once a message is durable) has grown by N;
- *http*: the same N messages (other senders, so new keys alike) posted to ``/v1/messages`` by C
  concurrent clients, one sender per client, each message with its ``client_message_id``.

Rounds alternate the two so drift on a shared machine hits both; the pooled ratio is checked
against the target (discord ≥ 0.8x http). Every message is then counted in the messages.jsonl
files. ``python -m bench.discord_ingest [--quick] [--messages N] [--chats C] [--rounds R]``.
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

TOKEN = "MTE.bench.token"
TARGET = 0.8


async def start_daemon(home: Path, config: Path) -> tuple[asyncio.subprocess.Process, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("NEOTASK_")}
    env.update(DISCORD_BENCH=TOKEN, NEOTASK_MEMORY__WATCH__POLL_SECONDS="3600")
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


async def messages_in(url: str) -> int:
    async with aiohttp.ClientSession() as http, http.get(f"{url}/v1/channels") as resp:
        accounts = (await resp.json())["accounts"]
    return int(next(a["messages_in"] for a in accounts if a["channel"] == "discord"))


async def connected(url: str) -> None:
    async with asyncio.timeout(120):
        while True:
            async with aiohttp.ClientSession() as http, http.get(f"{url}/v1/channels") as resp:
                if any(a["connected"] for a in (await resp.json())["accounts"]):
                    return
            await asyncio.sleep(0.1)


async def discord_round(server: object, url: str, messages: int, chats: int, tag: str) -> float:
    from tests.support.discord_server import DiscordServer

    assert isinstance(server, DiscordServer)
    before = await messages_in(url)
    started = time.perf_counter()
    for n in range(messages):
        sender = str(300_000_000_000_000_000 + zlib.crc32(tag.encode()) % 1000 * 1000 + n % chats)
        await server.message(TOKEN, channel=sender, author=sender, text=f"message {n} of {tag}: the quick brown fox")
    while await messages_in(url) < before + messages:
        await asyncio.sleep(0.02)
    return messages / (time.perf_counter() - started)


async def http_round(url: str, messages: int, chats: int, tag: str) -> float:
    per_client = [list(range(i, messages, chats)) for i in range(chats)]

    async def client(i: int, numbers: list[int], http: aiohttp.ClientSession) -> None:
        sender = f"{tag}-{i}"
        for n in numbers:
            text = f"message {n} of {tag}: the quick brown fox"
            body = {"channel": "discord", "chat_type": "direct", "chat_id": sender, "sender_id": sender,
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
    from tests.support.discord_server import DiscordServer

    report = Report("discord_ingest")
    with tempfile.TemporaryDirectory(prefix="neotask-bench-dc-") as tmp:
        home = Path(tmp) / "home"
        async with DiscordServer() as server:
            server.add_bot(TOKEN, "bench")
            config = Path(tmp) / "config.yaml"
            account = {"token_env": "DISCORD_BENCH", "api_base": server.url, "dm_policy": "open"}
            config.write_text(yaml.safe_dump({
                "session": {"dm_scope": "per-channel-peer"},
                "channels": {"discord": {"accounts": {"bench": account}}},
            }))  # fmt: skip
            proc, url = await start_daemon(home, config)
            try:
                await connected(url)
                section(f"discord_ingest: {messages} messages from {chats} senders per phase, {rounds} round(s)")
                rows = []
                dc_rates: list[float] = []
                http_rates: list[float] = []
                await discord_round(server, url, chats, chats, "warm-dc")  # connector and keys warm
                await http_round(url, chats, chats, "warm-http")
                for r in range(rounds):
                    dc = await discord_round(server, url, messages, chats, f"dc{r}")
                    web = await http_round(url, messages, chats, f"http{r}")
                    dc_rates.append(dc)
                    http_rates.append(web)
                    rows.append((str(r + 1), f"{dc:,.0f}", f"{web:,.0f}", f"{dc / web:.2f}x"))
                pooled_dc = len(dc_rates) / sum(1 / x for x in dc_rates)
                pooled_http = len(http_rates) / sum(1 / x for x in http_rates)
                rows.append(("pooled", f"{pooled_dc:,.0f}", f"{pooled_http:,.0f}", f"{pooled_dc / pooled_http:.2f}x"))
                print_table(("round", "discord messages/s", "/v1/messages msgs/s", "ratio"), rows)
            finally:
                proc.terminate()
                await proc.wait()
        expected = rounds * messages * 2 + 2 * chats
        stored = count_stored(home)
        print(f"  stored user messages: {stored} (expected {expected})")
        report.check("stored messages missing", float(expected - stored), 0.0, unit="", digits=0)
        report.check("http / discord (target discord >= 0.8x http)", pooled_http / pooled_dc, 1 / TARGET)
    return report.finish()


def main(argv: Sequence[str] | None = None) -> int:
    p = parser("bench.discord_ingest", __doc__ or "")
    p.add_argument("--messages", type=int, default=2000)
    p.add_argument("--chats", type=int, default=64)
    p.add_argument("--rounds", type=int, default=3)
    args = p.parse_args(argv)
    if args.quick:
        args.messages, args.chats, args.rounds = 100, 8, 1
    return asyncio.run(run(args.messages, args.chats, args.rounds))


if __name__ == "__main__":
    raise SystemExit(main())
