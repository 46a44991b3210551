"""What the chat ingest benchmarks (``telegram_ingest``, ``discord_ingest``, ``matrix_ingest``)
share: the daemon they start, the ``/v1/messages`` round each channel is compared with, the rounds
alternated and pooled, the stored messages counted and the checks, the command line.

Each benchmark brings its channel's round: N messages from C senders sent through the platform
(or its stand-in), timed until the daemon has them durable. The baseline round posts the same
number of messages (other senders, so new keys alike) to ``/v1/messages`` from C concurrent
clients, one sender per client, each message with its ``client_message_id``. Rounds alternate the
two so drift on a shared machine hits both; rates are pooled as a harmonic mean.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from pathlib import Path

import aiohttp

from bench.common import Report, parser, print_table


async def start_daemon(home: Path, config: Path, env: Mapping[str, str]) -> tuple[asyncio.subprocess.Process, str]:
    """A store-only daemon (``python -m gateway.cli gateway``) on ``config``, with no ``NEOTASK_*``
    of this process but ``env`` (the accounts' tokens); the process and its URL once it listens."""
    environ = {k: v for k, v in os.environ.items() if not k.startswith("NEOTASK_")}
    environ.update(env, NEOTASK_MEMORY__WATCH__POLL_SECONDS="3600")
    root = Path(__file__).resolve().parents[1]
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "gateway.cli", "gateway", "--home", str(home), "--config", str(config), "--port", "0",
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.DEVNULL, env=environ, cwd=root,
    )  # fmt: skip
    assert proc.stdout is not None
    async with asyncio.timeout(180):
        while True:
            line = (await proc.stdout.readline()).decode()
            if not line:
                raise RuntimeError("the daemon exited before listening")
            if "listening on " in line:
                return proc, line.split("listening on ")[1].split()[0]


async def http_round(url: str, messages: int, chats: int, tag: str, *, channel: str) -> float:
    """Messages per second: ``messages`` posted to ``/v1/messages`` by ``chats`` concurrent clients."""
    per_client = [list(range(i, messages, chats)) for i in range(chats)]

    async def client(i: int, numbers: list[int], http: aiohttp.ClientSession) -> None:
        sender = f"{tag}-{i}"
        for n in numbers:
            text = f"message {n} of {tag}: the quick brown fox"
            body = {"channel": channel, "chat_type": "direct", "chat_id": sender, "sender_id": sender,
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


def pooled(rates: Sequence[float]) -> float:
    """The rate of all the rounds together (each round the same number of messages)."""
    return len(rates) / sum(1 / x for x in rates)


async def alternate(
    channel_round: Callable[[int, int, str], Awaitable[float]], url: str, messages: int, chats: int, rounds: int, *,
    channel: str, prefix: str, unit: str,
) -> tuple[float, float]:  # fmt: skip
    """A warm-up of both (``chats`` messages each), then ``rounds`` rounds of
    ``channel_round(messages, chats, tag)`` and the HTTP round in turn, printed as a table (``unit``: the
    channel's column); the pooled rates, the channel's and HTTP's."""
    rows = []
    channel_rates: list[float] = []
    http_rates: list[float] = []
    await channel_round(chats, chats, f"warm-{prefix}")  # connector and keys warm
    await http_round(url, chats, chats, "warm-http", channel=channel)
    for r in range(rounds):
        rate = await channel_round(messages, chats, f"{prefix}{r}")
        web = await http_round(url, messages, chats, f"http{r}", channel=channel)
        channel_rates.append(rate)
        http_rates.append(web)
        rows.append((str(r + 1), f"{rate:,.0f}", f"{web:,.0f}", f"{rate / web:.2f}x"))
    pooled_channel, pooled_http = pooled(channel_rates), pooled(http_rates)
    rows.append(("pooled", f"{pooled_channel:,.0f}", f"{pooled_http:,.0f}", f"{pooled_channel / pooled_http:.2f}x"))
    print_table(("round", unit, "/v1/messages msgs/s", "ratio"), rows)
    return pooled_channel, pooled_http


def count_stored(home: Path) -> int:
    """The user messages in the home's running sessions."""
    total = 0
    for path in (home / "contexts" / "running").glob("*/messages.jsonl"):
        total += sum(1 for line in path.read_text().splitlines() if json.loads(line)["role"] == "user")
    return total


def check(report: Report, home: Path, expected: int, channel: str, rate: float, http_rate: float, target: float) -> int:
    """Every message stored, and the channel's rate at least ``target`` times HTTP's; the exit status."""
    stored = count_stored(home)
    print(f"  stored user messages: {stored} (expected {expected})")
    report.check("stored messages missing", float(expected - stored), 0.0, unit="", digits=0)
    report.check(f"http / {channel} (target {channel} >= {target}x http)", http_rate / rate, 1 / target)
    return report.finish()


def arguments(
    prog: str, doc: str, argv: Sequence[str] | None, *, messages: int, chats: int, rounds: int,
    quick: tuple[int, int, int], flags: Mapping[str, str] | None = None,
) -> argparse.Namespace:  # fmt: skip
    """``--messages``, ``--chats``, ``--rounds`` (``--quick``: the sizes ``quick``), and the
    benchmark's own on/off ``flags`` (name: help)."""
    p = parser(prog, doc)
    for flag, help_text in (flags or {}).items():
        p.add_argument(flag, action="store_true", help=help_text)
    p.add_argument("--messages", type=int, default=messages)
    p.add_argument("--chats", type=int, default=chats)
    p.add_argument("--rounds", type=int, default=rounds)
    args = p.parse_args(argv)
    if args.quick:
        args.messages, args.chats, args.rounds = quick
    return args
