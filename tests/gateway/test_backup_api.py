"""``POST /v1/admin/backup`` and the archive it writes, in-process (issue 29 item 1): the manifest's
counts and checksums, ``verify``, a restore; bad input (an unwritable output, a corrupt archive, a
home that is not empty) is a clear error that changes nothing."""

from __future__ import annotations

import asyncio
import contextlib
import gzip
import hashlib
import io
import json
import os
import sqlite3
import stat
import tarfile
from pathlib import Path
from typing import Any

import pytest

from backups.errors import BackupInvalid, BackupTargetError, HomeNotEmpty
from backups.manifest import MANIFEST, verify
from backups.pack import restore
from config.settings import Settings
from gateway import exits
from gateway import keys as K
from gateway.cli import main
from tests.gateway.conftest import Client, settled
from tests.gateway.helpers import tree_digest

KEY = "agent%3Amain%3Amain"
NOW = "2026-11-30T12:00:00+00:00"


async def _seed(client: Client, n: int = 5) -> None:
    for i in range(n):
        resp = await client.post(f"/v1/sessions/{KEY}/messages", json={"content": f"message {i}"})
        assert resp.status == 200, await resp.text()
    resp = await client.post(f"/v1/sessions/{KEY}/messages", json={"content": "/new"})
    assert resp.status == 200
    resp = await client.post(f"/v1/sessions/{KEY}/messages", json={"content": "in the second run"})
    assert resp.status == 200
    await settled(client)


async def _backup(client: Client, out: Path) -> dict[str, Any]:
    resp = await client.post("/v1/admin/backup", json={"output": str(out)})
    assert resp.status == 200, await resp.text()
    body: dict[str, Any] = await resp.json()
    return body


async def test_a_backup_holds_a_manifest_that_verifies_and_restores(client: Client, tmp_path: Path) -> None:
    await _seed(client)
    keys = tmp_path / "matrix" / "main" / "@bot:example.org_DEV.db"  # a Matrix account's crypto store
    keys.parent.mkdir(parents=True)
    with contextlib.closing(sqlite3.connect(keys)) as db, db:
        db.execute("CREATE TABLE accounts (pickle TEXT)")
        db.execute("INSERT INTO accounts VALUES ('the device keys')")
    out = tmp_path.parent / f"{tmp_path.name}-out.tar.gz"
    body = await _backup(client, out)
    assert body["counts"]["runs"] == 2 and body["counts"]["active_runs"] == 1
    assert list(body["point"]["runs"].values()) == [{"state": "running", "seq": 1}]
    manifest = await asyncio.to_thread(verify, out)
    assert manifest["format_version"] == 1 and manifest["mode"] == "online"
    assert {"contexts/tasks.db", "contexts/sessions.json", "channels.db", "matrix/main/@bot:example.org_DEV.db"} <= set(
        manifest["files"]
    )
    with tarfile.open(out, "r:gz") as tar:
        assert tar.next().name == MANIFEST  # type: ignore[union-attr]
    target = tmp_path.parent / f"{tmp_path.name}-restored"
    await asyncio.to_thread(restore, out, target, now=NOW, settings=Settings())
    assert (target / "contexts" / "history.db").exists()  # rebuilt, not copied
    with contextlib.closing(sqlite3.connect(target / "matrix" / "main" / "@bot:example.org_DEV.db")) as db:
        assert db.execute("SELECT pickle FROM accounts").fetchall() == [("the device keys",)]
    lines = [
        json.loads(line)
        for p in (target / "contexts").glob("*/*/messages.jsonl")
        for line in p.read_text().splitlines()
    ]
    assert sorted(r["content"] for r in lines if not r.get("command")) == sorted(
        [f"message {i}" for i in range(5)] + ["in the second run"]
    )


async def test_an_unwritable_output_is_a_clear_error_and_writes_nothing(client: Client, tmp_path: Path) -> None:
    await _seed(client, 2)
    before = tree_digest(tmp_path)
    for output in (str(tmp_path / "missing" / "b.tar.gz"), str(tmp_path / "contexts")):
        resp = await client.post("/v1/admin/backup", json={"output": output})
        assert resp.status == 400
        error = (await resp.json())["error"]
        assert error["code"] == "backup_target_unwritable" and "-o" in error["message"]
    cwd_before = sorted(Path.cwd().iterdir())
    for body in ({"output": 5}, {"outptu": "x"}, {"output": "relative.tar.gz"}, {"output": "a\u0000b"}):
        resp = await client.post("/v1/admin/backup", json=body)
        assert resp.status == 400 and (await resp.json())["error"]["code"] == "invalid_field", body
    resp = await client.post("/v1/admin/backup", json={"output": "relative.tar.gz"})
    assert "absolute path" in (await resp.json())["error"]["message"]
    await settled(client)
    assert tree_digest(tmp_path) == before
    assert not (tmp_path / "backups").exists()
    assert sorted(Path.cwd().iterdir()) == cwd_before  # nothing written where the daemon happens to run


