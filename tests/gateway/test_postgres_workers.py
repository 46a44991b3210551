"""``neotask gateway --workers 2`` on the suite's PostgreSQL server (real processes): two worker
processes take posts on the same keys at once and their turns never overlap on a key, seqs stay
contiguous and every acknowledged message is stored once; a worker killed with SIGKILL under load
loses no acknowledged message, frees the keys it held, and the other keeps serving while the
supervisor starts it again; an event stored through one worker reaches the subscribers of both
(once each, a message larger than a notification's payload too), and ``neotask gateway stop``
stops the supervisor and its workers; the files backend refuses ``--workers 2`` with one line."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import os
import re
import signal
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import aiohttp
import asyncpg
import pytest
import yaml
from aiohttp import web

from tests.gateway.daemons import Daemon, child_env, daemon, run_cli
from tests.support.openai_server import OpenAIServer
from tests.support.postgres import DATABASE, PgServer, empty_database

pytestmark = [pytest.mark.slow, pytest.mark.realtime, pytest.mark.timeout(600)]

BEARER = {"Authorization": "Bearer fleet-token"}
START_S = 240.0  # three interpreters importing the gateway on a loaded 2-core machine
_MARK = re.compile(r"<(agent:main:dm:\w+)\|(\d+)>")
_HANDOFF = re.compile(r"worker (\d+): (\d+) post\(s\) stored by the workers owning their keys, (\d+) stored here")


class TimedServer(OpenAIServer):
    """The test model server, noting when each chat request on a key began and ended (the key is
    in the message text: ``<key|n>``)."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.turns: dict[str, list[tuple[float, float]]] = {}

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        began = time.monotonic()
        body = await request.json()
        texts = [json.dumps(m.get("content")) for m in body.get("messages", []) if m.get("role") == "user"]
        keys = {match.group(1) for text in texts for match in _MARK.finditer(text)}
        try:
            return await super()._chat(request)
        finally:
            for key in keys:
                self.turns.setdefault(key, []).append((began, time.monotonic()))


def write_config(
    path: Path, dsn: str, server: OpenAIServer | None = None, gateway: dict[str, Any] | None = None
) -> Path:
    data: dict[str, Any] = {"storage": {"backend": "postgres", "postgres": {"dsn": dsn, "pool_size": 4}}}
    if gateway:
        data["gateway"] = gateway
    if server is not None:
        model = {"base_url": server.base_url, "name": "m", "max_retries": 0, "timeout_s": 120}
        data["agents"] = {"main": {"model": model}}
    path.write_text(yaml.safe_dump(data))
    return path


def metric(text: str, name: str) -> float:
    """The value of one series in a Prometheus exposition."""
    values = [float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(name + " ")]
    assert len(values) == 1, (name, text[:500])
    return values[0]


def workers_of(supervisor: int) -> list[int]:
    """The pids of the supervisor's children (its workers)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError, IndexError, ValueError):
                if int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1]) == supervisor:
                    found.append(int(entry.name))
    return sorted(found)


def cpu_ticks(pid: int) -> int:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])


async def stored(dsn: str) -> dict[str, list[tuple[int, str, str]]]:
    """Per key: (seq, role, content) of every stored message, by seq."""
    conn = await asyncpg.connect(dsn)
    try:
        rows = await conn.fetch(
            "SELECT r.session_key, m.seq, m.record->>'role' AS role, m.record->>'content' AS content"
            " FROM messages m JOIN runs r USING (run_id) ORDER BY r.session_key, m.seq"
        )
    finally:
        await conn.close()
    found: dict[str, list[tuple[int, str, str]]] = {}
    for row in rows:
        found.setdefault(row["session_key"], []).append((row["seq"], row["role"], row["content"]))
    return found


@contextlib.asynccontextmanager
async def two_workers(tmp_path: Path, config: Path) -> AsyncIterator[Daemon]:
    async with daemon(tmp_path / "home", "--config", str(config), "--workers", "2", timeout=START_S) as gw:
        assert len(workers_of(gw.pid)) == 2
        info = json.loads((tmp_path / "home" / "gateway.json").read_text())
        assert info["config_path"] == str(config)  # the file `config reload` takes the token from
        yield gw


def assert_contiguous_and_once(found: dict[str, list[tuple[int, str, str]]], acked: set[tuple[str, str]]) -> None:
    for key, rows in found.items():
        assert [seq for seq, _, _ in rows] == list(range(1, len(rows) + 1)), key
    users = [(key, content) for key, rows in found.items() for _, role, content in rows if role == "user"]
    assert len(users) == len(set(users)), "a message stored twice"
    assert acked <= set(users), f"acknowledged but not stored: {sorted(acked - set(users))[:5]}"


def final_of(stream: str) -> dict[str, Any]:
    """The ``final`` event's body of a streamed answer."""
    finals = [block.split("data: ", 1)[1] for block in stream.split("\n\n") if block.startswith("event: final")]
    assert len(finals) == 1, stream[-500:]
    body: dict[str, Any] = json.loads(finals[0])
    return body


