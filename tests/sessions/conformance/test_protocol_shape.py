"""The Protocol itself: it speaks of runs and records (no ``Any``, no paths, no attribute to
mutate), and every backend the suite runs implements each method of the capabilities it claims."""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

import sessions.protocol as protocol
from sessions.files.store import SessionStore
from sessions.inmemory import MemoryStore
from sessions.postgres.store import PgStore
from tests.sessions.conformance.support import BACKENDS, BASE, SERVER_BACKENDS

SOURCE = Path(protocol.__file__).read_text()
CAPABILITIES = ("RunStore", "DeliveryRecords", "CompatRecords", "UsageRecords", "HistorySource", "Maintenance")
CLASSES = {"files": SessionStore, "memory": MemoryStore, "postgres": PgStore}


def _methods(name: str) -> set[str]:
    """The methods a capability declares, with those of the capabilities it extends (``Maintenance``
    is ``Doctor``'s ``check`` and its own)."""
    node = next(n for n in ast.parse(SOURCE).body if isinstance(n, ast.ClassDef) and n.name == name)
    inherited = [b.id for b in node.bases if isinstance(b, ast.Name) and b.id != "Protocol"]
    own = {f.name for f in node.body if isinstance(f, ast.FunctionDef | ast.AsyncFunctionDef)}
    return own.union(*(_methods(base) for base in inherited))


def test_the_protocol_names_no_any_no_path_and_no_mutable_attribute() -> None:
    tree = ast.parse(SOURCE)
    names = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)} | {
        n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute)
    }
    assert not names & {"Any", "Path", "Home", "sqlite3"}
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name in CAPABILITIES:
            assert not [n for n in node.body if isinstance(n, ast.AnnAssign)], f"{node.name} declares an attribute"


def test_every_backend_implements_the_capabilities_it_claims() -> None:
    assert sum(BASE in backend.capabilities for backend in BACKENDS.values()) >= 2  # the suite runs twice
    claimed = {name: backend.capabilities for name, backend in BACKENDS.items()}
    claimed.update({name: capabilities for name, (_, _, capabilities) in SERVER_BACKENDS.items()})
    for name, capabilities in claimed.items():
        assert capabilities <= set(CAPABILITIES)
        for capability in capabilities:
            for method in _methods(capability):
                assert callable(getattr(CLASSES[name], method, None)) or method == "clock", (name, method)
                declared = getattr(getattr(protocol, capability), method)
                implemented = getattr(CLASSES[name], method, None)
                if implemented is not None and inspect.iscoroutinefunction(declared):
                    assert inspect.iscoroutinefunction(implemented), (name, method)


def test_the_backends_that_take_backups_give_a_backup() -> None:
    """``StoreProtocol.backup`` (what the daemon's backups take): files and postgres."""
    assert _methods("Backup") == {"stage_backup"}
    for cls in (SessionStore, PgStore):
        assert isinstance(inspect.getattr_static(cls, "backup"), property), cls
        returned = inspect.signature(inspect.getattr_static(cls, "backup").fget).return_annotation
        assert "Backup" in str(returned), (cls, returned)
