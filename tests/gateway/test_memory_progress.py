"""`neotask memory index --force` shows real progress (chunks done, rate, time left): offline from the
indexer's callback, online from the daemon's /v1/memory/status while the reindex runs. The
embeddings come from the local OpenAI-compatible server, slowed down so the index takes a while."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from tests.gateway.daemons import child_env, daemon, run_cli
from tests.support.openai_server import OpenAIServer

pytestmark = [pytest.mark.slow, pytest.mark.realtime]
BAR = re.compile(r"\] (\d+)/(\d+) chunks")
RATE = re.compile(r"\] \d+/\d+ chunks, [\d.]+ chunks/s, \d+ s left")  # the rate and the time left, midway


def workspace(home: Path, files: int = 8, sections: int = 12) -> None:
    memory = home / "workspaces/main/memory"
    memory.mkdir(parents=True)
    for f in range(files):
        parts = [
            f"## Topic {f}-{s}\n\nNote {f}-{s}: the {s}th fact about project {f} is unique." for s in range(sections)
        ]
        (memory / f"notes-{f}.md").write_text("# Notes\n\n" + "\n\n".join(parts) + "\n")


def config(tmp_path: Path, server: OpenAIServer) -> Path:
    embedding = {"provider": "openai", "base_url": server.base_url, "model": "hash", "dimensions": 64}
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump({"memory": {"embedding": embedding, "chunk_tokens": 40, "overlap_tokens": 0}}))
    return path


def bars(stderr: str) -> list[tuple[int, int]]:
    return [(int(a), int(b)) for a, b in BAR.findall(stderr)]


async def test_memory_index_force_shows_progress_offline_and_online(tmp_path: Path) -> None:
    home = tmp_path / "home"
    workspace(home)
    async with OpenAIServer(latency_s=0.25) as server:
        cfg = config(tmp_path, server)
        offline = await run_cli("memory", "index", "--force", "--home", str(home), "--config", str(cfg), timeout=120)
        assert offline.returncode == 0, offline.stderr
        seen = bars(offline.stderr)
        total = seen[-1][1]
        assert total >= 64 and seen[-1] == (total, total)
        assert any(0 < done < total for done, _ in seen), f"the bar moved only 0 -> all: {seen}"
        assert RATE.search(offline.stderr), offline.stderr

        async with daemon(home, "--config", str(cfg), env=child_env()) as gw:
            online = await run_cli("memory", "index", "--force", "--home", str(home), "--config", str(cfg),
                                   timeout=120)  # fmt: skip
            assert online.returncode == 0, online.stderr
            seen = bars(online.stderr)
            assert seen and seen[-1] == (total, total)
            assert any(0 < done < total for done, _ in seen), f"no progress shown while the daemon indexed: {seen}"
            assert RATE.search(online.stderr), online.stderr
            assert "indexed:" in online.stdout
            assert await gw.stop() == 0
