"""Issue 29 item 4: structured logs. A real daemon with ``logging.format: json``: every line of
its stderr and of logs/gateway.log is a JSON object with time, level, logger, message, request_id,
session_key, run_id and agent; a request's X-Request-Id is echoed (a sane one as given, an insane
one replaced) and names the log lines of that request; the start line gives version, home, backend
and config source."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml

from tests.gateway.daemons import child_env, daemon
from tests.support.openai_server import OpenAIServer, server_error

MAIN = "/v1/sessions/agent%3Amain%3Amain"
FIELDS = {"time", "level", "logger", "message", "request_id", "session_key", "run_id", "agent"}
pytestmark = [pytest.mark.slow, pytest.mark.realtime]


def json_lines(text: str) -> list[dict[str, Any]]:
    lines = [json.loads(line) for line in text.splitlines()]  # every line parses
    for line in lines:
        assert isinstance(line, dict) and set(line) == FIELDS, line
    return lines


@pytest.mark.timeout(120)
async def test_a_real_daemon_logs_json_lines_naming_the_request(tmp_path: Path) -> None:
    home = tmp_path / "home"
    async with OpenAIServer() as server:
        server.script(server_error(500))
        model = {"base_url": server.base_url, "name": "m", "max_retries": 0, "timeout_s": 30}
        config = tmp_path / "config.yaml"
        config.write_text(yaml.safe_dump({"logging": {"format": "json"}, "agents": {"main": {"model": model}}}))
        async with daemon(home, "--config", str(config), env=child_env()) as gw, aiohttp.ClientSession() as http:
            async with http.get(f"{gw.url}/healthz") as resp:
                generated = resp.headers["X-Request-Id"]
                assert resp.status == 200 and generated
            async with http.get(f"{gw.url}/healthz", headers={"X-Request-Id": "bad id\u00e9" + "x" * 200}) as resp:
                replaced = resp.headers["X-Request-Id"]
                assert replaced != generated and " " not in replaced and len(replaced) <= 128
            async with http.get(f"{gw.url}/v1/sessions/nope%3A", headers={"X-Request-Id": "e-1"}) as resp:
                assert resp.status == 400 and resp.headers["X-Request-Id"] == "e-1"  # errors carry it too
                assert (await resp.json())["error"]["request_id"] == "e-1"
            given = "trace-4242:abc"
            async with http.post(
                f"{gw.url}{MAIN}/messages", json={"content": "hello"}, headers={"X-Request-Id": given}
            ) as resp:
                body = await resp.json()
                assert resp.status >= 500, body
                assert resp.headers["X-Request-Id"] == given and body["error"]["request_id"] == given
            async with http.get(f"{gw.url}{MAIN}") as resp:
                run_id = (await resp.json())["run_id"]
            assert await gw.stop() == 0
    for text in (gw.stderr(), (home / "logs" / "gateway.log").read_text(encoding="utf-8")):
        lines = json_lines(text)
        start = [line for line in lines if "starting" in line["message"]]
        assert len(start) == 1 and str(home) in start[0]["message"] and "backend files" in start[0]["message"]
        assert str(config) in start[0]["message"] and start[0]["level"] == "INFO"
        mine = [line for line in lines if line["request_id"] == given]
        assert mine, text
        for line in mine:
            assert line["session_key"] == "agent:main:main" and line["agent"] == "main" and line["run_id"] == run_id
        assert all(line["request_id"] in (None, given) for line in lines)  # no id leaks to another line
