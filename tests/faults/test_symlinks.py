"""Issue 10 item 9: a symlink out of the workspace and ``memory.extra_paths`` is neither served nor
indexed nor written through (real paths decide)."""

from __future__ import annotations

import asyncio
import os
from datetime import date
from pathlib import Path
from typing import Any

import pytest

from config.errors import BadRequest, NotFound
from memory import sources
from tests.conftest import FakeClock
from tests.gateway.helpers import make_app

SECRET = "zebra quartz marmalade 4471"


def _workspace(tmp_path: Path) -> tuple[Path, Path]:
    workspace = tmp_path / "workspaces" / "main"
    (workspace / "memory").mkdir(parents=True)
    (workspace / "MEMORY.md").write_text("# Facts\n\nThe sky is blue.\n")
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.md").write_text(f"# Secret\n\n{SECRET}\n")
    (outside / "passwd").write_text("root:x:0:0:root:/root:/bin/bash\n")
    os.symlink(outside / "passwd", workspace / "memory" / "link.md")
    os.symlink(outside, workspace / "memory" / "elsewhere")  # a folder out of the workspace
    os.symlink(outside / "secret.md", workspace / "memory" / "secret.md")
    return workspace, outside


def test_listing_and_indexing_skip_symlinks_out(tmp_path: Path) -> None:
    workspace, _ = _workspace(tmp_path)
    (workspace / "memory" / "notes.md").write_text("# Notes\n")
    os.symlink(workspace / "memory" / "notes.md", workspace / "memory" / "alias.md")  # stays inside: fine
    assert [f.rel for f in sources.discover(workspace)] == ["MEMORY.md", "memory/alias.md", "memory/notes.md"]


def test_reads_refuse_symlinks_out(tmp_path: Path) -> None:
    workspace, _ = _workspace(tmp_path)
    for rel in ("memory/link.md", "memory/secret.md", "memory/elsewhere/secret.md"):
        with pytest.raises(BadRequest, match="outside"):
            sources.resolve(workspace, rel)
    with pytest.raises(NotFound):
        sources.resolve(workspace, "memory/missing.md")
    listed = workspace / "memory" / "late.md"
    listed.write_text("fine\n")
    roots = sources.allowed_roots(workspace)
    assert sources.read_text_inside(listed, roots) == "fine\n"
    listed.unlink()
    os.symlink(tmp_path / "outside" / "passwd", listed)  # swapped for a symlink after it was listed
    with pytest.raises(BadRequest):
        sources.read_text_inside(listed, roots)


def test_extra_paths_are_allowed_roots(tmp_path: Path) -> None:
    workspace, outside = _workspace(tmp_path)
    found = [f.rel for f in sources.discover(workspace, [str(outside)])]
    assert str(outside / "secret.md") in found
    assert "memory/secret.md" in found  # the link now points inside an allowed root
    assert sources.resolve(workspace, "memory/secret.md", [str(outside)]).abs == workspace / "memory" / "secret.md"


def test_the_daily_log_is_not_written_through_a_symlink_out(tmp_path: Path) -> None:
    workspace, outside = _workspace(tmp_path)
    target = outside / "target.md"
    target.write_text("")
    os.symlink(target, workspace / "memory" / "2026-01-31.md")
    with pytest.raises(BadRequest, match="symlink"):
        sources.append_daily(workspace, "- likes tea", date(2026, 1, 31))
    assert target.read_text() == ""
    assert sources.append_daily(workspace, "- likes tea", date(2026, 2, 1)).appended == 1


@pytest.mark.slow
async def test_the_api_neither_serves_nor_indexes_a_symlink_out(
    aiohttp_client: Any, tmp_path: Path, clock: FakeClock
) -> None:
    _workspace(tmp_path)
    client = await aiohttp_client(make_app(tmp_path, clock))
    for _ in range(1200):
        if (await client.get("/readyz")).status == 200:
            break
        await asyncio.sleep(0.05)
    resp = await client.get("/v1/memory/files/memory/link.md")
    body = await resp.json()
    assert resp.status == 400 and body["error"]["code"] == "invalid_field", body
    assert "root:x" not in await resp.text()
    for rel in ("memory/secret.md", "memory/elsewhere/secret.md"):
        resp = await client.get(f"/v1/memory/files/{rel}")
        assert resp.status == 400 and SECRET not in await resp.text()
    listing = await (await client.get("/v1/memory/files")).json()
    assert [f["path"] for f in listing["files"]] == ["MEMORY.md"]
    found = await (await client.get("/v1/memory/search", params={"q": SECRET})).json()
    assert all(SECRET not in r["snippet"] for r in found["results"]), found
    status = await (await client.get("/v1/memory/status")).json()
    assert "secret" not in str(status)
