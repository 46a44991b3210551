"""Load generators for ``bench.gateway_ingest``: ``wrk`` (C, not the bottleneck) when it is
installed, else a Python aiohttp client (which tops out near 4,000 requests/s on a small machine,
so it flatters a slow server). Both post ``{"content": ...}`` to
``/v1/sessions/{key}/messages`` for a fixed duration, each connection on its own key (or keys)
as far as the key count allows, and return the same ``Phase`` record.

Key assignment, the same for both: with ``keys <= connections`` connection i posts to key
``i % keys``; with more keys, connection (or wrk thread) i rotates through the keys
``k ≡ i (mod workers)``.
"""

from __future__ import annotations

import asyncio
import collections
import math
import os
import re
import shutil
import statistics
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import quote

import aiohttp

HOST = "127.0.0.1"
LUA = Path(__file__).with_name("wrk_post.lua")
SPREAD_LUA = Path(__file__).with_name("wrk_post_spread.lua")  # every request on a key drawn at random
MAX_WRK_THREADS = 64
TIMEOUT_S = 10.0
_WRK_LINE = re.compile(r"^NEOTASK-WRK (.*)$", re.MULTILINE)


@dataclass
class Phase:
    """One timed phase against one server."""

    name: str
    ok: int
    failed: int
    elapsed: float
    p50: float  # seconds
    p99: float
    mean: float
    errors: collections.Counter[str] = field(default_factory=collections.Counter)
    in_flight_at_stop: int = 0  # requests the generator may have sent but not counted (wrk stops mid-flight)
    cpu_s: float = math.nan  # CPU seconds the server process used during the phase (all its threads)

    @property
    def rate(self) -> float:
        return self.ok / self.elapsed if self.elapsed > 0 else 0.0


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process so far (Linux /proc; NaN elsewhere)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return math.nan
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def key_prefix(case: str) -> str:
    """The raw key of key i is ``prefix + str(i)``; distinct per case so each case has its own runs."""
    return f"agent:main:bench:dm:{case}k"


def key_path(prefix: str, i: int) -> str:
    return "/v1/sessions/" + quote(f"{prefix}{i}", safe="") + "/messages"


def worker_keys(worker: int, workers: int, keys: int) -> list[int]:
    if keys <= workers:
        return [worker % keys]
    return list(range(worker, keys, workers))


def wrk_path() -> str | None:
    return shutil.which("wrk")


def wrk_version() -> str:
    exe = wrk_path()
    if exe is None:
        return "wrk (missing)"
    out = subprocess.run([exe, "--version"], capture_output=True, text=True, check=False)
    first = (out.stdout or out.stderr).splitlines()[:1]
    return first[0].split(" Copyright")[0].strip() if first else "wrk"


def wrk_command(
    port: int,
    *,
    connections: int,
    keys: int,
    prefix: str,
    seconds: float,
    tag: str,
    pause_ms: int = 0,
    spread: bool = False,
    ids: bool = False,
) -> list[str]:
    """wrk posting messages as fast as the server answers; with ``pause_ms``, each connection waits
    that long before each request (``wrk_post.lua``'s last argument): a fixed load below saturation; with
    ``spread``, every request goes to a key drawn at random (``wrk_post_spread.lua``), so a key's
    requests come over every connection instead of one; with ``ids``, each message carries a
    ``client_message_id`` of its own (unique per tag)."""
    exe = wrk_path() or "wrk"
    threads = min(connections, MAX_WRK_THREADS)
    script, paced = (SPREAD_LUA if spread else LUA), [str(pause_ms)] if pause_ms else []
    return [
        exe, "-t", str(threads), "-c", str(connections), "-d", f"{max(1, math.ceil(seconds))}s",
        "--timeout", f"{TIMEOUT_S:g}s", "-s", str(script), f"http://{HOST}:{port}",
        "--", str(keys), str(threads), quote(prefix, safe=""), tag, "1" if ids else "0", *paced,
    ]  # fmt: skip


