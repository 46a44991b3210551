"""Which files are an agent's memory, and safe access to them (blocking; call off the loop).

Real paths decide: a file counts, is read, indexed or appended to only when its
resolved path lies inside the workspace or one of ``memory.extra_paths``; a symlink out of them
(``memory/link.md -> /etc/passwd``) is skipped when listing and indexing and refused when read."""

from __future__ import annotations

import hashlib
import logging
import os
import stat
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import date
from pathlib import Path, PurePosixPath

from config.errors import BadRequest, MemoryFileNotFound
from memory import scopes
from memory.records import AppendResult, MemoryFile

MEMORY_MD = "MEMORY.md"
log = logging.getLogger(__name__)
_WARNED_MAX = 1000
_warned: set[str] = set()  # symlinks out of the sources already logged (each sweep sees them again)


@dataclass(frozen=True)
class SourceFile:
    """A memory file: ``rel`` is what the index and citations use, ``abs`` where it lives."""

    rel: str
    abs: Path


def _rel(workspace: Path, path: Path) -> str:
    try:
        return path.relative_to(workspace).as_posix()
    except ValueError:
        return path.as_posix()


def _markdown_under(root: Path) -> Iterable[Path]:
    if root.is_file():
        if root.suffix.lower() == ".md":
            yield root
        return
    if not root.is_dir():
        return
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
        for name in sorted(filenames):
            if name.lower().endswith(".md") and not name.startswith(".") and _regular(Path(dirpath) / name):
                yield Path(dirpath) / name


def _regular(path: Path) -> bool:
    """Whether ``path`` (its symlinks followed) is a regular file: a FIFO, socket or device named
    ``*.md`` is no memory (reading a FIFO blocks until someone writes to it)."""
    try:
        return stat.S_ISREG(path.stat().st_mode)
    except OSError:
        return False


def _extra_root(workspace: Path, raw: str) -> Path:
    path = Path(raw).expanduser()
    return path if path.is_absolute() else workspace / path


def allowed_roots(workspace: Path, extra_paths: Iterable[str] = ()) -> tuple[Path, ...]:
    """The real paths memory may come from: the workspace and each of ``memory.extra_paths``."""
    return (workspace.resolve(), *(_extra_root(workspace, p).resolve() for p in extra_paths))


def inside(path: Path, roots: Iterable[Path]) -> bool:
    """Whether ``path``, every symlink resolved, lies within one of ``roots`` (real paths)."""
    real = Path(os.path.realpath(path))
    return any(real.is_relative_to(root) for root in roots)


def _refused(path: Path) -> None:
    key = str(path)
    if key not in _warned and len(_warned) < _WARNED_MAX:
        _warned.add(key)
        log.warning("memory: %s resolves to %s, outside the workspace and memory.extra_paths: skipped",
                    path, os.path.realpath(path))  # fmt: skip


def discover(workspace: Path, extra_paths: Iterable[str] = ()) -> list[SourceFile]:
    """``MEMORY.md``, ``memory/**/*.md`` and the ``memory.extra_paths`` (relative to the workspace
    or absolute; a file or a folder of Markdown), sorted by relative path, without repeats; files
    whose real path is outside the workspace and the extra paths are left out."""
    found: dict[str, SourceFile] = {}
    extra_paths = tuple(extra_paths)
    roots = [workspace / MEMORY_MD, workspace / "memory"]
    roots += [_extra_root(workspace, p) for p in extra_paths]
    allowed = allowed_roots(workspace, extra_paths)
    for root in roots:
        for path in _markdown_under(root):
            if not inside(path, allowed):
                _refused(path)
                continue
            rel = _rel(workspace, path)
            found.setdefault(rel, SourceFile(rel, path))
    return [found[k] for k in sorted(found)]


