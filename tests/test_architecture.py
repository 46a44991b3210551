"""The layout is the architecture (docs/ARCHITECTURE.md): no import circle between modules, and
the arrows between packages point one way.

Imports are read with ``ast`` from every module of the packages, wherever they stand (top level,
``if TYPE_CHECKING:``, inside a function): an import hidden in a function is still an arrow."""

from __future__ import annotations

import ast
import functools
from collections.abc import Iterator, Mapping
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("config", "home", "sessions", "memory", "scheduler", "channels", "backups", "conversations", "gateway")
OURS = ("config", "home", "sessions", "memory", "scheduler", "channels", "backups", "conversations", "gateway")

# package (or a package of one) -> module prefixes it must not import (ours, and the HTTP server code)
FORBIDDEN: Mapping[str, tuple[str, ...]] = {
    "config": tuple(p for p in OURS if p != "config"),
    "home": tuple(p for p in OURS if p not in ("config", "home")),
    "sessions": ("gateway", "conversations", "backups"),
    "sessions.postgres": ("sessions.files",),
    "sessions.inmemory": ("sessions.files", "sessions.postgres"),
    "backups": ("gateway", "conversations"),
    "memory": ("gateway", "conversations"),
    "scheduler": ("gateway", "conversations"),
    "channels": ("gateway", "aiohttp.web"),
    "conversations": ("gateway", "aiohttp.web"),
}


# The modules outside the files backend that still import it (``sessions.files``), by name: the list
# may only get shorter. A module that no longer imports it comes off the list; a new one is refused.
FILES_BACKEND_IMPORTERS = frozenset({
    "backups.pack", "backups.stage",  # a home's point staged and checked with the files backend's own tools
    "gateway.api.history", "gateway.cli_history",  # the export writer, `neotask history`
    "gateway.backup_postgres", "gateway.backups",  # backups of a home (and of a database staged as one)
    "gateway.crashpoints", "gateway.offline",  # the archive's crash steps, the offline doctor
    "sessions.backends", "sessions.copying",  # the construction site, the storage copier
})  # fmt: skip


def module_files(root: Path) -> dict[str, Path]:
    """Dotted module name -> file, for every module of the packages under ``root``."""
    found = {}
    for package in PACKAGES:
        for path in sorted((root / package).rglob("*.py")):
            parts = list(path.relative_to(root).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join(parts)] = path
    return found


def imports(name: str, path: Path) -> Iterator[tuple[str, ...]]:
    """Each name ``name`` imports, as the dotted names it may be, most precise first: ``import a.b``
    gives ``("a.b",)``; ``from a import b`` gives ``("a.b", "a")`` (a module ``b``, or a name in
    ``a``). Relative imports are made absolute."""
    yield from _imports(name, path)


@functools.cache
def _imports(name: str, path: Path) -> tuple[tuple[str, ...], ...]:
    """``imports``, each file read once for all the checks."""
    return tuple(_read_imports(name, path))


def _read_imports(name: str, path: Path) -> Iterator[tuple[str, ...]]:
    is_package = path.name == "__init__.py"
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            yield from ((alias.name,) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = name.split(".") if is_package else name.split(".")[:-1]
                base = base[: len(base) - (node.level - 1)]
                module = ".".join([*base, node.module] if node.module else base)
            else:
                module = node.module or ""
            yield from ((f"{module}.{alias.name}", module) for alias in node.names)


def import_graph(modules: Mapping[str, Path]) -> dict[str, set[str]]:
    """Module -> the modules of ours it imports (``from pkg import mod`` is an arrow to ``pkg.mod``,
    ``from pkg import name`` one to ``pkg``)."""
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        targets = {next(c for c in candidates if c in modules) for candidates in imports(name, path)
                   if any(c in modules for c in candidates)}  # fmt: skip
        targets.discard(name)
        graph[name] = targets
    return graph


def circles(graph: Mapping[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    counter = 0

    def visit(start: str) -> None:  # iterative: a deep graph must not hit the recursion limit
        nonlocal counter
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            node, edges = work[-1]
            for nxt in edges:
                if nxt not in index:
                    index[nxt] = low[nxt] = counter
                    counter += 1
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, iter(sorted(graph[nxt]))))
                    break
                if nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def _under(name: str, prefix: str) -> bool:
    return name == prefix or name.startswith(prefix + ".")


def forbidden_arrows(root: Path, modules: Mapping[str, Path]) -> list[str]:
    bad = set()
    for name, path in modules.items():
        rules = [
            (package, prefix) for package, banned in FORBIDDEN.items() if _under(name, package) for prefix in banned
        ]
        for candidates in imports(name, path):
            for package, prefix in rules:
                if any(_under(c, prefix) for c in candidates):
                    bad.add(f"{path.relative_to(root)} imports {prefix} ({package} must not)")
    return sorted(bad)


def files_backend_importers(modules: Mapping[str, Path]) -> set[str]:
    """The modules outside ``sessions.files`` that import it."""
    return {
        name
        for name, path in modules.items()
        if not _under(name, "sessions.files")
        and any(_under(c, "sessions.files") for cs in imports(name, path) for c in cs)
    }


def test_no_import_circle_between_modules() -> None:
    found = circles(import_graph(module_files(ROOT)))
    assert found == [], "import circles (share types through one module all import, or pass callables):\n" + "\n".join(
        " -> ".join(c) for c in found
    )


def test_no_forbidden_arrow_between_packages() -> None:
    assert forbidden_arrows(ROOT, module_files(ROOT)) == []


def test_only_the_listed_modules_reach_into_the_files_backend() -> None:
    found = files_backend_importers(module_files(ROOT))
    assert not found - FILES_BACKEND_IMPORTERS, (
        f"new importers of sessions.files: {sorted(found - FILES_BACKEND_IMPORTERS)}"
    )
    assert not FILES_BACKEND_IMPORTERS - found, (
        f"no longer importers (take them off the list): {sorted(FILES_BACKEND_IMPORTERS - found)}"
    )


# -- the checks themselves, over a small tree -------------------------------------------------------


def _tree(root: Path, files: Mapping[str, str]) -> None:
    for package in PACKAGES:
        (root / package).mkdir(parents=True, exist_ok=True)
        (root / package / "__init__.py").touch()
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text, encoding="utf-8")


