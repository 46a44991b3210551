"""``neotask cron``, ``neotask sessions cleanup`` and ``neotask memory`` without a daemon (on the
files, under the lock)."""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gateway.cli import main

pytestmark = pytest.mark.realtime  # reads the real clock: CI runs it at shifted dates too


@pytest.fixture(autouse=True)
def _no_neotask_env(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    for name in [n for n in os.environ if n.startswith("NEOTASK_")]:
        monkeypatch.delenv(name)
    yield


async def run(capsys: pytest.CaptureFixture[str], home: Path, *args: str) -> tuple[int, str]:
    capsys.readouterr()
    code = await asyncio.to_thread(main, [*args, "--home", str(home)])
    out, err = capsys.readouterr()
    return code, out + err


async def as_json(capsys: pytest.CaptureFixture[str], home: Path, *args: str) -> Any:
    capsys.readouterr()
    code = await asyncio.to_thread(main, [*args, "--home", str(home), "--json"])
    out, err = capsys.readouterr()
    assert code == 0, err
    return json.loads(out)


def quickest_embedder(home: Path) -> None:
    """The memory commands with the embedder quickest to load (numpy only): these tests are about the
    commands, and the default's E5 (torch, transformers) took most of their time."""
    (home / "config.yaml").write_text(json.dumps({"memory": {"embedding": {"provider": "universal-sentence-encoder"}}}))


async def test_cron_list_and_run_offline(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    home = tmp_path / "home"
    home.mkdir()
    (home / "config.yaml").write_text(
        "cron:\n  jobs:\n    - {id: digest, schedule: '0 9 * * 1-5', timezone: Europe/Berlin, message: digest please}\n"
    )
    listing = await as_json(capsys, home, "cron", "list")
    assert [j["id"] for j in listing["jobs"]] == ["cron:digest"] and listing["jobs"][0]["next_run_at"]
    code, out = await run(capsys, home, "cron", "list")
    assert code == 0 and "cron:digest" in out and "Europe/Berlin" in out
    ran = await as_json(capsys, home, "cron", "run", "digest")
    assert ran["job_id"] == "cron:digest"
    shown = await as_json(capsys, home, "sessions", "show", "cron:digest")
    assert shown["chat_type"] == "cron" and shown["message_count"] == 1
    code, out = await run(capsys, home, "cron", "run", "nope")
    assert code == 1 and "job_not_found" in out


async def test_cleanup_dry_run_then_for_real_offline(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    home = tmp_path / "home"
    home.mkdir()
    (home / "config.yaml").write_text("cleanup: {retention_days: 0}\n")
    from config.clock import system_clock
    from tests.sessions.helpers import open_store, start

    store = await open_store(home, system_clock, {"cleanup": {"retention_days": 0}})
    run_state = await start(store)
    await store.complete(run_state.key)
    await store.close()
    dry = await as_json(capsys, home, "sessions", "cleanup", "--dry-run")
    assert [(a["action"], a["run_id"], a["done"]) for a in dry["actions"]] == [("archive", run_state.run_id, False)]
    assert (home / "contexts/completed" / run_state.run_id).is_dir()
    code, out = await run(capsys, home, "sessions", "cleanup")
    assert code == 0 and run_state.run_id in out
    assert (home / "contexts/archive" / f"{run_state.run_id}.tar.gz").exists()


@pytest.mark.slow
@pytest.mark.allow_blocking
async def test_memory_index_search_status_offline(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    home = tmp_path / "home"
    (home / "workspaces/main/memory").mkdir(parents=True)
    quickest_embedder(home)
    (home / "workspaces/main/MEMORY.md").write_text("# Travel\nThe user's passport expires in June 2027.\n")
    code, out = await run(capsys, home, "memory", "index")
    assert code == 0 and "1 chunk(s) embedded" in out and "1/1 chunks" in out
    found = await as_json(capsys, home, "memory", "search", "when", "does", "my", "passport", "expire")
    assert found["results"][0]["citation"] == "MEMORY.md#L1-L2"
    status = await as_json(capsys, home, "memory", "status")
    assert status["files"] == 1 and status["chunks"] == 1


@pytest.mark.slow
@pytest.mark.allow_blocking
async def test_memory_search_offline_refuses_bad_input_before_touching_the_index(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The offline search brought the index level before it checked k, the agent or the query: a
    refused search still wrote the index (11 files newer than the edited MEMORY.md)."""
    home = tmp_path / "home"
    (home / "workspaces/main/memory").mkdir(parents=True)
    quickest_embedder(home)
    memory_md = home / "workspaces/main/MEMORY.md"
    memory_md.write_text("# Travel\nThe user's passport expires in June 2027.\n")
    code, _ = await run(capsys, home, "memory", "index")
    assert code == 0
    memory_md.write_text("# Travel\nThe user's passport expires in July 2027.\n")
    index = sorted(p for p in home.rglob("*") if "lance" in str(p.relative_to(home)))
    before = {p: p.stat().st_mtime_ns for p in index}
    for args, expected in (
        (("-k", "0", "passport"), "k must be between 1"),
        (("--agent", "nobody", "passport"), "nobody"),
        (("pass\x00port",), "NUL"),
        (("pass\udcffport",), "not UTF-8"),  # what the shell hands Python for the byte 0xff
    ):
        code, out = await run(capsys, home, "memory", "search", *args)
        assert code == 1 and expected in out, (args, out)
        assert "Traceback" not in out
    after = sorted(p for p in home.rglob("*") if "lance" in str(p.relative_to(home)))
    assert after == index and {p: p.stat().st_mtime_ns for p in after} == before


def test_the_client_refuses_an_argument_that_is_not_utf8_before_sending() -> None:
    """``neotask memory search $'tea\\xff'`` against a running daemon ended in a traceback
    (UnicodeEncodeError in urlencode); it is now the CLI's one-line error, and nothing is sent."""
    from config.errors import BadRequest
    from gateway.client import GatewayClient

    client = GatewayClient("http://127.0.0.1:9")  # nothing listens: a request that went out would be Unreachable
    with pytest.raises(BadRequest, match="not UTF-8"):
        client.get("/v1/memory/search", q="tea\udcff")