async def test_two_workers_run_turns_on_shared_keys_one_at_a_time(postgres_server: PgServer, tmp_path: Path) -> None:
    dsn = await postgres_server.database(DATABASE)
    await empty_database(dsn)
    keys = [f"agent:main:dm:u{k}" for k in range(4)]
    async with TimedServer(latency_s=0.15) as server:
        config = write_config(tmp_path / "config.yaml", dsn, server)
        async with two_workers(tmp_path, config) as gw:
            pids = workers_of(gw.pid)
            before = {pid: cpu_ticks(pid) for pid in pids}
            acked: set[tuple[str, str]] = set()
            # a new connection per request: the kernel spreads them over both workers' sockets
            async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True)) as http:

                async def post(key: str, n: int) -> None:
                    # whole or streamed, a post goes to its key's owner (gateway/handoff.py), the
                    # streamed one's deltas passed on as they come
                    text = f"<{key}|{n}> hello"
                    url = f"{gw.url}/v1/sessions/{quote(key, safe='')}/messages"
                    async with http.post(url, json={"content": text, "stream": n % 2 == 1}) as resp:
                        assert resp.status == 200, await resp.text()
                        body = final_of(await resp.text()) if n % 2 else await resp.json()
                        assert body["message_seq"] >= 1 and body["reply"]["content"]
                        acked.add((key, text))

                for wave in range(3):
                    await asyncio.gather(*(post(key, wave * 10 + n) for key in keys for n in range(6)))
                used = {pid: cpu_ticks(pid) - before[pid] for pid in pids}

                # a slow turn on a key: messages stored through either worker meanwhile are acknowledged
                # at once (the turn lock is not the key's lease), and a later turn answers them
                server.latency_s = 4.0
                slow = asyncio.create_task(post(keys[0], 90))
                await server.wait_for_requests(len(server.chat_requests) + 1, timeout=60)
                acks: list[float] = []

                async def store_only(n: int) -> None:
                    text = f"<{keys[0]}|{100 + n}> meanwhile"
                    url = f"{gw.url}/v1/sessions/{quote(keys[0], safe='')}/messages"
                    async with http.post(url, json={"content": text, "reply": False}) as resp:
                        assert resp.status == 200, await resp.text()
                        acks.append(time.monotonic())
                        acked.add((keys[0], text))

                await asyncio.gather(*(store_only(n) for n in range(8)))
                await slow
                server.latency_s = 0.15
                await post(keys[0], 91)

                # a reload through the API reaches both workers (it reached the one that took the
                # connection: replies came from the old model, a revoked token was still accepted)
                data = yaml.safe_load(config.read_text())
                data["agents"]["main"]["model"]["name"] = "m2"
                data["gateway"] = {"tokens": ["fleet-token"]}
                config.write_text(yaml.safe_dump(data))
                async with http.post(f"{gw.url}/v1/admin/config/reload") as resp:
                    answer = await resp.json()
                    assert resp.status == 200, answer
                workers = answer["workers"]
                assert sorted(w["worker"] for w in workers) == [1, 2], answer
                for worker in workers:
                    assert {"agents.main.model.name", "gateway.tokens"} <= set(worker["changed"]), worker
                seen = len(server.chat_requests)
                url = f"{gw.url}/v1/sessions/{quote(keys[1], safe='')}/messages"
                for n in range(8):  # new connections: both workers take some
                    text = f"<{keys[1]}|{200 + n}> after"
                    async with http.post(url, json={"content": text}) as resp:
                        assert resp.status == 401, await resp.text()
                    async with http.post(url, json={"content": text}, headers=BEARER) as resp:
                        assert resp.status == 200, await resp.text()
                        acked.add((keys[1], text))
                assert {r.body["model"] for r in server.chat_requests[seen:]} == {"m2"}

                # /metrics counts for the fleet, whichever worker answers (it counted for one)
                await asyncio.sleep(1.5)  # each worker counts what it batched every second
                users = sum(1 for rows in (await stored(dsn)).values() for _, role, _ in rows if role == "user")
                totals = set()
                for _ in range(6):
                    async with http.get(f"{gw.url}/metrics", headers=BEARER) as resp:
                        text = await resp.text()
                    totals.add(metric(text, 'neotask_messages_total{role="user"}'))
                    # the posts handed to their key's owner: each counted by the worker that took it
                    # (answered) and by the one that stored it (served)
                    handed = metric(text, 'neotask_handoffs_total{result="answered"}')
                    assert handed == metric(text, "neotask_handoffs_served_total") > 0, text
                assert totals == {users}, (totals, users)

                # /readyz and /v1/admin/config name every worker and the leader, whichever answers
                leaders = set()
                for _ in range(6):
                    async with http.get(f"{gw.url}/readyz", headers=BEARER) as resp:
                        ready = await resp.json()
                    assert [(w["worker"], w["answering"], w["ready"]) for w in ready["workers"]] == [
                        (1, True, True), (2, True, True)], ready  # fmt: skip
                    assert sum(w["leader"] for w in ready["workers"]) == 1, ready
                    leaders.add(ready["leader_worker"])
                    async with http.get(f"{gw.url}/v1/admin/config", headers=BEARER) as resp:
                        config_view = await resp.json()
                    assert [w["reloads"] for w in config_view["workers"]] == [1, 1], config_view["workers"]
                assert len(leaders) == 1 and leaders <= {1, 2}
                status = await run_cli("gateway", "status", "--home", str(tmp_path / "home"), "--token", "fleet-token")
                said = status.stdout
                assert status.returncode == 0 and said.count("worker ") == 2 and said.count(", leader") == 1, said
            assert await gw.stop(timeout=60) == 0  # the workers' last lines logged
        assert len(acked) == 90
        # the posts went to their key's owner: each worker says at shutdown how many it handed over
        # and stored for the other, and the two agree
        log_text = (tmp_path / "home" / "logs" / "gateway.log").read_text()
        counts = _HANDOFF.findall(log_text)
        assert len(counts) == 2, log_text[-3000:]
        (one, handed1, took1), (two, handed2, took2) = sorted((int(w), int(h), int(t)) for w, h, t in counts)
        assert (one, two) == (1, 2) and handed1 == took2 and handed2 == took1 and handed1 + handed2 > 0, counts
        slow_turn = max(server.turns[keys[0]], key=lambda turn: turn[1] - turn[0])
        assert all(at < slow_turn[1] for at in acks), "a message waited for another worker's turn to be stored"
        assert all(share >= 0.15 * sum(used.values()) for share in used.values()), f"one worker served all: {used}"
        found = await stored(dsn)
        assert sorted(found) == keys
        assert_contiguous_and_once(found, acked)
        for key in keys:
            turns = sorted(server.turns[key])
            overlaps = [(a, b) for a, b in itertools.pairwise(turns) if b[0] < a[1]]
            assert not overlaps, f"turns on {key} overlapped: {overlaps[:3]}"
            assert sum(1 for _, role, _ in found[key] if role == "assistant") == len(turns)