@pytest.mark.parametrize(
    "files",
    [
        {"conversations/a.py": "from conversations.b import x\n", "conversations/b.py": "from . import a\n"},
        {  # hidden in a function and under TYPE_CHECKING: still a circle
            "gateway/a.py": "def f():\n    from gateway.b import y\n",
            "gateway/b.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from gateway.c import z\n",
            "gateway/c.py": "from . import a\n",
        },
    ],
)
def test_a_circle_is_found(tmp_path: Path, files: Mapping[str, str]) -> None:
    _tree(tmp_path, files)
    assert len(circles(import_graph(module_files(tmp_path)))) == 1


def test_a_line_is_not_a_circle(tmp_path: Path) -> None:
    _tree(tmp_path, {"conversations/a.py": "from conversations.b import x\n", "conversations/b.py": "import os\n"})
    assert circles(import_graph(module_files(tmp_path))) == []


@pytest.mark.parametrize(
    ("rel", "text"),
    [
        ("config/a.py", "from sessions.keys import parse_key\n"),
        ("sessions/a.py", "def f():\n    import gateway.app\n"),
        ("memory/a.py", "from conversations import turns\n"),
        ("scheduler/a.py", "from gateway.services import Services\n"),
        ("channels/a.py", "from aiohttp import web\n"),
        ("conversations/a.py", "from aiohttp.web import Response\n"),
        ("conversations/b.py", "from gateway.keys import STORE\n"),
        ("home/a.py", "from sessions.faults import storage_error\n"),
        ("home/b.py", "def f():\n    from backups import pack\n"),
        ("backups/a.py", "from gateway.offline import open_offline\n"),
        ("sessions/postgres/a.py", "from sessions.files.jsonl import iter_records\n"),
        ("sessions/inmemory/a.py", "from sessions.postgres import store\n"),
    ],
)
def test_a_forbidden_arrow_is_found(tmp_path: Path, rel: str, text: str) -> None:
    _tree(tmp_path, {rel: text})
    assert len(forbidden_arrows(tmp_path, module_files(tmp_path))) == 1


def test_an_allowed_arrow_is_not_refused(tmp_path: Path) -> None:
    _tree(tmp_path, {
        "home/a.py": "from config.errors import Conflict\n",
        "sessions/postgres/a.py": "from sessions.codec import decode\nfrom home.layout import Home\n",
        "sessions/files/a.py": "from sessions.postgres import store\n",  # no rule of the files backend
    })  # fmt: skip
    assert forbidden_arrows(tmp_path, module_files(tmp_path)) == []


def test_an_importer_of_the_files_backend_is_found(tmp_path: Path) -> None:
    _tree(tmp_path, {
        "gateway/a.py": "def f():\n    from sessions.files import bulk\n",
        "gateway/b.py": "from sessions.filesystem import x\n",  # another module whose name starts alike
        "sessions/files/c.py": "from sessions.files.jsonl import iter_records\n",  # the backend itself
    })  # fmt: skip
    assert files_backend_importers(module_files(tmp_path)) == {"gateway.a"}
