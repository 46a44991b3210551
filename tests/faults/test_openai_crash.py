"""Issue 24 item 13: a chat completion resent after the daemon was killed stores each message once.

Each message of a resent history carries an id derived from its place in the conversation (the
epoch, the digest of everything up to it), recognised from the run's transcript, and the
conversation record only follows the durable appends. A real daemon SIGKILLs itself at each crash
point of a chat completion (``_NEOTASK_CRASH_AT``, gateway/crashpoints.py); the official ``openai``
client resends the call to a restarted daemon, and every message and answer is in messages.jsonl
once."""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
from collections import Counter
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import openai
import pytest
import yaml

from gateway.crashpoints import CRASH_ENV
from tests.gateway.daemons import Daemon, child_env, daemon, start_daemon
from tests.support.openai_server import OpenAIServer
from tests.support.sdk import warm_openai_sdk

warm_openai_sdk()
pytestmark = [pytest.mark.slow, pytest.mark.timeout(180), pytest.mark.realtime]
TOKEN = "crash-token"
USER = "alice"
KEY = f"agent:main:openai:dm:{USER}"
KILLS = 4
RESTART_TIMEOUT_S = 120.0  # a restart on the loaded 2-core machine can take a while


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


async def _start(home: Path, *args: str) -> Daemon:
    started = await start_daemon(home, *args, wait=False)
    try:
        await started.wait_listening(RESTART_TIMEOUT_S)
    except BaseException:
        started.send(signal.SIGKILL)
        await started.wait()
        raise
    return started


@pytest.mark.timeout(600)
@pytest.mark.allow_blocking  # the clients share this process and its loop with the model server
async def test_clients_resending_histories_through_kills_store_each_message_once(
    tmp_path: Path, server: OpenAIServer
) -> None:
    """The issue's scenario: clients resend their whole histories with the ``openai`` client,
    retrying each call until it is answered, while the daemon is SIGKILLed and restarted."""
    home = tmp_path / "home"
    home.mkdir()
    args = ("--config", str(config(tmp_path, server)))
    current = {"url": ""}
    stop = asyncio.Event()
    answered: list[str] = []
    counts = Counter[str]()

    async def client(n: int) -> None:
        history: list[dict[str, str]] = []
        sdks: dict[str, openai.AsyncOpenAI] = {}
        try:
            turn = 0
            while not stop.is_set():
                text = f"c{n} t{turn}"
                history.append(user(text))
                failed = False
                while True:
                    url = current["url"]
                    sdk = sdks.setdefault(url, openai.AsyncOpenAI(base_url=f"{url}/v1", api_key=TOKEN, max_retries=0,
                                                                  timeout=15))  # fmt: skip
                    counts["calls"] += 1
                    counts["resent after a failure"] += failed
                    try:
                        got = await sdk.chat.completions.create(model="main", messages=history, user=f"c{n}")  # type: ignore[arg-type]
                    except (openai.APIConnectionError, openai.APITimeoutError, openai.InternalServerError):
                        failed = True
                        await asyncio.sleep(0.05)
                        continue
                    break
                assert got.choices[0].message.content == f"echo: {text}"
                counts["turns resent after a failure"] += failed
                history.append(bot(text))
                answered.append(text)
                turn += 1
        finally:
            for sdk in sdks.values():
                await sdk.close()

    running = await _start(home, *args)
    current["url"] = running.url
    load = asyncio.gather(*(client(n) for n in range(6)))
    try:
        for _ in range(KILLS):
            await asyncio.sleep(1.5)
            running.send(signal.SIGKILL)
            await running.wait()
            counts["kills"] += 1
            running = await _start(home, *args)
            current["url"] = running.url
        await asyncio.sleep(1.5)
        stop.set()
        await load
        assert await running.stop() == 0
    finally:
        stop.set()
        with contextlib.suppress(BaseException):
            await asyncio.wait_for(load, 30)
        if running.proc.returncode is None:
            running.send(signal.SIGKILL)
            await running.wait()
    stored_users = Counter(m["content"] for lines in runs(home) for m in lines if m["role"] == "user")
    print(dict(counts), "answered:", len(answered), "runs:", len(runs(home)))
    assert counts["turns resent after a failure"] >= KILLS  # each kill cut at least one call short
    assert twice(home) == []
    assert [t for t in answered if stored_users[t] != 1] == []
    assert len(runs(home)) == 6  # one run per client: no resend diverged


RESPONSES = {
    "killed after the first input item": ("openai:message-stored@1", [user("r1a"), user("r1b")], False),
    "killed after the answer, before the response id is kept": ("openai:answer-stored@2", [user("r1b")], True),
}


@pytest.mark.parametrize("case", list(RESPONSES))
async def test_a_responses_call_resent_after_a_kill_stores_its_input_once(
    tmp_path: Path, server: OpenAIServer, case: str
) -> None:
    """Input continuing a response carries ids derived from that response id: the call resent to
    a restarted daemon stores nothing again (and, answered already, does not ask the model)."""
    step, items, answered = RESPONSES[case]
    home = tmp_path / "home"
    home.mkdir()
    args = ("--config", str(config(tmp_path, server)))
    async with daemon(home, *args, env=child_env(**{CRASH_ENV: step})) as first:
        async with openai.AsyncOpenAI(base_url=f"{first.url}/v1", api_key=TOKEN, max_retries=0) as oa:
            opened = await oa.responses.create(model="main", input="r0", user=USER)
            with pytest.raises(openai.APIConnectionError):
                await oa.responses.create(model="main", input=items, previous_response_id=opened.id)  # type: ignore[arg-type]
        assert await first.wait() == -9
    asked = len(server.chat_requests)
    async with daemon(home, *args) as second:
        async with openai.AsyncOpenAI(base_url=f"{second.url}/v1", api_key=TOKEN, max_retries=0) as oa:
            again = await oa.responses.create(model="main", input=items, previous_response_id=opened.id)  # type: ignore[arg-type]
            assert again.output_text == "echo: r1b"
            assert len(server.chat_requests) == asked + (0 if answered else 1)
            nxt = await oa.responses.create(model="main", input="r2", previous_response_id=again.id)
            assert nxt.output_text == "echo: r2"
        assert await second.stop() == 0
    assert twice(home) == []
    (active,) = runs(home, "running")
    stored_items = [user("r0"), bot("r0"), *items, bot("r1b"), user("r2"), bot("r2")]
    assert [(m["role"], m["content"]) for m in active] == [(m["role"], m["content"]) for m in stored_items]
