"""Issue 24 item 13: a chat completion resent after the daemon was killed stores each message once.

Each message of a resent history carries an id derived from its place in the conversation (the
epoch, the digest of everything up to it), recognised from the run's transcript, and the
conversation record only follows the durable appends. A real daemon SIGKILLs itself at each crash
point of a chat completion (``_NEOTASK_CRASH_AT``, gateway/crashpoints.py); the official ``openai``
client resends the call to a restarted daemon, and every message and answer is in messages.jsonl
once."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import openai
import pytest
import yaml

from gateway.crashpoints import CRASH_ENV
from tests.gateway.daemons import child_env, daemon
from tests.support.openai_server import OpenAIServer
from tests.support.sdk import warm_openai_sdk

warm_openai_sdk()
pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]
TOKEN = "crash-token"
USER = "alice"
KEY = f"agent:main:openai:dm:{USER}"


@pytest.fixture
async def server() -> AsyncIterator[OpenAIServer]:
    async with OpenAIServer() as started:
        yield started


def config(tmp_path: Path, server: OpenAIServer) -> Path:
    data = {
        "gateway": {"tokens": [TOKEN], "openai_compat": {"enabled": True}},
        "agents": {"main": {"model": {"base_url": server.base_url, "name": "test-model", "max_retries": 0}}},
        "compaction": {"memory_flush": {"enabled": False}},
    }
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def runs(home: Path, state: str = "*") -> list[list[dict[str, Any]]]:
    """The lines of each run's messages.jsonl."""
    out = []
    for path in sorted((home / "contexts").glob(f"{state}/*/messages.jsonl")):
        out.append([json.loads(line) for line in path.read_text().splitlines() if line.strip()])
    return out


def twice(home: Path) -> list[tuple[str, str]]:
    """Messages a run holds more than once (a diverged run holds copies of the earlier run's)."""
    out = []
    for lines in runs(home):
        counts = Counter((m["role"], m["content"]) for m in lines)
        out += [what for what, n in counts.items() if n > 1]
    return out


def user(text: str) -> dict[str, str]:
    return {"role": "user", "content": text}


def bot(text: str) -> dict[str, str]:
    return {"role": "assistant", "content": f"echo: {text}"}


# (crash point, the calls that succeed before it, the call cut short by the kill, whether the
# resent call finds its answer stored: then the model is not asked again)
CASES = {
    "a fresh imported history, killed after its first message": (
        "openai:message-stored@1", [], [user("u0"), bot("a0"), user("u1")], False,
    ),
    "a continued history, killed after the answer, before the record": (
        "openai:answer-stored@2", [[user("u0")]], [user("u0"), bot("u0"), user("u1")], True,
    ),
    "a continued history, killed after the record, before the HTTP answer": (
        "openai:record-saved@2", [[user("u0")]], [user("u0"), bot("u0"), user("u1")], True,
    ),
    "a diverged history, killed after its new run holds its first message": (
        "openai:message-stored@1", [[user("u0")]], [user("u0 edited"), bot("u0"), user("u1")], False,
    ),
    "a diverged history, killed after the answer": (
        "openai:answer-stored@2", [[user("u0")]], [user("u0 edited"), bot("u0"), user("u1")], True,
    ),
}  # fmt: skip


@pytest.mark.parametrize("case", list(CASES))
async def test_a_call_resent_after_a_kill_stores_each_message_once(
    tmp_path: Path, server: OpenAIServer, case: str
) -> None:
    step, before, cut, answered = CASES[case]
    home = tmp_path / "home"
    home.mkdir()
    args = ("--config", str(config(tmp_path, server)))
    async with daemon(home, *args, env=child_env(**{CRASH_ENV: step})) as first:
        async with openai.AsyncOpenAI(base_url=f"{first.url}/v1", api_key=TOKEN, max_retries=0) as oa:
            for messages in before:
                await oa.chat.completions.create(model="main", messages=messages, user=USER)  # type: ignore[arg-type]
            with pytest.raises(openai.APIConnectionError):
                await oa.chat.completions.create(model="main", messages=cut, user=USER)  # type: ignore[arg-type]
        assert await first.wait() == -9, "the daemon killed itself at the crash point"
    asked = len(server.chat_requests)
    async with daemon(home, *args) as second:
        async with openai.AsyncOpenAI(base_url=f"{second.url}/v1", api_key=TOKEN, max_retries=0) as oa:
            again = await oa.chat.completions.create(model="main", messages=cut, user=USER)  # type: ignore[arg-type]
            assert again.choices[0].message.content == "echo: u1"
            assert len(server.chat_requests) == asked + (0 if answered else 1)
            assert twice(home) == []
            follow = [*cut, bot("u1"), user("u2")]
            nxt = await oa.chat.completions.create(model="main", messages=follow, user=USER)  # type: ignore[arg-type]
            assert nxt.choices[0].message.content == "echo: u2"
        assert await second.stop() == 0
    assert twice(home) == []
    (active,) = runs(home, "running")
    assert [(m["role"], m["content"]) for m in active] == [(m["role"], m["content"]) for m in follow] + [
        ("assistant", "echo: u2")
    ]
