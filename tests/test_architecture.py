"""The layout is the architecture (docs/ARCHITECTURE.md): no import circle between modules, the
arrows between packages point one way, the storage backends are private (only the composition
root and the storage copier import them), and the document names every package, every rule below
and every module.

Imports are read with ``ast`` from every module of the packages, wherever they stand (top level,
``if TYPE_CHECKING:``, inside a function): an import hidden in a function is still an arrow."""

from __future__ import annotations

import ast
import functools
import re
from collections.abc import Iterator, Mapping
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "ARCHITECTURE.md"
PACKAGES = ("config", "home", "sessions", "memory", "scheduler", "channels", "backups", "conversations", "gateway")
OURS = PACKAGES

# package -> the packages of ours it may import; any other is refused (the table "may import" of
# docs/ARCHITECTURE.md, which a test below reads back)
ALLOWED: Mapping[str, tuple[str, ...]] = {
    "config": (),
    "home": ("config",),
    "sessions": ("home", "config"),
    "memory": ("config",),
    "scheduler": ("config",),
    "backups": ("sessions", "home", "config"),
    "conversations": ("sessions", "memory", "home", "config"),
    "channels": ("sessions", "config"),  # and the engine in the modules of EXCEPTIONS
    "gateway": tuple(p for p in OURS if p != "gateway"),
}
# package (or a package of one) -> further module prefixes it must not import (a trailing "*":
# every module whose name starts so)
HTTP_SERVER = "aiohttp.web"  # only the gateway serves HTTP
FURTHER: Mapping[str, tuple[str, ...]] = {
    "config": (HTTP_SERVER,),
    "home": (HTTP_SERVER,),
    "sessions": ("aiohttp",),  # knows nothing of HTTP, not even a client
    "sessions.postgres": ("sessions.files",),
    "sessions.inmemory": ("sessions.files", "sessions.postgres"),
    "memory": (HTTP_SERVER,),
    "scheduler": (HTTP_SERVER,),
    "channels": (HTTP_SERVER,),
    "backups": (HTTP_SERVER,),
    "conversations": (HTTP_SERVER,),
    # a platform's update never crosses into the gateway: it reads the registry and the intake
    "gateway": ("channels.telegram*", "channels.slack*", "channels.discord*", "channels.matrix*"),
}
FORBIDDEN: Mapping[str, tuple[str, ...]] = {
    package: (*(p for p in OURS if p != package.split(".")[0] and p not in ALLOWED.get(package, OURS)),
              *FURTHER.get(package, ()))
    for package in (*PACKAGES, *FURTHER)
}  # fmt: skip
# (package, prefix) -> the modules of the package that may import it all the same, by name
EXCEPTIONS: Mapping[tuple[str, str], frozenset[str]] = {
    # the one stored -> background turn -> deliver path, the intake on it, the webhook deliverer's report
    ("channels", "conversations"): frozenset({"channels.background", "channels.intake", "channels.delivery"}),
}


# The backends are private: no module outside a backend's own package imports it, but the
# composition root (the one module that chooses a backend) and the storage copier. Everything
# else reaches a backend through the capabilities of ``sessions.protocol``.
BACKENDS = ("sessions.files", "sessions.postgres", "sessions.inmemory")
BACKEND_IMPORTERS = frozenset({"sessions.backends", "sessions.copying"})


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
    if prefix.endswith("*"):
        return name.startswith(prefix[:-1])
    return name == prefix or name.startswith(prefix + ".")


def forbidden_arrows(root: Path, modules: Mapping[str, Path]) -> list[str]:
    bad = set()
    for name, path in modules.items():
        rules = [
            (package, prefix)
            for package, banned in FORBIDDEN.items()
            if _under(name, package)
            for prefix in banned
            if name not in EXCEPTIONS.get((package, prefix), ())
        ]
        for candidates in imports(name, path):
            for package, prefix in rules:
                if any(_under(c, prefix) for c in candidates):
                    bad.add(f"{path.relative_to(root)} imports {prefix} ({package} must not)")
    return sorted(bad)


def backend_importers(modules: Mapping[str, Path]) -> dict[str, set[str]]:
    """Backend -> the modules outside its package that import it."""
    return {
        backend: {
            name
            for name, path in modules.items()
            if not _under(name, backend) and any(_under(c, backend) for cs in imports(name, path) for c in cs)
        }
        for backend in BACKENDS
    }


def test_no_import_circle_between_modules() -> None:
    found = circles(import_graph(module_files(ROOT)))
    assert found == [], "import circles (share types through one module all import, or pass callables):\n" + "\n".join(
        " -> ".join(c) for c in found
    )


def test_no_forbidden_arrow_between_packages() -> None:
    assert forbidden_arrows(ROOT, module_files(ROOT)) == []


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_backend_is_imported_only_by_the_composition_root_and_the_copier(backend: str) -> None:
    found = backend_importers(module_files(ROOT))[backend]
    assert found <= BACKEND_IMPORTERS, f"modules importing {backend}: {sorted(found - BACKEND_IMPORTERS)}"


