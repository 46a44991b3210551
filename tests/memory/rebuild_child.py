"""A rebuild to kill: ``python -m tests.memory.rebuild_child WORKSPACE DB`` indexes WORKSPACE into
the LanceDB folder DB with the default embedder (a rebuild when DB holds another embedder's index),
writing every 32 chunks, and prints ``done total`` after each write (for
``tests/memory/test_rebuild.py``, which kills it midway)."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import memory.indexer
from config.clock import system_clock
from config.settings import MemorySettings
from memory import MemoryService


async def main(workspace: Path, db: Path) -> None:
    memory.indexer.WRITE_GROUP = 32  # a write per embedding call: a kill leaves some of them done
    settings = MemorySettings.model_validate({"watch": {"poll_seconds": 3600}})
    service = MemoryService(settings, {"main": workspace}, db, clock=system_clock, background=False)
    await service.start()
    await service.reindex(progress=lambda done, total: print(done, total, flush=True))
    await service.close()


if __name__ == "__main__":
    asyncio.run(main(Path(sys.argv[1]), Path(sys.argv[2])))