async def test_a_backup_replaces_only_an_older_backup(client: Client, tmp_path: Path) -> None:
    """The archive is renamed over ``output``: a device, FIFO, any other file or a file of the live
    home would have been replaced by it (a hostile test turned /dev/null and sessions.json into
    tarballs; a review then replaced /dev/stdout, a symbolic link). Only an older backup is replaced."""
    await _seed(client, 2)
    outside = tmp_path.parent / f"{tmp_path.name}-targets"
    outside.mkdir()
    precious = outside / "notes.txt"
    precious.write_text("keep me")
    fifo = outside / "pipe.tar.gz"
    os.mkfifo(fifo)
    sessions_json = tmp_path / "contexts" / "sessions.json"
    link = outside / "link.tar.gz"  # as /dev/stdout is: the rename would replace the link itself
    link.symlink_to(precious)
    before = tree_digest(tmp_path)
    refused = {
        str(precious): "is not a neotask backup",
        str(fifo): "not a regular file",
        str(link): "symbolic link",
        str(outside): "it is a folder",
        str(sessions_json): "inside the gateway's home",
        str(tmp_path / "b.tar.gz"): "inside the gateway's home",
    }
    for output, says in refused.items():
        resp = await client.post("/v1/admin/backup", json={"output": output})
        assert resp.status == 400, (output, await resp.text())
        error = (await resp.json())["error"]
        assert error["code"] == "backup_target_unwritable" and says in error["message"], (output, error)
    assert precious.read_text() == "keep me" and stat.S_ISFIFO(os.lstat(fifo).st_mode) and link.is_symlink()
    await settled(client)
    assert tree_digest(tmp_path) == before
    older = outside / "latest.tar.gz"
    first = await _backup(client, older)
    second = await _backup(client, older)  # a backup over the previous one: taken
    assert second["path"] == first["path"] == str(older)
    assert (await asyncio.to_thread(verify, older))["format"]
    into_backups = await _backup(client, tmp_path / "backups" / "mine.tar.gz")  # the home's backups folder
    assert into_backups["path"].endswith("mine.tar.gz")


