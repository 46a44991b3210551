"""Auto-recall of a fact that lives only in a reply of a conversation-shaped memory file, through
``create_app`` with the default embedder, real LanceDB and the real local model server."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from aiohttp.test_utils import TestClient

from tests.conftest import FakeClock
from tests.gateway.helpers import make_app
from tests.support.openai_server import OpenAIServer

Client = TestClient[Any, Any]
MAIN = "/v1/sessions/agent%3Amain%3Amain"

CHIT_CHAT = [
    "Hey! How have you been?",
    "Ugh, this week has been so long.",
    "Haha, that's so you.",
    "Did you see the game last night?",
    "We should grab coffee sometime soon.",
    "Work has been busy but fine.",
    "It rained all day again, typical.",
    "I went for a long walk by the river this morning.",
]


def session(day: str, turns: list[tuple[str, str]]) -> str:
    body = "\n\n".join(f"{who}: {text}" for who, text in turns)
    return f"# Caroline and Melanie, {day}\n\n{body}\n"


def chit_chat(n: int) -> list[tuple[str, str]]:
    return [(("Caroline", "Melanie")[i % 2], CHIT_CHAT[(i * 3) % len(CHIT_CHAT)]) for i in range(n)]


@pytest.mark.slow
@pytest.mark.allow_blocking  # the first model load in this process holds the GIL for a while
async def test_auto_recall_finds_a_fact_told_in_a_reply(
    aiohttp_client: Any, tmp_path: Path, clock: FakeClock, openai_server: OpenAIServer
) -> None:
    chats = tmp_path / "workspaces/main/memory/chats"
    chats.mkdir(parents=True)
    (chats / "2023-05-01.md").write_text(session("1 May 2023", chit_chat(12)))
    (chats / "2023-05-08.md").write_text(
        session(
            "8 May 2023",
            [
                *chit_chat(6),
                ("Melanie", "Are you still going to those pottery classes?"),
                ("Caroline", "Every Thursday! Last week I finally finished a lopsided bowl, pretty proud of it."),
                *chit_chat(6),
            ],
        )
    )
    (chats / "2023-05-20.md").write_text(session("20 May 2023", chit_chat(12)))
    client: Client = await aiohttp_client(make_app(tmp_path, clock, base_url=openai_server.base_url))
    for _ in range(1200):
        if (await (await client.get("/v1/memory/status")).json())["ready"]:
            break
        await asyncio.sleep(0.1)
    else:
        raise AssertionError("the memory index never became ready")

    question = "What did Caroline make in her pottery class?"
    found = (await (await client.get("/v1/memory/search", params={"q": question, "k": 3})).json())["results"]
    # the answer and the question that led to it come first (search.neighbour_weight lifts a turn
    # by a share of its reply's score, so the question may rank just above its answer)
    cited = [h["citation"] for h in found]
    assert set(cited[:2]) == {"memory/chats/2023-05-08.md#L15-L16", "memory/chats/2023-05-08.md#L17-L18"}
    answer = found[cited.index("memory/chats/2023-05-08.md#L17-L18")]
    told = "Caroline: Every Thursday! Last week I finally finished a lopsided bowl, pretty proud of it."
    assert answer["snippet"] == told
    assert "pottery classes" not in answer["snippet"]  # the turn before is indexed, not shown
    assert 0 < answer["score"] < 1

    body = await (await client.post(f"{MAIN}/messages", json={"content": question})).json()
    recalled = [e for e in body["events"] if e["type"] == "memory" and e["action"] == "recall"]
    assert recalled and "memory/chats/2023-05-08.md#L17-L18" in recalled[0]["citations"][:2]
    sent = openai_server.chat_requests[-1].messages
    assert sent[1]["role"] == "system" and "lopsided bowl" in sent[1]["content"]
    assert sent[2] == {"role": "user", "content": question}