def rule_rows(doc: str) -> dict[str, tuple[str, str]]:
    """The document's table of rules (its header ``| package | may import | must not import ...``):
    package -> (its "may import" cell, its "must not import" cell)."""
    rows: dict[str, tuple[str, str]] = {}
    lines = iter(doc.splitlines())
    for line in lines:
        if line.startswith("| package | may import | must not import"):
            break
    for line in lines:
        if not line.startswith("|"):
            break
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        match = re.fullmatch(r"`([a-z_]+)/`", cells[0])
        if len(cells) == 3 and match:
            rows[match.group(1)] = (cells[1], cells[2])
    return rows


def _written(prefix: str) -> str:
    """A rule's prefix as the document writes it: ``sessions.files`` as `sessions/files/`."""
    if prefix.split(".")[0] not in OURS:
        return f"`{prefix}`"
    return f"`{prefix.replace('.', '/')}{'' if prefix.endswith('*') else '/'}`"


def undrawn_rules(doc: str) -> list[str]:
    """The rules above the document's table does not state."""
    rows = rule_rows(doc)
    wrong = [f"no row for {p}/" for p in PACKAGES if p not in rows]
    for package, (may, _) in rows.items():
        if package not in ALLOWED:
            wrong.append(f"a row for {package}/, which is no package of the test")
            continue
        drawn = set(re.findall(r"`([a-z_]+)/`", may.split(";")[0])) - {package}
        expected = set(ALLOWED[package])
        if package == "gateway" and may.startswith("everything"):
            drawn = expected
        if drawn != expected:
            wrong.append(f"{package}/ may import {sorted(expected)}, the document says {sorted(drawn)}")
    for key, banned in FURTHER.items():
        package = key.split(".")[0]
        _, must_not = rows.get(package, ("", ""))
        for text in [*([_written(key)] if key != package else []), *map(_written, banned)]:
            if text not in must_not:
                wrong.append(f"{package}/'s row does not name {text} ({key} must not import {', '.join(banned)})")
    sessions_may, _ = rows.get("sessions", ("", ""))
    for module in sorted(BACKEND_IMPORTERS):  # the backends are private but to these
        if f"`{module.split('.')[-1]}.py`" not in sessions_may:
            wrong.append(f"sessions/'s row does not name {module}, the one module outside a backend to import it")
    for (package, prefix), modules in EXCEPTIONS.items():
        may, _ = rows.get(package, ("", ""))
        for module in sorted(modules):
            if f"`{module.split('.')[-1]}.py`" not in may:
                wrong.append(f"{package}/'s row does not name {module}, which may import {prefix}")
    return wrong


_HEADING = re.compile(r"^(#+)\s+(.*)$")
_FOLDER = re.compile(r"(?<![\w/.])((?:[a-z_]+/)+)(?![\w.])")


def doc_sections(doc: str) -> list[tuple[str | None, str]]:
    """(folder, text) of each section of the document: the folder its heading names (`sessions/files/`),
    else the one of the heading above it."""
    found: list[tuple[str | None, str]] = []
    headings: list[tuple[int, str | None]] = []
    folder: str | None = None
    lines: list[str] = []
    for line in doc.splitlines():
        match = _HEADING.match(line)
        if match is None:
            lines.append(line)
            continue
        found.append((folder, "\n".join(lines)))
        level, named = len(match.group(1)), _FOLDER.search(match.group(2))
        while headings and headings[-1][0] >= level:
            headings.pop()
        folder = named.group(1) if named else (headings[-1][1] if headings else None)
        headings.append((level, folder))
        lines = []
    found.append((folder, "\n".join(lines)))
    return found


def unnamed_modules(root: Path, modules: Mapping[str, Path], doc: str) -> list[str]:
    """The modules (but ``__init__``) the document does not name: by their path anywhere, or by
    their path below the folder of a section that stands for one of their folders
    (``store.py`` under a heading naming `sessions/files/`, ``api/runs.py`` under `gateway/`)."""
    sections = doc_sections(doc)
    missing = []
    for path in modules.values():
        if path.name == "__init__.py":
            continue
        rel = path.relative_to(root).as_posix()
        if re.search(rf"(?<![\w/]){re.escape(rel)}", doc):
            continue
        if not any(
            folder and rel.startswith(folder) and re.search(rf"(?<![\w/.]){re.escape(rel[len(folder):])}", text)
            for folder, text in sections
        ):
            missing.append(rel)
    return sorted(missing)


def test_every_package_is_under_the_rules() -> None:
    packages = {p.parent.name for p in ROOT.glob("*/__init__.py")} - {"tests", "bench"}
    assert packages == set(PACKAGES) == set(ALLOWED), "a package of the code without its rules (or rules of none)"


