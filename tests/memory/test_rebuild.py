"""A rebuild after a change of embedder keeps the old index answering, with query vectors of the
model it was built with, until the new index is complete; a rebuild killed midway leaves the old
index usable and restarts, reusing what it had written. Real embedders, real LanceDB folders."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import lancedb
import pytest

from config.clock import system_clock
from memory import Embedder, MemoryService, UniversalSentenceEncoderEmbedder
from memory.embedders import Vectors
from memory.embedders.choice import e5_runs_here
from memory.embedders.routed import RoutedEmbedder
from tests.memory.conftest import eventually, memory_settings, openai_embedder, routed_embedder, write
from tests.support.openai_server import OpenAIServer

pytestmark = [pytest.mark.slow, pytest.mark.realtime]
ROOT = Path(__file__).resolve().parents[2]
FACTS = {
    "MEMORY.md": "# About me\n\nMy dentist is Doctor Alice Wong on Baker Street.\n\n"
    "## Family\n\n夫の誕生日は五月三日です。\n",
    "memory/garden.md": "# Garden\n\nPlant tomatoes and basil in the raised bed in May.\n",
    "memory/work.md": "# Work\n\nThe quarterly budget review moved to Thursday afternoon.\n",
    "memory/car.md": "# Car\n\nThe winter tyres are stored in the garage of my brother.\n",
}


class Held:
    """An embedder whose chunk embedding waits until ``release`` is set (a rebuild held in flight);
    queries and everything else go straight to the real embedder."""

    def __init__(self, inner: Embedder) -> None:
        self._inner = inner
        self.release = asyncio.Event()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    async def embed(self, texts: Sequence[str]) -> Vectors:
        await self.release.wait()
        return await self._inner.embed(texts)


@pytest.fixture(scope="module")
def minilm_use() -> Iterator[RoutedEmbedder]:
    """The embedder of an index from before (MiniLM for English queries, USE for Japanese)."""
    yield from routed_embedder("minilm+use")


def workspace(root: Path, notes: int = 0) -> Path:
    for rel, text in FACTS.items():
        write(root, rel, text)
    for f in range(0, notes, 20):
        sections = [
            f"## Note {i}\n\nNote {i}: item {i} of the inventory sits on shelf {i % 7}." for i in range(f, f + 20)
        ]
        write(root, f"memory/notes-{f // 20}.md", "# Inventory\n\n" + "\n\n".join(sections) + "\n")
    return root


async def build(ws: Path, db: Path, embedder: Embedder) -> None:
    service = MemoryService(memory_settings(), {"main": ws}, db, clock=system_clock, embedder=embedder)
    await service.start()
    try:
        await eventually(lambda: service.ready, timeout=120)
    finally:
        await service.close()


SETTINGS = {"search": {"min_score": 0.0, "min_text_score": 0.0}}


async def kill_midway(ws: Path, db: Path) -> tuple[int, int]:
    """Run the rebuild in a child process and SIGKILL it once at least 64 chunks are embedded but
    not all; the (done, total) it had reached."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    child = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "tests.memory.rebuild_child", str(ws), str(db),
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.DEVNULL, env=env, cwd=ROOT,
    )  # fmt: skip
    assert child.stdout is not None
    try:
        async with asyncio.timeout(180):
            while line := await child.stdout.readline():
                done, total = map(int, line.split())
                if 64 <= done < total:
                    child.send_signal(signal.SIGKILL)
                    await child.wait()
                    return done, total
        raise AssertionError("the child finished before it could be killed midway")
    finally:
        if child.returncode is None:
            child.kill()
            await child.wait()