def resolve(workspace: Path, rel: str, extra_paths: Iterable[str] = ()) -> SourceFile:
    """The memory file ``rel`` names; BadRequest if it points outside the memory sources."""
    if not rel or "\x00" in rel:
        raise BadRequest("path must name a memory file, e.g. MEMORY.md or memory/2026-01-31.md")
    known = {f.rel: f for f in discover(workspace, extra_paths)}
    if rel in known:
        return known[rel]
    pure = PurePosixPath(rel)
    if pure.is_absolute() or ".." in pure.parts:
        raise BadRequest(f"path {rel!r} is outside the agent's memory; use a path relative to the workspace")
    if pure.suffix.lower() != ".md" or not (rel == MEMORY_MD or pure.parts[0] == "memory"):
        raise BadRequest(f"path {rel!r} is not a memory file (MEMORY.md or memory/**/*.md)")
    if not inside(workspace / pure, allowed_roots(workspace, extra_paths)):
        raise BadRequest(f"path {rel!r} is outside the agent's workspace (a symlink out of it is not followed)")
    raise MemoryFileNotFound(f"memory file {rel!r} does not exist")


def list_files(workspace: Path, extra_paths: Iterable[str] = ()) -> list[MemoryFile]:
    out: list[MemoryFile] = []
    for f in discover(workspace, extra_paths):
        try:
            st = f.abs.stat()
        except FileNotFoundError:
            continue
        out.append(MemoryFile(f.rel, st.st_size, st.st_mtime))
    return out


def read_text(path: Path) -> str:
    """A memory file's text (UTF-8, undecodable bytes replaced, CRLF as LF). Opened without
    blocking and read only when it is a regular file (it may have been replaced by a FIFO since it
    was listed): BadRequest otherwise."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise BadRequest(f"memory file {path.name!r} is not a regular file; it is not read")
        os.set_blocking(fd, True)
        with os.fdopen(fd, "rb") as f:
            fd = -1  # closed by the file object
            data = f.read()
    finally:
        if fd >= 0:
            os.close(fd)
    return data.decode("utf-8", errors="replace").replace("\r\n", "\n")


def read_text_inside(path: Path, roots: tuple[Path, ...]) -> str:
    """``read_text`` of the file's real path, checked again at read time (a file may have been
    replaced by a symlink since it was listed); BadRequest when it now points out of ``roots``."""
    real = Path(os.path.realpath(path))
    if not any(real.is_relative_to(root) for root in roots):
        _refused(path)
        raise BadRequest(f"memory file {path.name!r} points outside the agent's workspace; it is not read")
    return read_text(real)


def file_hash(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:32]


def line_slice(text: str, start_line: int | None, end_line: int | None) -> str:
    """Lines ``start_line``..``end_line`` (1-based, inclusive; None = from the start / to the end)."""
    for name, value in (("start_line", start_line), ("end_line", end_line)):
        if value is not None and (not isinstance(value, int) or isinstance(value, bool)):
            raise BadRequest(f"{name} must be a whole number (1-based) or left out")
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    start = 1 if start_line is None else start_line
    end = len(lines) if end_line is None else end_line
    if start < 1 or end < start:
        raise BadRequest(f"line range {start_line}-{end_line} is invalid; lines are 1-based and inclusive")
    return "\n".join(lines[start - 1 : end])


def daily_path(today: date) -> str:
    return scopes.daily_path(today)


def append_daily(workspace: Path, text: str, today: date, scope: scopes.Scope = None) -> AppendResult:
    """Append the non-blank lines of ``text`` to ``memory/<today>.md`` (in a named ``scope``:
    ``memory/scopes/<scope>/<today>.md``), skipping lines the file already holds (compared
    without surrounding whitespace). Never touches MEMORY.md."""
    rel = scopes.daily_path(today, scope)
    target = workspace / rel
    target.parent.mkdir(parents=True, exist_ok=True)
    if not inside(target, (workspace.resolve(),)):
        raise BadRequest(f"{rel} points outside the agent's workspace (a symlink); refusing to write through it")
    existing = read_text(target) if target.exists() else ""
    have = {line.strip() for line in existing.split("\n") if line.strip()}
    new: list[str] = []
    skipped = 0
    for line in text.replace("\r\n", "\n").split("\n"):
        key = line.strip()
        if not key:
            continue
        if key in have:
            skipped += 1
            continue
        have.add(key)
        new.append(line.rstrip())
    if new:
        prefix = "" if not existing or existing.endswith("\n") else "\n"
        with target.open("a", encoding="utf-8") as fh:
            fh.write(prefix + "\n".join(new) + "\n")
            fh.flush()
            os.fsync(fh.fileno())
    return AppendResult(rel, len(new), skipped)