@pytest.mark.parametrize("key_owner", ["hash", "first"])  # first: every post stored by worker 1, the one killed
async def test_a_worker_killed_under_load_loses_no_acknowledged_message(
    postgres_server: PgServer, tmp_path: Path, key_owner: str
) -> None:
    dsn = await postgres_server.database(DATABASE)
    await empty_database(dsn)
    keys = [f"agent:main:dm:k{k}" for k in range(6)]
    async with TimedServer(latency_s=0.05) as server:
        config = write_config(tmp_path / "config.yaml", dsn, server, {"key_owner": key_owner})
        async with two_workers(tmp_path, config) as gw:
            victim, survivor = workers_of(gw.pid)
            acked: set[tuple[str, str]] = set()
            refused: list[dict[str, Any]] = []
            after_kill: list[str] = []
            killed = asyncio.Event()
            stop = asyncio.Event()
            async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True)) as http:

                async def client(c: int) -> None:
                    n = 0
                    while not stop.is_set():
                        key = keys[(c + n) % len(keys)]
                        text = f"<{key}|{c * 100000 + n}> load"
                        n += 1
                        url = f"{gw.url}/v1/sessions/{quote(key, safe='')}/messages"
                        try:
                            async with http.post(url, json={"content": text}) as resp:
                                body = await resp.json()
                        except (aiohttp.ClientError, json.JSONDecodeError):
                            continue  # the killed worker's connection: not acknowledged
                        if resp.status == 200 or (resp.status >= 500 and body["error"].get("stored")):
                            acked.add((key, text))
                            if killed.is_set():
                                after_kill.append(key)
                        elif resp.status < 500:
                            refused.append(body)

                clients = [asyncio.create_task(client(c)) for c in range(8)]
                await asyncio.sleep(3)
                os.kill(victim, signal.SIGKILL)
                killed.set()
                deadline = time.monotonic() + 60
                while len(set(after_kill)) < len(keys) and time.monotonic() < deadline:
                    await asyncio.sleep(0.2)
                stop.set()
                await asyncio.gather(*clients)
            # every key was served after the kill: the victim's keys (and turns) were freed
            assert set(after_kill) == set(keys)
            assert not refused, refused[:3]  # no conflict between the workers' views of a key
            deadline = time.monotonic() + START_S
            while victim in workers_of(gw.pid) or len(workers_of(gw.pid)) < 2:
                assert time.monotonic() < deadline, "the killed worker was not started again"
                await asyncio.sleep(0.5)
            assert survivor in workers_of(gw.pid)
        found = await stored(dsn)
        assert_contiguous_and_once(found, acked)
        assert "exited with status -9" in gw.stderr()