@pytest.mark.timeout(300)  # a child process loads the models, then the test loads the old ones
@pytest.mark.skipif(not e5_runs_here(), reason="the default is e5+use where E5 runs")
async def test_the_old_index_answers_with_its_own_vectors_until_the_new_one_is_complete(
    tmp_path: Path, minilm_use: RoutedEmbedder, default_embedder: Embedder
) -> None:
    ws, db = workspace(tmp_path / "ws", notes=160), tmp_path / "db"
    await build(ws, db, minilm_use)
    old_tables = sorted(p.stem for p in db.glob("chunks_*"))

    # the rebuild for the default (e5+use) dies midway: the old index is still the active one
    _, total = await kill_midway(ws, db)
    left = [p.stem for p in db.glob("chunks_*") if p.stem not in old_tables]
    assert len(left) == 1  # the table the killed rebuild was writing
    written = lancedb.connect(str(db)).open_table(left[0]).count_rows()
    assert 0 < written < total

    held = Held(default_embedder)
    service = MemoryService(memory_settings(**SETTINGS), {"main": ws}, db, clock=system_clock, embedder=held)  # type: ignore[arg-type]
    await service.start()
    try:
        # the rebuild restarted; held in flight, the old index answers with MiniLM's and USE's vectors
        await eventually(lambda: (service.status()["serving"] or {}).get("vectors"), timeout=120)
        status = service.status()
        assert status["table"] in old_tables and status["identity"]["provider"] == "auto"
        assert status["serving"]["replacing"]["provider"] == "e5+use" and status["serving"]["note"] is None
        assert service.partial
        for q, fact in (("Who looks after my teeth?", "Alice Wong"), ("旦那さんのバースデーはいつ？", "五月三日")):
            hits = await service.search("main", q)
            assert hits and fact in hits[0].snippet and hits[0].vector_score > 0.3, (q, hits[:2])
            assert hits[0].text_score == 0  # found by its vector alone: no word of the query is in it

        held.release.set()
        await eventually(lambda: service.status()["identity"]["provider"] == "e5+use", timeout=120)
        status = service.status()
        assert status["serving"] == {
            "provider": "e5+use", "model": status["identity"]["model"], "vectors": True, "replacing": None,
            "note": None,
        }  # fmt: skip
        # what the killed rebuild wrote is reused: only the rest is embedded
        assert status["chunks"] == total and 0 < status["embedded_total"] <= total - written
        # the old table and the one the kill left are dropped (right after the swap, on the index thread)
        await eventually(lambda: [p.stem for p in db.glob("chunks_*")] == [status["table"]])
        hits = await service.search("main", "Who looks after my teeth?")
        assert hits and "Alice Wong" in hits[0].snippet and hits[0].vector_score > 0.3
        assert not service.partial and not service._previous.loaded  # the old model is released
    finally:
        held.release.set()
        await service.close()


async def test_an_old_index_whose_embedder_cannot_load_answers_by_its_text_and_says_so(
    tmp_path: Path, use_embedder: UniversalSentenceEncoderEmbedder
) -> None:
    ws, db = workspace(tmp_path / "ws"), tmp_path / "db"
    async with OpenAIServer() as server:
        old = openai_embedder(server)
        await build(ws, db, old)
        await old.close()
    # the setting is no longer openai (and its server is gone): the old vectors cannot be queried
    held = Held(use_embedder)
    service = MemoryService(memory_settings(**SETTINGS), {"main": ws}, db, clock=system_clock, embedder=held)  # type: ignore[arg-type]
    await service.start()
    try:
        # the note comes when the old embedder fails to load; the rebuild it waits for starts after
        await eventually(lambda: (service.status()["serving"] or {}).get("note", "").startswith("the index's"))
        await eventually(lambda: service.status()["serving"]["replacing"] is not None)
        serving = service.status()["serving"]
        assert serving["provider"] == "openai" and not serving["vectors"]
        assert serving["replacing"]["provider"] == "universal-sentence-encoder"
        assert "cannot be loaded" in serving["note"] and "text side" in serving["note"]
        hits = await service.search("main", "dentist Alice Wong")
        assert hits and hits[0].path == "MEMORY.md" and hits[0].vector_score == 0
        held.release.set()
        await eventually(lambda: service.status()["serving"]["vectors"])
        assert service.status()["serving"]["provider"] == "universal-sentence-encoder"
        hits = await service.search("main", "dentist Alice Wong")
        assert hits and hits[0].path == "MEMORY.md" and hits[0].vector_score > 0
    finally:
        held.release.set()
        await service.close()
