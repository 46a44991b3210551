"""Matrix ingest benchmark: how many messages per second one Matrix account stores in store-only
mode, against the same messages posted to ``POST /v1/messages``, in the same run and the same
daemon process.

One real daemon (store-only, the default fsync ``batch``) with one Matrix account, ``dm_policy:
open`` and ``session.dm_scope: per-channel-peer``. The homeserver is, by default, the light local
stand-in (``tests/support/matrix_server.py``, in a process of its own, encryption off: it has no
device keys), which hands out events built beforehand as fast as they are asked for; per round:

- *matrix*: C users each make a direct room and invite the bot (joined before the clock starts:
  new senders each round, as the HTTP round's); N messages from them are built on the stand-in
  and put in its stream at once; the time is from then until the connector's ``/sync`` asks from
  a token past the last one (the connector keeps a sync's token only once every message of it is
  durable: Telegram's confirmed offset);
- *http*: the same N messages posted to ``/v1/messages`` by C concurrent clients
  (``bench/channel_ingest.py``).

Beside the rates: the daemon's CPU per message on each path, and the stand-in's CPU during the
matrix rounds (the share of one core: well under 100 % says it is not what limits the round).

``--synapse``: a real Synapse (``tests/support/synapse.py``: ``make synapse`` creates its venv)
instead, encryption as installed. Per round the account is disabled (a reload), N messages from the C
users are sent to the homeserver, and the account is enabled again (a reload); the time is from
that reload until the account has stored all N (``GET /v1/channels``, ``messages_in``): its start,
``whoami``, the ``/sync`` from the kept token that holds them, and every message made durable
(also shown: the rate from the first sync answered, without the account's start). The
homeserver's own time to accept the messages is not counted. Synapse builds that sync answer at
100 % of a core while the daemon waits: this mode measures the homeserver more than the connector.

Rounds alternate the two; the pooled ratio is checked against the target (matrix ≥ 0.8x http). Every
message is then counted in the messages.jsonl files. ``python -m bench.matrix_ingest [--quick]
[--synapse] [--messages N] [--chats C] [--rounds R]``.
"""

from __future__ import annotations

import asyncio
import signal
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import aiohttp
import yaml

from bench.channel_ingest import arguments, check, http_round, pooled, start_daemon
from bench.common import Report, print_table, section
from bench.load import cpu_seconds

TARGET = 0.8
BOT, TOKEN = "@benchbot:localhost", "syt_bench_token"


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
    messages: int, tag: str, homeserver_pid: int,
) -> tuple[float, float, float, float]:  # fmt: skip
    """Messages per second from the reload that starts the account, and from its first sync
    answered; the homeserver's and the daemon's CPU seconds meanwhile."""
    await _reload(proc, config, data, url, enabled=False)
    per_room = [list(range(i, messages, len(rooms))) for i in range(len(rooms))]

    async def send(user: Any, room: str, numbers: list[int]) -> None:
        for n in numbers:
            await user.say(room, f"message {n} of {tag}: the quick brown fox")

    await asyncio.gather(*(send(user, room, nums) for (user, room), nums in zip(rooms, per_room, strict=True)))
    cpu = cpu_seconds(homeserver_pid), cpu_seconds(proc.pid)
    started = time.perf_counter()
    await _reload(proc, config, data, url, enabled=True)
    connected: float | None = None
    async with asyncio.timeout(600):
        while (account := await _account(url))["messages_in"] < messages:
            if connected is None and account["connected"]:
                connected = time.perf_counter()
            await asyncio.sleep(0.01)
    done = time.perf_counter()
    homeserver_cpu, daemon_cpu = cpu_seconds(homeserver_pid) - cpu[0], cpu_seconds(proc.pid) - cpu[1]
    return messages / (done - started), messages / (done - (connected or started)), homeserver_cpu, daemon_cpu


class StandIn:
    """The stand-in homeserver's process, driven over its ``/_standin/`` calls."""

    def __init__(self, proc: asyncio.subprocess.Process, url: str, http: aiohttp.ClientSession) -> None:
        self.proc, self.url, self.http = proc, url, http

    async def call(self, method: str, path: str, body: Any = None) -> Any:
        async with self.http.request(method, f"{self.url}/_standin/{path}", json=body) as resp:
            resp.raise_for_status()
            return await resp.json()

    def cpu(self) -> float:
        return cpu_seconds(self.proc.pid)


async def start_standin() -> tuple[asyncio.subprocess.Process, str]:
    root = Path(__file__).resolve().parents[1]
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "tests.support.matrix_server", "--bot", BOT, "--token", TOKEN,
        stdout=asyncio.subprocess.PIPE, cwd=root,
    )  # fmt: skip
    assert proc.stdout is not None
    async with asyncio.timeout(60):
        line = (await proc.stdout.readline()).decode()
    if "listening on " not in line:
        raise RuntimeError(f"the Matrix stand-in did not start: {line!r}")
    return proc, line.split("listening on ")[1].split()[0]


async def standin_round(server: StandIn, messages: int, chats: int, tag: str) -> tuple[float, float, float]:
    """Messages per second; the stand-in's CPU seconds and the round's seconds."""
    users = [f"@{tag}-{i}:localhost" for i in range(chats)]
    rooms = (await server.call("POST", "rooms", {"users": users}))["rooms"]
    await server.call("GET", "state?joined=all&timeout=120")
    await server.call("POST", "prepare", {"tag": tag, "count": messages, "rooms": rooms})
    cpu = server.cpu()
    started = time.perf_counter()
    position = (await server.call("POST", "release"))["position"]
    await server.call("GET", f"state?confirmed={position}")
    took = time.perf_counter() - started
    return messages / took, server.cpu() - cpu, took


