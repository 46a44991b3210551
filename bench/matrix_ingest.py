"""Matrix ingest benchmark: how many messages per second one Matrix account stores in store-only
mode, against the same messages posted to ``POST /v1/messages``, in the same run and the same
daemon process.

A real Synapse (``tests/support/synapse.py``: ``make synapse`` creates its venv) and one real
daemon (store-only, the default fsync ``batch``) with one Matrix account, ``dm_policy: open`` and
``session.dm_scope: per-channel-peer``; C users each have a direct room with the bot. Per round:

- *matrix*: the account is disabled (a reload), N messages from the C users are sent to the
  homeserver, and the account is enabled again (a reload); the time is from that reload until the
  account has stored all N (``GET /v1/channels``, ``messages_in``): its start, ``whoami``, the
  ``/sync`` from the kept token that holds them, and every message made durable (also shown: the
  rate from the first sync answered, without the account's start). The homeserver's
  own time to accept the messages is not counted (Telegram's benchmark queues its updates on a
  stand-in at once, likewise);
- *http*: the same N messages posted to ``/v1/messages`` by C concurrent clients
  (``bench/channel_ingest.py``).

Rounds alternate the two; the pooled ratio is checked against the target (matrix ≥ 0.8x http). Every
message is then counted in the messages.jsonl files. ``python -m bench.matrix_ingest [--quick]
[--messages N] [--chats C] [--rounds R]``.
"""

from __future__ import annotations

import asyncio
import signal
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import aiohttp
import yaml

from bench.channel_ingest import arguments, check, http_round, pooled, start_daemon
from bench.common import Report, print_table, section

TARGET = 0.8


async def _account(url: str) -> dict[str, Any]:
    async with aiohttp.ClientSession() as http, http.get(f"{url}/v1/channels") as resp:
        accounts = (await resp.json())["accounts"]
    return next(a for a in accounts if a["channel"] == "matrix")


async def _reload(
    proc: asyncio.subprocess.Process, config: Path, data: dict[str, Any], url: str, enabled: bool
) -> None:
    data["channels"]["matrix"]["accounts"]["bench"]["enabled"] = enabled
    config.write_text(yaml.safe_dump(data))
    proc.send_signal(signal.SIGHUP)
    async with asyncio.timeout(120):
        while (await _account(url))["enabled"] != enabled:
            await asyncio.sleep(0.01)


async def matrix_round(
    proc: asyncio.subprocess.Process, config: Path, data: dict[str, Any], url: str, rooms: list[tuple[Any, str]],
    messages: int, tag: str,
) -> tuple[float, float]:  # fmt: skip
    """Messages per second from the reload that starts the account, and from its first sync answered."""
    await _reload(proc, config, data, url, enabled=False)
    per_room = [list(range(i, messages, len(rooms))) for i in range(len(rooms))]

    async def send(user: Any, room: str, numbers: list[int]) -> None:
        for n in numbers:
            await user.say(room, f"message {n} of {tag}: the quick brown fox")

    await asyncio.gather(*(send(user, room, nums) for (user, room), nums in zip(rooms, per_room, strict=True)))
    started = time.perf_counter()
    await _reload(proc, config, data, url, enabled=True)
    connected: float | None = None
    async with asyncio.timeout(600):
        while (account := await _account(url))["messages_in"] < messages:
            if connected is None and account["connected"]:
                connected = time.perf_counter()
            await asyncio.sleep(0.01)
    done = time.perf_counter()
    return messages / (done - started), messages / (done - (connected or started))


async def run(messages: int, chats: int, rounds: int, homeserver: Any = None) -> int:
    """The bench against ``homeserver`` (a started ``tests.support.synapse.Synapse``: the test
    suite's own), or against one it starts and stops."""
    from tests.support.synapse import Synapse, available

    report = Report("matrix_ingest")
    missing = available()
    if missing is not None:
        print(f"matrix_ingest: skipped: {missing}")
        return 0
    with tempfile.TemporaryDirectory(prefix="neotask-bench-mx-") as tmp:
        home = Path(tmp) / "home"
        own = homeserver is None
        if own:
            homeserver = Synapse(Path(tmp) / "synapse")
            await asyncio.to_thread(homeserver.start)
        try:
            bot = await asyncio.to_thread(homeserver.register, "benchbot")
            users = [await asyncio.to_thread(homeserver.register, f"user{i}") for i in range(chats)]
            config = Path(tmp) / "config.yaml"
            account = {"homeserver": homeserver.url, "user_id": bot.user_id, "access_token_env": "MX_BENCH",
                       "dm_policy": "open", "sync_timeout_s": 1}  # fmt: skip
            data: dict[str, Any] = {"session": {"dm_scope": "per-channel-peer"},
                                    "channels": {"matrix": {"accounts": {"bench": account}}}}  # fmt: skip
            config.write_text(yaml.safe_dump(data))
            proc, url = await start_daemon(home, config, {"MX_BENCH": bot.token})
            try:
                section(f"matrix_ingest: {messages} messages from {chats} senders per phase, {rounds} round(s)")
                rooms = [(user, await user.room(bot.user_id, direct=True)) for user in users]
                async with asyncio.timeout(120):
                    for user, room in rooms:
                        while bot.user_id not in await user.members(room):
                            await asyncio.sleep(0.05)
                rows = []
                mx_rates: list[float] = []
                drain_rates: list[float] = []
                http_rates: list[float] = []
                await matrix_round(proc, config, data, url, rooms, chats, "warm-mx")  # connector and keys warm
                await http_round(url, chats, chats, "warm-http", channel="matrix")
                for r in range(rounds):
                    mx, drain = await matrix_round(proc, config, data, url, rooms, messages, f"mx{r}")
                    web = await http_round(url, messages, chats, f"http{r}", channel="matrix")
                    mx_rates.append(mx)
                    drain_rates.append(drain)
                    http_rates.append(web)
                    rows.append((str(r + 1), f"{mx:,.0f}", f"{drain:,.0f}", f"{web:,.0f}", f"{mx / web:.2f}x",
                                 f"{drain / web:.2f}x"))  # fmt: skip
                pooled_mx, pooled_drain, pooled_http = pooled(mx_rates), pooled(drain_rates), pooled(http_rates)
                rows.append(("pooled", f"{pooled_mx:,.0f}", f"{pooled_drain:,.0f}", f"{pooled_http:,.0f}",
                             f"{pooled_mx / pooled_http:.2f}x", f"{pooled_drain / pooled_http:.2f}x"))  # fmt: skip
                print_table(("round", "matrix msgs/s (from start)", "(from first sync)", "/v1/messages msgs/s",
                             "ratio", "ratio from first sync"), rows)  # fmt: skip
            finally:
                proc.terminate()
                await proc.wait()
        finally:
            if own:
                await asyncio.to_thread(homeserver.stop)
        return check(report, home, rounds * messages * 2 + 2 * chats, "matrix", pooled_mx, pooled_http, TARGET)


def main(argv: Sequence[str] | None = None) -> int:
    args = arguments("bench.matrix_ingest", __doc__ or "", argv, messages=1000, chats=32, rounds=3, quick=(60, 4, 1))
    return asyncio.run(run(args.messages, args.chats, args.rounds))


if __name__ == "__main__":
    raise SystemExit(main())
