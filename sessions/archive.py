"""Archived runs: ``archive/{uuid}.tar.gz`` holds a completed run's folder; its stores stay
readable (blocking helpers: callers run them off the event loop)."""

from __future__ import annotations

import io
import json
import os
import shutil
import tarfile
from pathlib import Path
from typing import Any

from sessions.jsonl import fsync_dir, private


def pack(folder: Path, archive: Path) -> None:
    """Write the archive atomically (temp name, fsync, rename), then remove the folder."""
    archive.parent.mkdir(parents=True, exist_ok=True)
    tmp = archive.with_name(f".{archive.name}.tmp")
    with open(tmp, "wb", opener=private) as raw:
        with tarfile.open(fileobj=raw, mode="w:gz") as tar:
            tar.add(folder, arcname=folder.name)
        raw.flush()
        os.fsync(raw.fileno())
    os.replace(tmp, archive)
    fsync_dir(archive.parent)
    shutil.rmtree(folder)
    fsync_dir(folder.parent)


def read_member(archive: Path, run_id: str, name: str) -> str | None:
    """One file of an archived run as text; None when the archive or the file is missing."""
    try:
        with tarfile.open(archive, mode="r:gz") as tar:
            try:
                member = tar.getmember(f"{run_id}/{name}")
            except KeyError:
                return None
            handle = tar.extractfile(member)
            return None if handle is None else io.TextIOWrapper(handle, encoding="utf-8").read()
    except FileNotFoundError:
        return None


def read_records(archive: Path, run_id: str, name: str) -> list[dict[str, Any]]:
    text = read_member(archive, run_id, name) or ""
    out = []
    for line in text.splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if isinstance(record, dict):
            out.append(record)
    return out
