"""The manifest of a backup (``manifest.json``, the archive's first member): format version,
neotask version, when, the point (the last seq of every active run), counts, and a SHA-256 per
file. ``verify`` checks an archive against it member by member."""

from __future__ import annotations

import hashlib
import json
import tarfile
import zlib
from collections.abc import Mapping
from pathlib import Path
from typing import IO, Any

from backups.errors import BackupInvalid
from home.copies import walk_files

FORMAT = "neotask-backup"
FORMAT_VERSION = 1
MANIFEST = "manifest.json"
HOME_PREFIX = "home/"  # every file of the home is under home/ in the archive
CHUNK = 1 << 20
# What reading a damaged archive raises (a cut gzip stream ends in EOFError, a corrupt one in zlib.error)
DAMAGED: tuple[type[Exception], ...] = (tarfile.TarError, EOFError, zlib.error)
UNREADABLE: tuple[type[Exception], ...] = (*DAMAGED, OSError)


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while block := handle.read(CHUNK):
            digest.update(block)
    return digest.hexdigest()


def sha256_stream(stream: IO[bytes]) -> str:
    digest = hashlib.sha256()
    while block := stream.read(CHUNK):
        digest.update(block)
    return digest.hexdigest()


def file_table(root: Path) -> dict[str, dict[str, Any]]:
    """``{relative path: {size, sha256}}`` of every file under ``root``."""
    return {
        path.relative_to(root).as_posix(): {"size": path.stat().st_size, "sha256": sha256_file(path)}
        for path in walk_files(root)
    }


def counts(files: Mapping[str, Any], point: Mapping[str, Any]) -> dict[str, int]:
    folders = ("contexts/running/", "contexts/paused/", "contexts/completed/")
    runs = {name.split("/")[2] for name in files if name.startswith(folders) and name.count("/") >= 3}
    return {
        "files": len(files),
        "bytes": sum(int(entry["size"]) for entry in files.values()),
        "runs": len(runs),
        "active_runs": len(point.get("runs", {})),
        "archives": sum(1 for name in files if name.startswith("contexts/archive/") and name.endswith(".tar.gz")),
        "memory_files": sum(1 for name in files if name.startswith("memory.lance/")),
        "workspace_files": sum(1 for name in files if name.startswith("workspaces/")),
    }


def read_manifest(tar: tarfile.TarFile) -> dict[str, Any]:
    member = tar.next()
    if member is None or member.name != MANIFEST or not member.isfile():
        raise BackupInvalid(f"not a neotask backup: the archive does not start with {MANIFEST}")
    handle = tar.extractfile(member)
    if handle is None:
        raise BackupInvalid(f"{MANIFEST} is unreadable")
    try:
        manifest = json.loads(handle.read())
    except ValueError as exc:
        raise BackupInvalid(f"{MANIFEST} is not JSON ({exc})") from exc
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise BackupInvalid(f"not a neotask backup: {MANIFEST} has no format {FORMAT!r}")
    version = manifest.get("format_version")
    if not isinstance(version, int) or version > FORMAT_VERSION:
        raise BackupInvalid(f"backup format_version {version!r} is newer than this neotask knows ({FORMAT_VERSION})")
    return manifest


def verify(path: Path) -> dict[str, Any]:
    """Read the whole archive, to the end of its gzip stream: every file the manifest lists is
    there once with its size and SHA-256, nothing else, and the stream's own trailer (CRC and
    length) is there and right. The manifest, or ``BackupInvalid`` naming the first problem."""
    try:
        tar = tarfile.open(path, "r:gz")  # noqa: SIM115 (closed by the with below, once opened)
    except FileNotFoundError as exc:
        raise BackupInvalid(f"{path}: no such file") from exc
    except UNREADABLE as exc:
        raise BackupInvalid(f"{path} is not a readable backup archive ({exc})") from exc
    with tar:
        try:
            manifest = read_manifest(tar)
            seen = _check_members(path, tar, dict(manifest.get("files") or {}))
            _read_to_the_end(tar)
        except UNREADABLE as exc:  # a truncated stream ends in EOFError, anywhere in it
            raise BackupInvalid(f"{path} is truncated or damaged ({str(exc) or type(exc).__name__})") from exc
    missing = sorted(set(manifest.get("files") or {}) - seen)
    if missing:
        raise BackupInvalid(f"{path}: {len(missing)} file(s) of the manifest are missing, e.g. {missing[0]}")
    return manifest


def _check_members(path: Path, tar: tarfile.TarFile, expected: Mapping[str, Any]) -> set[str]:
    """The names of the manifest's files found in the archive, each checked."""
    seen: set[str] = set()
    for member in tar:
        if member.isdir() or (member.name == MANIFEST and member.offset == 0):
            continue
        name = member.name.removeprefix(HOME_PREFIX)
        if not member.name.startswith(HOME_PREFIX) or not member.isfile() or name not in expected:
            raise BackupInvalid(f"{path}: {member.name} is not listed in the manifest")
        if name in seen:
            raise BackupInvalid(f"{path}: {member.name} is in the archive twice")
        handle = tar.extractfile(member)
        digest = sha256_stream(handle) if handle is not None else ""
        entry = expected[name]
        if member.size != entry["size"] or digest != entry["sha256"]:
            raise BackupInvalid(f"{path}: {member.name} does not match its checksum (the archive is damaged)")
        seen.add(name)
    return seen


def _read_to_the_end(tar: tarfile.TarFile) -> None:
    """tarfile stops at the end-of-archive blocks and never reads the gzip trailer: read the rest
    of the stream, so a missing or wrong trailer (a cut copy, a bit flipped in it) raises."""
    stream = tar.fileobj
    if stream is not None:
        while stream.read(CHUNK):
            pass
