"""Issue 10 item 8: conversations are private to the owner. A real daemon started with a
permissive umask creates its home 0700 and every file 0600 (the CLI sets the umask; the store's
files carry explicit modes); the doctor reports wider modes and ``--fix`` clears them, without
following symlinks out of the home."""

from __future__ import annotations

import asyncio
import contextlib
import os
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

from sessions.files.doctor import check_home, check_store
from tests.conftest import FakeClock
from tests.faults.state_support import MAIN, doctor, messages_path, running, seed_home
from tests.sessions.helpers import open_store

pytestmark = pytest.mark.realtime  # reads the real clock: CI runs it at shifted dates too

NOW = "2026-11-30T12:00:00+00:00"


def mode(path: Path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


def modes(root: Path) -> dict[str, int]:
    """Every path under ``root`` (the root as ".") and its permission bits; symlinks left out."""
    found = {".": mode(root)}
    for folder, dirs, files in os.walk(root):
        for name in [*dirs, *files]:
            path = Path(folder) / name
            if not path.is_symlink():
                found[str(path.relative_to(root))] = mode(path)
    return found


@contextlib.contextmanager
def umask(value: int) -> Iterator[None]:
    previous = os.umask(value)
    try:
        yield
    finally:
        os.umask(previous)


@pytest.mark.slow
@pytest.mark.timeout(120)
async def test_a_real_daemon_creates_an_owner_only_home(tmp_path: Path) -> None:
    home = tmp_path / "home"
    with umask(0o022):  # what a login shell has: the daemon must not inherit it
        async with running(home) as (gw, http):
            async with http.post(f"{gw.url}/v1/sessions/{MAIN}/messages", json={"content": "secret"}) as resp:
                assert resp.status == 200
                run_id = (await resp.json())["run_id"]
            assert mode(home / "gateway.json") == 0o600
            live = modes(home)
    after = modes(home)
    for seen in (live, after):
        wide = {path: f"{bits:04o}" for path, bits in seen.items() if bits & 0o077}
        assert wide == {}
    for name in ("gateway.lock", "logs/gateway.log", "contexts/tasks.db", "contexts/sessions.json",
                 f"contexts/running/{run_id}/messages.jsonl", f"contexts/running/{run_id}/current.jsonl",
                 f"contexts/running/{run_id}/metadata.json"):  # fmt: skip
        assert after[name] == 0o600, name
    for name in (".", "contexts", "contexts/running", f"contexts/running/{run_id}", "logs"):
        assert after[name] == 0o700, name

    # an older home, or a copied one: the real doctor reports, then fixes
    (home / "contexts" / "tasks.db").chmod(0o644)
    home.chmod(0o755)
    with umask(0o022):
        checked = await doctor(home)
        assert checked.returncode == 0 and "wide_modes" in checked.stdout and "contexts/tasks.db 0644" in checked.stdout
        fixed = await doctor(home, "--fix")
    assert fixed.returncode == 0 and "wide_modes" in fixed.stdout
    assert mode(home) == 0o700 and mode(home / "contexts" / "tasks.db") == 0o600


async def test_the_doctor_reports_and_fixes_wider_modes_without_following_symlinks(tmp_path: Path) -> None:
    home = tmp_path / "home"
    runs = await seed_home(home)
    outside = tmp_path / "outside.md"
    outside.write_text("not ours")
    outside.chmod(0o644)
    (home / "workspaces").mkdir(mode=0o700)
    (home / "workspaces" / "link.md").symlink_to(outside)
    messages = messages_path(home, runs[MAIN])
    widened = {home: 0o755, home / "contexts" / "tasks.db": 0o644, messages: 0o664, home / "logs": 0o775}
    for path, bits in widened.items():
        path.chmod(bits)

    findings = [f for f in await asyncio.to_thread(check_home, home, fix=False, now=NOW) if f.check == "wide_modes"]
    assert len(findings) == 1 and findings[0].severity == "warning" and findings[0].fix is not None
    assert findings[0].detail.startswith("4 path(s) under the home can be read or written by other users")
    assert ". 0755" in findings[0].detail and "contexts/tasks.db 0644" in findings[0].detail
    assert {path: mode(path) for path in widened} == widened  # reporting changes nothing

    fixed = [f for f in await asyncio.to_thread(check_home, home, fix=True, now=NOW) if f.check == "wide_modes"]
    assert fixed[0].fixed
    assert {path: mode(path) for path in widened} == {
        home: 0o700, home / "contexts" / "tasks.db": 0o600, messages: 0o600, home / "logs": 0o700
    }  # fmt: skip
    assert mode(outside) == 0o644  # a symlink's target outside the home is not touched
    assert not [f for f in await asyncio.to_thread(check_home, home, fix=False, now=NOW) if f.check == "wide_modes"]


async def test_the_online_doctor_fixes_wider_modes_too(tmp_path: Path, clock: FakeClock) -> None:
    await seed_home(tmp_path, clock)
    (tmp_path / "contexts" / "sessions.json").chmod(0o644)
    store = await open_store(tmp_path, clock)
    try:
        found = [f for f in await check_store(store.state, fix=True, min_age_s=0) if f.check == "wide_modes"]
    finally:
        await store.close()
    assert len(found) == 1 and found[0].fixed and "contexts/sessions.json 0644" in found[0].detail
    assert mode(tmp_path / "contexts" / "sessions.json") == 0o600


@pytest.mark.slow
@pytest.mark.timeout(120)
async def test_a_home_made_0755_by_the_user_is_made_private_at_start(tmp_path: Path) -> None:
    """Issue 29 item 7: ``mkdir ~/.neotask`` under a 022 umask, then the first start."""
    home = tmp_path / "home"
    with umask(0o022):
        home.mkdir()
        assert mode(home) == 0o755
        async with running(home) as (gw, http):
            assert mode(home) == 0o700  # before it listens: nothing was written while it was open
            async with http.post(f"{gw.url}/v1/sessions/{MAIN}/messages", json={"content": "secret"}) as resp:
                assert resp.status == 200
        lines = [line for line in gw.stderr().splitlines() if "was mode 0755" in line]
        assert len(lines) == 1 and str(home) in lines[0] and "0700" in lines[0], gw.stderr()
        log_lines = [line for line in (home / "logs" / "gateway.log").read_text().splitlines() if "was mode" in line]
        assert len(log_lines) == 1
        # a second start finds it private: no line
        async with running(home) as (again, _):
            pass
        assert "was mode" not in again.stderr()
    assert mode(home) == 0o700