def test_the_document_states_every_rule_of_the_test() -> None:
    assert undrawn_rules(DOC.read_text(encoding="utf-8")) == []


def test_the_document_names_every_module() -> None:
    missing = unnamed_modules(ROOT, module_files(ROOT), DOC.read_text(encoding="utf-8"))
    assert missing == [], "modules docs/ARCHITECTURE.md does not name (in their package's section):\n" + "\n".join(
        missing
    )


def clock_readers(root: Path, modules: Mapping[str, Path]) -> list[str]:
    """The places that read the time of day themselves (``datetime.now()``, ``date.today()``, ...)
    instead of the injected clock; the system clock itself (``config/clock.py``) is the one."""
    found = []
    for name, path in modules.items():
        if name == "config.clock":
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                    and node.func.attr in ("now", "utcnow", "today")
                    and ast.unparse(node.func.value).split(".")[-1] in ("datetime", "date")):  # fmt: skip
                found.append(f"{path.relative_to(root)}:{node.lineno}")
    return sorted(found)


def test_the_time_comes_from_the_clock() -> None:
    assert clock_readers(ROOT, module_files(ROOT)) == []


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
        ("memory/a.py", "from sessions.keys import parse_key\n"),  # memory knows nothing of sessions
        ("scheduler/a.py", "from sessions.records import RunState\n"),
        ("sessions/a.py", "import aiohttp\n"),
        ("backups/a.py", "from aiohttp.web import Response\n"),
        ("channels/telegram.py", "from conversations.turns import Post\n"),  # a connector: not the engine
        ("gateway/a.py", "from channels.telegram_updates import to_inbound\n"),
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
        "channels/intake.py": "from conversations.turns import Post\n",  # an exception by name
        "gateway/a.py": "from channels.registry import PLATFORMS\nimport aiohttp.web\n",
        "conversations/a.py": "import aiohttp\n",  # a client
    })  # fmt: skip
    assert forbidden_arrows(tmp_path, module_files(tmp_path)) == []


def test_an_importer_of_a_backend_is_found(tmp_path: Path) -> None:
    _tree(tmp_path, {
        "gateway/a.py": "def f():\n    from sessions.files import bulk\n",
        "gateway/b.py": "from sessions.filesystem import x\n",  # another module whose name starts alike
        "sessions/files/c.py": "from sessions.files.jsonl import iter_records\n",  # the backend itself
        "sessions/files/d.py": "from sessions.postgres import store\n",  # a backend reaching into another
        "backups/e.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from sessions.inmemory import data\n",
        "sessions/backends.py": "from sessions.postgres.store import PgStore\n",  # the composition root
    })  # fmt: skip
    assert backend_importers(module_files(tmp_path)) == {
        "sessions.files": {"gateway.a"},
        "sessions.postgres": {"sessions.files.d", "sessions.backends"},
        "sessions.inmemory": {"backups.e"},
    }


def test_a_module_the_document_does_not_name_is_found(tmp_path: Path) -> None:
    _tree(tmp_path, {"sessions/files/store.py": "", "sessions/files/jsonl.py": "", "sessions/keys.py": "",
                     "gateway/api/runs.py": "", "gateway/api/memory.py": "", "memory/store.py": ""})  # fmt: skip
    doc = (
        "# Architecture\n## sessions/\n`keys.py`\n### Neutral modules\n`jsonl.py` (not this folder's)\n"
        "### `sessions/files/`\n| `store.py` |\n## gateway/\n`api/runs.py`, `memory/store.py` elsewhere\n"
    )
    # memory/store.py is named by its path; jsonl.py only in another folder's section
    missing = unnamed_modules(tmp_path, module_files(tmp_path), doc)
    assert missing == ["gateway/api/memory.py", "sessions/files/jsonl.py"]


def test_a_rule_the_document_leaves_out_is_found() -> None:
    doc = DOC.read_text(encoding="utf-8")
    assert undrawn_rules(doc) == []
    for old, new in [("`memory/` | `config/` |", "`memory/` | `config/`, `sessions/` |"),
                     ("`sessions/postgres/`", "the PostgreSQL backend"), ("`intake.py`", "the intake")]:  # fmt: skip
        assert old in doc
        assert undrawn_rules(doc.replace(old, new)), new


def test_a_clock_read_of_its_own_is_found(tmp_path: Path) -> None:
    _tree(tmp_path, {
        "sessions/a.py": "import datetime\ndef f():\n    return datetime.datetime.now()\n",
        "memory/b.py": "from datetime import date\ntoday = date.today()\n",
        "config/clock.py": "from datetime import datetime\ndef system_clock():\n    return datetime.now()\n",
        "gateway/c.py": "def f(clock):\n    return clock.now()\n",  # an injected clock
    })  # fmt: skip
    assert clock_readers(tmp_path, module_files(tmp_path)) == ["memory/b.py:2", "sessions/a.py:3"]