def parse_wrk(name: str, output: str, connections: int) -> Phase:
    """The ``NEOTASK-WRK`` line the Lua script's ``done()`` prints."""
    match = _WRK_LINE.search(output)
    if match is None:
        raise RuntimeError(f"wrk printed no result line: {output[-600:]!r}")
    fields = {k: int(float(v)) for k, v in (item.split("=") for item in match.group(1).split())}
    errors: collections.Counter[str] = collections.Counter()
    for kind in ("status", "connect", "read", "write", "timeout"):
        if fields[kind]:
            errors[f"wrk {kind} errors" if kind != "status" else "HTTP status >= 400"] += fields[kind]
    failed = fields["status"] + fields["connect"] + fields["timeout"]
    return Phase(
        name,
        ok=fields["requests"] - fields["status"],
        failed=failed,
        elapsed=fields["duration_us"] / 1e6,
        p50=fields["p50_us"] / 1e6,
        p99=fields["p99_us"] / 1e6,
        mean=fields["mean_us"] / 1e6,
        errors=errors,
        in_flight_at_stop=connections,
    )


async def wrk_load(
    port: int,
    name: str,
    *,
    connections: int,
    keys: int,
    prefix: str,
    seconds: float,
    tag: str,
    pause_ms: int = 0,
    spread: bool = False,
    ids: bool = False,
) -> Phase:
    cmd = wrk_command(port, connections=connections, keys=keys, prefix=prefix, seconds=seconds, tag=tag,
                      pause_ms=pause_ms, spread=spread, ids=ids)  # fmt: skip
    proc = await asyncio.create_subprocess_exec(*cmd, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    out, err = await asyncio.wait_for(proc.communicate(), timeout=seconds + TIMEOUT_S + 60)
    if proc.returncode != 0:
        raise RuntimeError(f"wrk exited {proc.returncode}: {err.decode(errors='replace')[-600:]}")
    return parse_wrk(name, out.decode(errors="replace"), connections)


async def python_load(
    port: int, name: str, *, connections: int, keys: int, prefix: str, seconds: float, tag: str
) -> Phase:
    """``connections`` workers posting for ``seconds``; every answer is read and checked."""
    loop = asyncio.get_running_loop()
    base = f"http://{HOST}:{port}"
    latencies: list[float] = []
    errors: collections.Counter[str] = collections.Counter()
    stop_at = loop.time() + seconds

    async def worker(i: int, session: aiohttp.ClientSession) -> None:
        urls = [base + key_path(prefix, k) for k in worker_keys(i, connections, keys)]
        n = 0
        while loop.time() < stop_at:
            url = urls[n % len(urls)]
            n += 1
            payload = {"content": f"message {n} of {tag} from worker {i}: the quick brown fox jumps over the lazy dog"}
            started = loop.time()
            try:
                async with session.post(url, json=payload) as resp:
                    body = await resp.read()
                    if resp.status != 200:
                        errors[f"HTTP {resp.status} {body[:120]!r}"] += 1
                        continue
            except aiohttp.ClientError as exc:
                errors[type(exc).__name__] += 1
                continue
            latencies.append(loop.time() - started)

    connector = aiohttp.TCPConnector(limit=connections)
    timeout = aiohttp.ClientTimeout(total=TIMEOUT_S)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        started = loop.time()
        await asyncio.gather(*(worker(i, session) for i in range(connections)))
        elapsed = loop.time() - started
    return Phase(
        name,
        ok=len(latencies),
        failed=sum(errors.values()),
        elapsed=elapsed,
        p50=percentile(latencies, 50),
        p99=percentile(latencies, 99),
        mean=statistics.fmean(latencies) if latencies else math.nan,
        errors=errors,
    )


async def prime(port: int, *, connections: int, keys: int, prefix: str) -> int:
    """One message to every key, ``connections`` at a time (a key's first message starts its
    run, which is not what the timed phases measure); the number acknowledged."""
    base = f"http://{HOST}:{port}"
    gate = asyncio.Semaphore(connections)
    acknowledged = 0

    async def one(session: aiohttp.ClientSession, k: int) -> None:
        nonlocal acknowledged
        async with gate, session.post(base + key_path(prefix, k), json={"content": "the first message"}) as resp:
            await resp.read()
            if resp.status != 200:
                raise RuntimeError(f"priming key {k} got HTTP {resp.status}")
            acknowledged += 1

    connector = aiohttp.TCPConnector(limit=connections)
    async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=120)) as session:
        await asyncio.gather(*(one(session, k) for k in range(keys)))
    return acknowledged


def percentile(values: list[float], pct: float) -> float:
    ordered = sorted(values)
    if not ordered:
        return math.nan
    position = (len(ordered) - 1) * pct / 100
    low = math.floor(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)
