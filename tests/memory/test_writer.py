"""One writer of the index: a gateway process that does not lead (``MemoryService.set_writer``)
embeds and writes nothing, is ready at once with the index as it stands, and indexes what changed
meanwhile as soon as it writes (it leads)."""

from __future__ import annotations

import asyncio
from pathlib import Path

from memory import MemoryService
from tests.conftest import FakeClock
from tests.memory.conftest import embedding_inputs, eventually, memory_settings, openai_embedder, write
from tests.support.openai_server import OpenAIServer


async def test_a_process_that_does_not_write_indexes_nothing_until_it_does(
    tmp_path: Path, workspace: Path, openai_server: OpenAIServer, clock: FakeClock
) -> None:
    embedder = openai_embedder(openai_server)
    lance = tmp_path / "memory.lance"
    svc = MemoryService(memory_settings(), {"main": workspace}, lance, clock=clock, embedder=embedder)
    svc.set_writer(False)  # another process leads
    await svc.start()
    try:
        await eventually(lambda: svc.ready)  # ready: the index as it stands (empty here)
        write(workspace, "memory/2026-11-30.md", "The cabin wifi password is hunter2.\n")
        await asyncio.sleep(2.5)  # the watcher and two polling sweeps (poll_seconds: 1) noticed it
        assert svc.status()["files"] == 0 and embedding_inputs(openai_server) == []
        svc.set_writer(True)  # it leads now
        await eventually(lambda: svc.status()["files"] == 4)
        assert any("hunter2" in text for text in embedding_inputs(openai_server))
    finally:
        await svc.close()
        await embedder.close()
