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
- *http*: the same N messages posted to ``/v1/messages`` by C concurrent clients
  (``bench/channel_ingest.py``).

Rounds alternate the two; the pooled ratio is checked against the target (discord ≥ 0.8x http).
Every message is then counted in the messages.jsonl files. ``python -m bench.discord_ingest
[--quick] [--messages N] [--chats C] [--rounds R]``.
"""

from __future__ import annotations

import asyncio
import functools
import tempfile
import time
import zlib
from collections.abc import Sequence
from pathlib import Path

import aiohttp
import yaml

from bench.channel_ingest import alternate, arguments, check, start_daemon
from bench.common import Report, section

TOKEN = "MTE.bench.token"
TARGET = 0.8


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
            proc, url = await start_daemon(home, config, {"DISCORD_BENCH": TOKEN})
            try:
                await connected(url)
                section(f"discord_ingest: {messages} messages from {chats} senders per phase, {rounds} round(s)")
                dc_round = functools.partial(discord_round, server, url)
                pooled_dc, pooled_http = await alternate(dc_round, url, messages, chats, rounds, channel="discord",
                                                         prefix="dc", unit="discord messages/s")  # fmt: skip
            finally:
                proc.terminate()
                await proc.wait()
        return check(report, home, rounds * messages * 2 + 2 * chats, "discord", pooled_dc, pooled_http, TARGET)


def main(argv: Sequence[str] | None = None) -> int:
    args = arguments("bench.discord_ingest", __doc__ or "", argv, messages=2000, chats=64, rounds=3, quick=(100, 8, 1))
    return asyncio.run(run(args.messages, args.chats, args.rounds))


if __name__ == "__main__":
    raise SystemExit(main())