async def read_events(resp: aiohttp.ClientResponse, into: list[dict[str, Any]], ready: asyncio.Event) -> None:
    ready.set()
    while True:
        line = (await resp.content.readline()).decode()
        if not line:
            return
        if line.startswith("data: "):
            event = json.loads(line[6:])
            if event.get("type") == "message":
                into.append(event)


async def test_an_event_stored_through_one_worker_reaches_subscribers_of_both(
    postgres_server: PgServer, tmp_path: Path
) -> None:
    dsn = await postgres_server.database(DATABASE)
    await empty_database(dsn)
    config = write_config(tmp_path / "config.yaml", dsn)
    large = "大" * 6000  # 18000 bytes: over a notification's 8000
    connector = aiohttp.TCPConnector(force_close=True)
    async with two_workers(tmp_path, config) as gw, aiohttp.ClientSession(connector=connector) as http:
        subscribers = []
        readers = []
        for _ in range(10):  # new connections: spread over both workers
            resp = await http.get(f"{gw.url}/v1/events")
            assert resp.status == 200
            events: list[dict[str, Any]] = []
            ready = asyncio.Event()
            readers.append(asyncio.create_task(read_events(resp, events, ready)))
            await ready.wait()
            subscribers.append((resp, events))
        await asyncio.sleep(0.5)
        sent = [f"event {n}" for n in range(12)] + [large]
        for n, text in enumerate(sent):
            key = quote(f"agent:main:dm:e{n % 3}", safe="")
            body = {"content": text, "reply": False}
            async with http.post(f"{gw.url}/v1/sessions/{key}/messages", json=body) as r:
                assert r.status in (200, 201), await r.text()
        deadline = time.monotonic() + 30
        while any(len(events) < len(sent) for _, events in subscribers) and time.monotonic() < deadline:
            await asyncio.sleep(0.1)
        await asyncio.sleep(0.5)  # an echo would come after the event itself
        for resp, _ in subscribers:
            resp.close()
        for task in readers:
            task.cancel()
        await asyncio.gather(*readers, return_exceptions=True)
        workers = workers_of(gw.pid)
        stopped = await run_cli("gateway", "stop", "--home", str(gw.home), env=child_env())
        assert stopped.returncode == 0 and f"gateway stopped (pid {gw.pid})" in stopped.stdout, stopped
        assert await gw.wait() == 0
        assert not (gw.home / "gateway.json").exists()
        assert not any(Path(f"/proc/{pid}").exists() for pid in workers)
    for _, events in subscribers:
        assert sorted(e["content"] for e in events) == sorted(sent)  # each once: no echo from its own worker


async def test_workers_on_the_files_backend_are_refused_with_one_line(tmp_path: Path) -> None:
    home = tmp_path / "home"
    result = await run_cli("gateway", "--home", str(home), "--port", "0", "--workers", "2", env=child_env())
    assert result.returncode == 4, result
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "--workers 2 needs storage.backend: postgres" in lines[0]
    assert not (home / "gateway.json").exists() and not (home / "contexts").exists()
