"""A reload that touches ``channels`` while a chat turn is in progress. It used to close the whole
intake: the turn was cancelled, its outbox row stayed pending and the new intake posted the
message again, so the model was called twice and the transcript held the answer twice (a tool the
turn ran would have run twice). Now only the accounts whose settings changed are restarted and
the turn goes on: one model call, one answer stored, one reply sent."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import yaml

from config.loader import load_config
from gateway import keys as K
from gateway.app import create_app
from tests.channels.harness import wait_until
from tests.conftest import FakeClock
from tests.support.openai_server import Hang, OpenAIServer, Reply
from tests.support.slack_server import SlackServer

OWNER = "U0OWNER"
ENV = {"WORK_BOT": "xoxb-work", "WORK_APP": "xapp-work", "OPS_BOT": "xoxb-ops", "OPS_APP": "xapp-ops"}


def _write(home: Path, model: OpenAIServer, slack: SlackServer, work_extra: dict[str, Any]) -> None:
    def account(name: str, **extra: Any) -> dict[str, Any]:
        upper = name.upper()
        return {"bot_token_env": f"{upper}_BOT", "app_token_env": f"{upper}_APP", "api_base": slack.url,
                "mode": "socket", "dm_policy": "allowlist", "allow_from": [OWNER], **extra}  # fmt: skip

    data = {
        "agents": {"main": {"model": {"base_url": model.base_url, "name": "m", "max_retries": 0, "timeout_s": 60}}},
        "channels": {"slack": {"accounts": {"work": account("work", **work_extra), "ops": account("ops")}}},
    }
    (home / "config.yaml").write_text(yaml.safe_dump(data))


async def test_a_reload_of_a_channel_mid_turn_calls_the_model_once_and_answers_once(
    aiohttp_client: Any, tmp_path: Path, clock: FakeClock
) -> None:
    release = asyncio.Event()
    async with OpenAIServer() as model, SlackServer() as slack:
        model.script(Hang(60, then=Reply("the answer"), until=release))
        work = slack.add_app(ENV["WORK_BOT"], ENV["WORK_APP"])
        slack.add_app(ENV["OPS_BOT"], ENV["OPS_APP"])
        _write(tmp_path, model, slack, {})
        app = create_app(load_config(env=ENV, home=tmp_path), clock=clock, env=ENV)
        client = await aiohttp_client(app)
        intake = app[K.SERVICES].channels
        await wait_until(lambda: all(c.status.connected for c in intake.connectors.values()), what="connected")
        ops_before, work_before = intake.connectors[("slack", "ops")], intake.connectors[("slack", "work")]

        slack.message(work, channel="D1", user=OWNER, text="what is the plan?")
        await model.wait_for_requests(1, timeout=30)  # the turn is in progress: the model holds its answer
        _write(tmp_path, model, slack, {"allow_from": [OWNER, "U0FRIEND"]})  # only the work account changes
        resp = await client.post("/v1/admin/config/reload")
        assert resp.status == 200, await resp.text()
        assert "channels.slack.accounts.work.allow_from" in (await resp.json())["changed"]
        assert intake.connectors[("slack", "ops")] is ops_before  # untouched: it kept its connection
        assert intake.connectors[("slack", "work")] is not work_before  # restarted with the new allow_from
        await wait_until(lambda: intake.connectors[("slack", "work")].status.connected, what="reconnected")

        release.set()
        await slack.wait_for(lambda: len(slack.posted("D1")) >= 1)
        await intake.idle()
        await asyncio.sleep(0.3)  # a second post, if one were coming, would follow at once
        assert [str(c.params["text"]) for c in slack.posted("D1")] == ["the answer"]
        assert len(model.chat_requests) == 1, [r.last_user_text for r in model.chat_requests]
        resp = await client.get("/v1/sessions/agent%3Amain%3Amain")
        run_id = (await resp.json())["run_id"]
        messages = (await (await client.get(f"/v1/runs/{run_id}/messages")).json())["messages"]
        assert [(m["role"], m["content"]) for m in messages] == [
            ("user", "what is the plan?"),
            ("assistant", "the answer"),
        ]
        statuses = (await (await client.get("/v1/channels")).json())["accounts"]
        assert sorted(s["account"] for s in statuses) == ["ops", "work"]
