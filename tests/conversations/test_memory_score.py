"""Memory search scores comparable across queries (issue 13, item 16): ``score`` is memory's one
fused score, absolute relevance, so a lone weak match scores low; the gateway adds nothing to it.
Embeddings come from the local OpenAI-compatible server (feature hashing), so no model loads."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import FakeClock
from tests.gateway.helpers import make_app
from tests.support.openai_server import OpenAIServer


async def test_a_single_weak_match_does_not_score_1(
    aiohttp_client: Any, tmp_path: Path, clock: FakeClock, openai_server: OpenAIServer
) -> None:
    workspace = tmp_path / "workspaces/main"
    workspace.mkdir(parents=True)
    (workspace / "MEMORY.md").write_text("# Tea\n\nThe user's favourite tea is genmaicha, brewed at 80 degrees.\n")
    embedding = {"provider": "openai", "base_url": openai_server.base_url, "model": "hash", "dimensions": 256}
    search = {"min_score": 0.0, "min_text_score": 0.0}  # let weak matches through, to see their score
    overrides = {"memory": {"embedding": embedding, "search": search}}
    client = await aiohttp_client(make_app(tmp_path, clock, overrides, base_url=openai_server.base_url))
    async with asyncio.timeout(30):
        while not (await (await client.get("/v1/memory/status")).json())["ready"]:
            await asyncio.sleep(0.05)

    async def results(query: str) -> list[dict[str, Any]]:
        body = await (await client.get("/v1/memory/search", params={"q": query})).json()
        found: list[dict[str, Any]] = body["results"]
        return found

    strong = (await results("favourite tea genmaicha brewed degrees"))[0]
    weak = await results("what does the user drink")
    assert len(weak) == 1  # the lone chunk is first for both queries; only the score tells them apart
    assert weak[0]["score"] < 0.5 < strong["score"] <= 1
    for hit in (strong, weak[0]):
        assert hit["score"] == pytest.approx(0.2 * hit["vector_score"] + 0.8 * hit["text_score"], abs=1e-6)
        assert "rank_score" not in hit  # one score