def _corrupt(good: Path, bad: Path, how: str) -> None:
    data = bytearray(good.read_bytes())
    if how == "flipped":
        raw = bytearray(gzip.decompress(bytes(data)))
        raw[len(raw) // 2] ^= 0xFF  # a byte inside a member: the gzip stream stays valid, a checksum fails
        data = bytearray(gzip.compress(bytes(raw)))
    elif how == "truncated":
        del data[len(data) * 2 // 3 :]
    else:
        data = bytearray(b"not a backup at all\n")
    bad.write_bytes(bytes(data))


@pytest.mark.parametrize("how", ["flipped", "truncated", "garbage"])
async def test_a_corrupt_archive_is_refused_and_nothing_is_restored(client: Client, tmp_path: Path, how: str) -> None:
    await _seed(client, 3)
    good = tmp_path.parent / f"{tmp_path.name}-good.tar.gz"
    await _backup(client, good)
    bad = tmp_path.parent / f"{tmp_path.name}-{how}.tar.gz"
    await asyncio.to_thread(_corrupt, good, bad, how)
    with pytest.raises(BackupInvalid) as caught:
        await asyncio.to_thread(verify, bad)
    assert str(bad) in caught.value.message or "not a" in caught.value.message
    target = tmp_path.parent / f"{tmp_path.name}-{how}-restored"
    with pytest.raises(BackupInvalid):
        await asyncio.to_thread(restore, bad, target, now=NOW, settings=Settings())
    assert not target.exists()
    assert not list(tmp_path.parent.glob(f".{target.name}.restoring-*"))


def _cuts(size: int) -> list[int]:
    """Lengths to cut an archive of ``size`` bytes to: through the gzip header, the manifest, the
    members, the end-of-archive blocks, and each byte of the gzip trailer (CRC-32, length)."""
    return sorted({1, 5, 10, 20, *range(40, size - 12, 199), *range(size - 12, size)})


def _trailer_flipped(good: Path, bad: Path) -> None:
    data = bytearray(good.read_bytes())
    data[-6] ^= 0x01  # a bit of the stream's CRC-32: every member still reads and checks
    bad.write_bytes(bytes(data))


def _with_a_bad_metadata(good: Path, bad: Path) -> None:
    """``good`` with every run's metadata.json unreadable and the manifest's checksums to match:
    it verifies, and the restored home does not check clean."""
    with tarfile.open(good, "r:gz") as tar:
        members = [(m, tar.extractfile(m).read()) for m in tar.getmembers() if m.isfile()]  # type: ignore[union-attr]
    manifest = json.loads(members[0][1])
    with tarfile.open(bad, "w:gz") as tar:
        files = []
        for member, data in members[1:]:
            if member.name.endswith("/metadata.json"):
                data = b"{"
                entry = {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()}
                manifest["files"][member.name.removeprefix("home/")] = entry
                member.size = len(data)
            files.append((member, data))
        raw = json.dumps(manifest).encode()
        info = tarfile.TarInfo(MANIFEST)
        info.size = len(raw)
        tar.addfile(info, io.BytesIO(raw))
        for member, data in files:
            tar.addfile(member, io.BytesIO(data))


async def _cli(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    capsys.readouterr()
    code = await asyncio.to_thread(main, list(args))
    out, err = capsys.readouterr()
    return code, out, err


async def test_a_cut_archive_or_a_bad_gzip_trailer_is_backup_invalid_from_the_cli(
    client: Client, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Cut inside the manifest, ``backup verify`` and ``restore`` raised EOFError out of the CLI (a
    traceback); cut in the gzip trailer, or with the trailer's CRC wrong, the archive verified and
    restored. Each is one line ``error: backup_invalid: …`` naming the file, exit 1, nothing written."""
    await _seed(client, 3)
    good = tmp_path.parent / f"{tmp_path.name}-good.tar.gz"
    await _backup(client, good)
    bad = tmp_path.parent / f"{tmp_path.name}-bad.tar.gz"
    target = tmp_path.parent / f"{tmp_path.name}-cut-home"
    data = good.read_bytes()
    cases = [(f"cut to {n} of {len(data)} bytes", data[:n]) for n in _cuts(len(data))]
    await asyncio.to_thread(_trailer_flipped, good, bad)
    cases.append(("the gzip CRC flipped", bad.read_bytes()))
    for case, content in cases:
        bad.write_bytes(content)
        for command in (("backup", "verify", str(bad)), ("restore", str(bad), "--home", str(target))):
            code, out, err = await _cli(capsys, *command)
            assert (code, out) == (exits.FAILED, ""), (case, command, code, out, err)
            assert err.startswith(f"error: backup_invalid: {bad}") and err.count("\n") == 1, (case, command, err)
        assert not target.exists(), case
        assert not list(tmp_path.parent.glob(f".{target.name}.restoring-*")), case
    code, out, _ = await _cli(capsys, "backup", "verify", str(good))
    assert code == exits.OK and out.startswith(f"OK: {good}")


async def test_a_restore_creates_the_missing_folders_above_its_home(
    client: Client, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``neotask restore home.tar.gz --home /new/home`` (the example of docs/operations.md) refused a home whose
    parent did not exist ("create it first"). A bad archive still creates nothing."""
    await _seed(client, 2)
    out = tmp_path.parent / f"{tmp_path.name}-b.tar.gz"
    await _backup(client, out)
    top = tmp_path.parent / f"{tmp_path.name}-new"
    target = top / "srv" / "home"
    garbage = tmp_path.parent / f"{tmp_path.name}-garbage.tar.gz"
    await asyncio.to_thread(_corrupt, out, garbage, "garbage")
    code, _, err = await _cli(capsys, "restore", str(garbage), "--home", str(target))
    assert code == exits.FAILED and err.startswith("error: backup_invalid:") and not top.exists()
    unclean = tmp_path.parent / f"{tmp_path.name}-unclean.tar.gz"  # verifies; fails after the folders were made
    await asyncio.to_thread(_with_a_bad_metadata, out, unclean)
    code, _, err = await _cli(capsys, "restore", str(unclean), "--home", str(target))
    assert code == exits.FAILED and "does not check clean" in err and "metadata.json" in err, err
    assert not top.exists()  # the folders it created are gone again
    code, printed, err = await _cli(capsys, "restore", str(out), "--home", str(target))
    assert code == exits.OK, err
    assert printed.startswith("restored ") and str(target) in printed
    assert (target / "contexts" / "sessions.json").is_file()
    assert [stat.S_IMODE(p.stat().st_mode) for p in (top, top / "srv", target)] == [0o700] * 3
    assert sorted(p.name for p in top.iterdir()) == ["srv"]  # no temp folder left beside it


async def test_a_restore_refuses_a_home_that_is_not_empty(client: Client, tmp_path: Path) -> None:
    await _seed(client, 2)
    out = tmp_path.parent / f"{tmp_path.name}-b.tar.gz"
    await _backup(client, out)
    with pytest.raises(HomeNotEmpty) as caught:
        await asyncio.to_thread(restore, out, tmp_path, now=NOW, settings=Settings())
    assert "new or empty" in caught.value.message
    other = tmp_path.parent / f"{tmp_path.name}-other"
    other.mkdir()
    (other / "notes.txt").write_text("mine")
    with pytest.raises(HomeNotEmpty):
        await asyncio.to_thread(restore, out, other, now=NOW, settings=Settings())
    assert [p.name for p in other.iterdir()] == ["notes.txt"]


async def test_a_second_backup_while_one_runs_is_refused(client: Client, tmp_path: Path) -> None:
    await _seed(client, 1)
    backups = client.app[K.SERVICES].backups
    first = asyncio.create_task(backups.take(tmp_path.parent / f"{tmp_path.name}-1.tar.gz"))
    await asyncio.sleep(0)
    resp = await client.post("/v1/admin/backup", json={"output": str(tmp_path.parent / f"{tmp_path.name}-2.tar.gz")})
    assert resp.status == 409 and (await resp.json())["error"]["code"] == "backup_running"
    await first


def test_the_target_check_names_the_folder(tmp_path: Path) -> None:
    with pytest.raises(BackupTargetError, match="does not exist"):
        from backups.pack import check_target

        check_target(tmp_path / "nope" / "x.tar.gz")
