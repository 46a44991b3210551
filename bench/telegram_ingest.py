"""Telegram ingest benchmark: how many updates per second one Telegram account stores
in store-only mode, against the same messages posted to ``POST /v1/messages``, in the same run
and the same daemon process.

One real daemon (``python -m gateway.cli gateway``, store-only, the default fsync ``batch``) has
one Telegram account on the local Bot API server (``tests/support/telegram_server.py``, in this
process), ``dm_policy: open`` and ``session.dm_scope: per-channel-peer``. Per round:

- *telegram*: N direct messages from C senders are queued on the Bot API server at once; the time
  is from then until the connector's ``getUpdates`` carries an offset past the last one (so every
  update is durable: the offset is committed only after the store), as the server received that
  call (not as it answered it: it then long-polls ``poll_timeout_s`` for updates there are none of);
- *http*: the same N messages posted to ``/v1/messages`` by C concurrent clients
  (``bench/channel_ingest.py``).

Rounds alternate the two; the pooled ratio is checked against the target (telegram ≥ 0.8x http).
Every message is then counted in the messages.jsonl files. ``python -m bench.telegram_ingest
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

import yaml

from bench.channel_ingest import alternate, arguments, check, start_daemon
from bench.common import Report, section

TOKEN = "7000:bench-token"
TARGET = 0.8


async def telegram_round(bots: object, messages: int, chats: int, tag: str) -> float:
    from tests.support.telegram_server import TelegramServer

    assert isinstance(bots, TelegramServer)
    bot = bots.bots[TOKEN]
    started = time.monotonic()
    last = 0
    for n in range(messages):
        sender = 10_000 + zlib.crc32(tag.encode()) % 1000 * 1000 + n % chats
        last = bots.message(TOKEN, chat_id=sender, from_id=sender, text=f"message {n} of {tag}: the quick brown fox")
    await bots.wait_for(lambda: bot.confirmed > last, timeout=600)
    # the stand-in wakes the wait only once that getUpdates is answered, after its long poll (poll_timeout_s)
    # with nothing left to return: the round ends when the call confirming the last update came in
    calls = bots.of("getUpdates", TOKEN)
    confirmed_at = min(c.at for c in calls if c.at >= started and int(c.params.get("offset") or 0) > last)
    return messages / (confirmed_at - started)


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
            proc, url = await start_daemon(home, config, {"TG_BENCH": TOKEN})
            try:
                section(f"telegram_ingest: {messages} messages from {chats} senders per phase, {rounds} round(s)")
                tg_round = functools.partial(telegram_round, bots)
                pooled_tg, pooled_http = await alternate(tg_round, url, messages, chats, rounds, channel="telegram",
                                                         prefix="tg", unit="telegram updates/s")  # fmt: skip
            finally:
                proc.terminate()
                await proc.wait()
        return check(report, home, rounds * messages * 2 + 2 * chats, "telegram", pooled_tg, pooled_http, TARGET)


def main(argv: Sequence[str] | None = None) -> int:
    args = arguments("bench.telegram_ingest", __doc__ or "", argv, messages=2000, chats=64, rounds=3, quick=(100, 8, 1))
    return asyncio.run(run(args.messages, args.chats, args.rounds))


if __name__ == "__main__":
    raise SystemExit(main())
