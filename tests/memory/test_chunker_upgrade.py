"""An index written by the previous chunker (no context, cuts inside words) is rebuilt at start."""

from __future__ import annotations

import json
from pathlib import Path

from memory import MemoryService
from memory.store import POINTER
from memory.table import CHUNKER_VERSION
from tests.conftest import FakeClock
from tests.memory.conftest import eventually, memory_settings, openai_embedder, write
from tests.support.openai_server import OpenAIServer

CHAT = "".join(f"{'Ann' if i % 2 else 'Bob'}: turn number {i} about the garden.\n\n" for i in range(6))


async def test_an_index_of_the_old_chunker_is_rebuilt_with_context(
    tmp_path: Path, workspace: Path, openai_server: OpenAIServer, clock: FakeClock
) -> None:
    write(workspace, "memory/chats/2023-05-08.md", CHAT)
    uri = tmp_path / "memory.lance"
    embedder = openai_embedder(openai_server)
    svc = MemoryService(memory_settings(), {"main": workspace}, uri, clock=clock, embedder=embedder)
    await svc.start()
    await eventually(lambda: svc.ready)
    old_table = svc.status()["table"]
    await svc.close()
    pointer = json.loads((uri / POINTER).read_text())
    pointer["identity"]["chunker"] = CHUNKER_VERSION - 1  # what the previous version wrote
    (uri / POINTER).write_text(json.dumps(pointer))

    svc = MemoryService(memory_settings(), {"main": workspace}, uri, clock=clock, embedder=embedder)
    await svc.start()
    try:
        await eventually(lambda: svc.ready and svc.status()["last_run"])
        status = svc.status()
        assert status["identity"]["chunker"] == CHUNKER_VERSION and status["table"] != old_table
        assert status["last_run"]["rebuilt"], status  # (once seen False under load: say what ran)
        hits = await svc.search("main", "turn number 3 garden", k=3)
        reply = next(h for h in hits if h.snippet.startswith("Ann: turn number 3"))
        assert "turn number 2" not in reply.snippet  # the preceding turn is indexed, not shown
    finally:
        await svc.close()
        await embedder.close()
