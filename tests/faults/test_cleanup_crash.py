"""Issue 10 item 2: ``kill -9`` at any step of archiving never loses a transcript. A real daemon
SIGKILLs itself at each named step (``_NEOTASK_CRASH_AT``, gateway/crashpoints.py); a restarted
daemon's cleanup finishes the job and every run reads back whole, from the API and the archive."""

from __future__ import annotations

import os
import signal
import tarfile
from pathlib import Path

import aiohttp
import pytest

from home.layout import Home
from sessions.files import archive as archives
from sessions.files.archive import STEPS
from tests.faults.ops_support import all_messages, call, write_config
from tests.gateway.daemons import child_env, daemon

pytestmark = pytest.mark.realtime  # reads the real clock: CI runs it at shifted dates too

COUNTS = (3, 5, 8)


def _make_folder(root: Path, run_id: str, lines: int) -> Path:
    folder = root / "completed" / run_id
    (folder / "compactions").mkdir(parents=True)
    (folder / "metadata.json").write_text('{"format_version": 1}\n')
    (folder / "messages.jsonl").write_text("".join(f'{{"seq": {i}}}\n' for i in range(1, lines + 1)))
    (folder / "compactions" / "1.jsonl").write_text("{}\n")
    return folder


def test_an_existing_archive_is_never_replaced(tmp_path: Path) -> None:
    folder = _make_folder(tmp_path, "r1", 5)
    target = tmp_path / "archive" / "r1.tar.gz"
    assert archives.write_archive(folder, target) is True
    before = target.read_bytes()
    (folder / "messages.jsonl").write_text('{"seq": 1}\n')  # what a half-removed folder would pack
    assert archives.write_archive(folder, target) is False
    assert target.read_bytes() == before
    assert len(archives.read_records(target, "r1", "messages.jsonl")) == 5
    assert not list(target.parent.glob(".*.tmp"))


def test_removal_moves_the_folder_aside_in_one_step(tmp_path: Path) -> None:
    folder = _make_folder(tmp_path, "r2", 3)
    seen: list[str] = []

    def step(name: str) -> None:
        seen.append(name)
        if name == "detached":
            assert not folder.exists() and (tmp_path / "archive" / ".removing-r2").is_dir()

    (tmp_path / "archive").mkdir()
    archives.remove_folder(folder, tmp_path / "archive", step=step)
    assert seen == ["detached", "removing"]
    assert not folder.exists() and list((tmp_path / "archive").iterdir()) == []


def test_a_damaged_archive_is_reported_and_kept(tmp_path: Path) -> None:
    target = tmp_path / "r3.tar.gz"
    target.write_bytes(b"\x1f\x8b not really gzip")
    with pytest.raises(archives.ArchiveDamaged):
        archives.archive_ok(target, "r3")
    assert archives.archive_ok(tmp_path / "missing.tar.gz", "missing") is False


async def _fill(http: aiohttp.ClientSession, base: str) -> dict[str, int]:
    runs: dict[str, int] = {}
    for index, count in enumerate(COUNTS):
        key = f"/v1/sessions/agent%3Amain%3Adm%3Apeer{index}"
        for n in range(count):
            status, body = await call(http, "POST", f"{base}{key}/messages", {"content": f"message {n} of {index}"})
            assert status == 200, body
        status, done = await call(http, "POST", f"{base}{key}/complete")
        assert status == 200, done
        run_id = body["run_id"]
        runs[run_id] = len(await all_messages(http, base, run_id))
        assert runs[run_id] >= count
    return runs


@pytest.mark.slow
@pytest.mark.parametrize("crash_at", [*STEPS, "archived+half-removed"])
async def test_kill_at_every_step_of_archiving_loses_no_transcript(tmp_path: Path, crash_at: str) -> None:
    home = tmp_path / "home"
    config = write_config(tmp_path / "config.yaml", {"cleanup": {"retention_days": 0}})
    step = crash_at.split("+")[0]
    async with daemon(home, "--config", str(config), env=child_env(_NEOTASK_CRASH_AT=step)) as gw:
        async with aiohttp.ClientSession() as http:
            runs = await _fill(http, gw.url)
            with pytest.raises(aiohttp.ClientError):
                await call(http, "POST", f"{gw.url}/v1/admin/cleanup")
        assert await gw.wait() == -signal.SIGKILL

    layout = Home(home)
    if crash_at == "archived+half-removed":
        # What the old order left: an archive, and its folder with some files already removed.
        packed = [r for r in runs if layout.archive_file(r).exists()]
        assert len(packed) == 1
        half = layout.run_dir(packed[0], "completed")
        for name in ("messages.jsonl", "current.jsonl"):
            os.unlink(half / name)

    async with daemon(home, "--config", str(config)) as gw, aiohttp.ClientSession() as http:
        status, report = await call(http, "POST", f"{gw.url}/v1/admin/cleanup")
        assert status == 200, report
        assert all(item["done"] for item in report["actions"]), report
        for run_id, count in runs.items():
            messages = await all_messages(http, gw.url, run_id)
            assert [m["seq"] for m in messages] == list(range(1, count + 1)), run_id
            stored = archives.read_records(layout.archive_file(run_id), run_id, "messages.jsonl")
            assert len(stored) == count, run_id
            assert not layout.run_dir(run_id, "completed").exists()
            status, row = await call(http, "GET", f"{gw.url}/v1/runs/{run_id}")
            assert row["archived"] is True
        leftovers = [p.name for p in layout.archive.iterdir() if not p.name.endswith(".tar.gz")]
        assert leftovers == []
        for path in layout.archive.iterdir():
            with tarfile.open(path, "r:gz") as tar:
                assert tar.getmembers()
        status, again = await call(http, "POST", f"{gw.url}/v1/admin/cleanup")
        assert again["actions"] == []
        assert await gw.stop() == 0
