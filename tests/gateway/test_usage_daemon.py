"""Models that fail over, daily token budgets and usage in a real daemon process (issue 29 item 5),
against the real local OpenAI-compatible server scripted to fail."""

from __future__ import annotations

import json
import sqlite3
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml

from tests.gateway.daemons import daemon
from tests.support.openai_server import Behaviour, Fail, OpenAIServer, RecordedRequest, Reply

pytestmark = [pytest.mark.slow, pytest.mark.realtime]
SLOW_START_S = 120  # a start imports torch and LanceDB: on a loaded machine that alone can take a minute


def path(key: str) -> str:
    return "/v1/sessions/" + key.replace(":", "%3A")


def write_config(tmp_path: Path, data: dict[str, Any]) -> Path:
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump(data))
    return config


def tools_of(home: Path, key: str) -> list[dict[str, Any]]:
    sessions = json.loads((home / "contexts" / "sessions.json").read_text())["sessions"]
    run_dir = home / "contexts" / "running" / sessions[key]["run_id"]
    return [json.loads(line) for line in (run_dir / "tools.jsonl").read_text().splitlines()]


def spent(prompt: int, completion: int) -> Reply:
    return Reply(usage={"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion})


async def test_a_failing_model_fails_over_and_each_attempt_is_in_tools_jsonl(tmp_path: Path) -> None:
    home = tmp_path / "home"
    async with OpenAIServer() as server:
        fails: dict[str, list[Behaviour]] = {
            "primary": [Fail(500), Fail(500), Fail(429, "slow down", headers={"Retry-After": "1"}), Fail(503)]
        }

        def rule(request: RecordedRequest) -> Behaviour | None:
            queue = fails.get(str(request.body.get("model")))
            return queue.pop(0) if queue else None

        server.add_rule(rule)
        model = {"base_url": server.base_url, "name": "primary", "max_retries": 1, "backoff_s": 0.05}
        config = write_config(tmp_path, {"agents": {"main": {"model": {**model, "fallbacks": ["backup"]}}}})
        async with daemon(home, "--config", str(config), timeout=SLOW_START_S) as gw, aiohttp.ClientSession() as http:
            async with http.post(f"{gw.url}{path('agent:main:main')}/messages", json={"content": "one"}) as resp:
                assert resp.status == 200, await resp.text()
                assert (await resp.json())["reply"]["content"] == "echo: one"
            started = time.monotonic()
            async with http.post(f"{gw.url}{path('agent:main:main')}/messages", json={"content": "two"}) as resp:
                assert resp.status == 200, await resp.text()
            waited = time.monotonic() - started
        assert waited >= 1.0  # the 429's Retry-After: 1
        models = [r.body["model"] for r in server.chat_requests]
        assert models == ["primary", "primary", "backup", "primary", "primary", "backup"]
    attempts = [t for t in tools_of(home, "agent:main:main") if t.get("kind") == "model_attempt"]
    seen = [
        (t["arguments"]["model"], t["arguments"]["fallback"], t["arguments"]["attempt"], t["status"]) for t in attempts
    ]
    assert seen == [
        ("primary", 0, 1, 500),
        ("primary", 0, 2, 500),
        ("backup", 1, 1, None),
        ("primary", 0, 1, 429),
        ("primary", 0, 2, 503),
        ("backup", 1, 1, None),
    ]
    second = attempts[3:]
    assert second[0]["retry_after_s"] == 1 and second[0]["waited_ms"] == 1000
    assert attempts[0]["error"] and "HTTP 500" in attempts[0]["error"] and attempts[2]["error"] is None


async def test_daily_budgets_refuse_with_429_and_usage_is_kept_per_agent_key_and_day(tmp_path: Path) -> None:
    home = tmp_path / "home"
    today = datetime.now(UTC).date()
    async with OpenAIServer() as server:
        model = {"base_url": server.base_url, "name": "m", "max_retries": 0}
        agents = {
            "main": {"model": model, "limits": {"tokens_per_day": 100}},
            "helper": {"model": model, "limits": {"tokens_per_key_per_day": 40}},
        }
        config = write_config(tmp_path, {"agents": agents, "session": {"dm_scope": "per-peer"}})
        server.script(spent(50, 10), spent(30, 15), spent(20, 25), spent(5, 5))
        async with daemon(home, "--config", str(config), timeout=SLOW_START_S) as gw, aiohttp.ClientSession() as http:

            async def post(key: str, text: str) -> tuple[int, dict[str, Any], aiohttp.typedefs.LooseHeaders]:
                async with http.post(f"{gw.url}{path(key)}/messages", json={"content": text}) as resp:
                    return resp.status, await resp.json(), resp.headers

            assert (await post("agent:main:main", "a"))[0] == 200  # 60 tokens
            assert (await post("agent:main:dm:bob", "b"))[0] == 200  # 45 more: 105, over 100
            status, body, headers = await post("agent:main:main", "refused")
            assert status == 429 and body["error"]["code"] == "token_budget_exhausted"
            message = body["error"]["message"]
            assert "'main'" in message and "105" in message and "tokens_per_day 100" in message
            assert "not stored" in message and "00:00 UTC" in message
            tomorrow = datetime.combine(today + timedelta(days=1), datetime.min.time(), tzinfo=UTC)
            left = (tomorrow - datetime.now(UTC)).total_seconds()
            assert abs(int(headers["Retry-After"]) - left) < 60
            async with http.get(f"{gw.url}{path('agent:main:main')}") as resp:
                assert (await resp.json())["message_count"] == 2  # "a" and its reply: nothing stored
            status, body, _ = await post("agent:main:main", "/status")  # commands still answer
            assert status == 200 and "Tokens" in body["reply"]["content"]

            assert (await post("agent:helper:dm:ann", "c"))[0] == 200  # 45 tokens, over 40 for this key
            status, body, _ = await post("agent:helper:dm:ann", "refused")
            assert status == 429 and "agent:helper:dm:ann" in body["error"]["message"]
            assert "tokens_per_key_per_day 40" in body["error"]["message"]
            assert (await post("agent:helper:dm:cat", "d"))[0] == 200  # another key of the agent still may

            async with http.get(f"{gw.url}/v1/usage") as resp:
                usage = await resp.json()
            rows = {(r["agent"], r["key"]): r for r in usage["usage"]}
            assert {r["day"] for r in usage["usage"]} == {today.isoformat()}
            assert rows["main", "agent:main:main"]["input_tokens"] == 50
            assert rows["main", "agent:main:main"]["output_tokens"] == 10
            assert rows["main", "agent:main:dm:bob"]["total_tokens"] == 45
            assert rows["helper", "agent:helper:dm:ann"]["calls"] == 1
            assert usage["totals"]["total_tokens"] == 60 + 45 + 45 + 10
            assert usage["limits"]["main"] == {"tokens_per_day": 100, "tokens_per_key_per_day": None}

            async with http.get(f"{gw.url}/v1/usage?by=agent&agent=main") as resp:
                by_agent = (await resp.json())["usage"]
            for row in by_agent:  # the server reports repeated prompt prefixes as cached: its figure
                row.pop("cache_read_tokens")
            assert by_agent == [
                {
                    "day": today.isoformat(), "agent": "main", "key": None, "input_tokens": 80, "output_tokens": 25,
                    "cache_write_tokens": 0, "calls": 2, "total_tokens": 105,
                }
            ]  # fmt: skip
            yesterday = (today - timedelta(days=1)).isoformat()
            async with http.get(f"{gw.url}/v1/usage?to={yesterday}") as resp:
                assert (await resp.json())["usage"] == []
            async with http.get(f"{gw.url}/v1/usage?key=agent:helper:dm:cat&from={today}&to={today}") as resp:
                assert [r["total_tokens"] for r in (await resp.json())["usage"]] == [10]
            for query, field in (
                ("from=yesterday", "from"),
                (f"from={today}&to={yesterday}", "from"),
                ("agent=nobody", "agent"),
                ("by=week", "by"),
            ):
                async with http.get(f"{gw.url}/v1/usage?{query}") as resp:
                    error = (await resp.json())["error"]
                    assert resp.status == 400 and error["field"] == field, (query, error)

        # the budget survives a restart: it is in tasks.db
        async with (
            daemon(home, "--config", str(config), timeout=SLOW_START_S) as gw,
            aiohttp.ClientSession() as http,
            http.post(f"{gw.url}{path('agent:main:main')}/messages", json={"content": "again"}) as resp,
        ):
            assert resp.status == 429 and (await resp.json())["error"]["code"] == "token_budget_exhausted"
    db = sqlite3.connect(home / "contexts" / "tasks.db")
    assert db.execute("PRAGMA user_version").fetchone()[0] == 6
    assert db.execute("SELECT SUM(input_tokens + output_tokens) FROM usage_daily").fetchone()[0] == 160