async def run(messages: int, chats: int, rounds: int) -> int:
    """The bench against the stand-in homeserver (it runs in a process of its own)."""
    report = Report("matrix_ingest")
    with tempfile.TemporaryDirectory(prefix="neotask-bench-mx-") as tmp:
        home = Path(tmp) / "home"
        standin, standin_url = await start_standin()
        try:
            config = Path(tmp) / "config.yaml"
            account = {"homeserver": standin_url, "user_id": BOT, "access_token_env": "MX_BENCH",
                       "dm_policy": "open", "sync_timeout_s": 1, "encryption": False}  # fmt: skip
            config.write_text(yaml.safe_dump({"session": {"dm_scope": "per-channel-peer"},
                                              "channels": {"matrix": {"accounts": {"bench": account}}}}))  # fmt: skip
            proc, url = await start_daemon(home, config, {"MX_BENCH": TOKEN})
            try:
                async with aiohttp.ClientSession() as http:
                    server = StandIn(standin, standin_url, http)
                    section(f"matrix_ingest: {messages} messages from {chats} senders per phase, {rounds} round(s),"
                            " local stand-in homeserver, encryption off")  # fmt: skip
                    pooled_mx, pooled_http = await _standin_rounds(server, proc.pid, url, messages, chats, rounds)
            finally:
                proc.terminate()
                await proc.wait()
        finally:
            standin.terminate()
            await standin.wait()
        return check(report, home, rounds * messages * 2 + 2 * chats, "matrix", pooled_mx, pooled_http, TARGET)


async def _standin_rounds(
    server: StandIn, daemon: int, url: str, messages: int, chats: int, rounds: int
) -> tuple[float, float]:
    """The warm-up and the alternated rounds, printed; the pooled rates, matrix's and HTTP's."""
    await standin_round(server, chats, chats, "warm-mx")
    await http_round(url, chats, chats, "warm-http", channel="matrix")
    rows = []
    mx_rates: list[float] = []
    http_rates: list[float] = []
    for r in range(rounds):
        before = cpu_seconds(daemon)
        mx, standin_cpu, took = await standin_round(server, messages, chats, f"mx{r}")
        between = cpu_seconds(daemon)
        web = await http_round(url, messages, chats, f"http{r}", channel="matrix")
        after = cpu_seconds(daemon)
        mx_rates.append(mx)
        http_rates.append(web)
        per = 1e6 / messages
        standin = f"{standin_cpu * 1000:.0f} ms, {standin_cpu / took:.1%}"
        rows.append((str(r + 1), f"{mx:,.0f}", f"{web:,.0f}", f"{mx / web:.2f}x", f"{(between - before) * per:,.0f}",
                     f"{(after - between) * per:,.0f}", standin))  # fmt: skip
    pooled_mx, pooled_http = pooled(mx_rates), pooled(http_rates)
    rows.append(("pooled", f"{pooled_mx:,.0f}", f"{pooled_http:,.0f}", f"{pooled_mx / pooled_http:.2f}x", "", "", ""))
    print_table(("round", "matrix msgs/s", "/v1/messages msgs/s", "ratio", "daemon CPU µs/msg matrix", "http",
                 "stand-in CPU (share of a core)"), rows)  # fmt: skip
    return pooled_mx, pooled_http


async def run_synapse(messages: int, chats: int, rounds: int, homeserver: Any = None) -> int:
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
                pid = homeserver.proc.pid
                await matrix_round(proc, config, data, url, rooms, chats, "warm-mx", pid)  # connector and keys warm
                await http_round(url, chats, chats, "warm-http", channel="matrix")
                for r in range(rounds):
                    mx, drain, synapse_cpu, daemon_cpu = await matrix_round(proc, config, data, url, rooms, messages,
                                                                            f"mx{r}", pid)  # fmt: skip
                    web = await http_round(url, messages, chats, f"http{r}", channel="matrix")
                    mx_rates.append(mx)
                    drain_rates.append(drain)
                    http_rates.append(web)
                    rows.append((str(r + 1), f"{mx:,.0f}", f"{drain:,.0f}", f"{web:,.0f}", f"{mx / web:.2f}x",
                                 f"{drain / web:.2f}x", f"{synapse_cpu / (messages / mx):.0%}",
                                 f"{daemon_cpu / (messages / mx):.0%}"))  # fmt: skip
                pooled_mx, pooled_drain, pooled_http = pooled(mx_rates), pooled(drain_rates), pooled(http_rates)
                rows.append(("pooled", f"{pooled_mx:,.0f}", f"{pooled_drain:,.0f}", f"{pooled_http:,.0f}",
                             f"{pooled_mx / pooled_http:.2f}x", f"{pooled_drain / pooled_http:.2f}x", "",
                             ""))  # fmt: skip
                print_table(("round", "matrix msgs/s (from start)", "(from first sync)", "/v1/messages msgs/s",
                             "ratio", "ratio from first sync", "Synapse CPU (of a core)", "daemon CPU"),
                            rows)  # fmt: skip
            finally:
                proc.terminate()
                await proc.wait()
        finally:
            if own:
                await asyncio.to_thread(homeserver.stop)
        return check(report, home, rounds * messages * 2 + 2 * chats, "matrix", pooled_mx, pooled_http, TARGET)


def main(argv: Sequence[str] | None = None) -> int:
    args = arguments("bench.matrix_ingest", __doc__ or "", argv, messages=1000, chats=32, rounds=3, quick=(60, 4, 1),
                     flags={"--synapse": "a real Synapse as the homeserver (make synapse), not the stand-in"},
                     )  # fmt: skip
    bench = run_synapse if args.synapse else run
    return asyncio.run(bench(args.messages, args.chats, args.rounds))


if __name__ == "__main__":
    raise SystemExit(main())
