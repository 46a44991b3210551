"""The store port names no backend's types where a capability is backend-neutral: a backend
implements ``HistorySource`` with its own index (the files backend's SQLite FTS5, the postgres
backend's table), and the daemon holds it as ``HistoryIndexProtocol``."""

from __future__ import annotations

import typing
from collections.abc import Iterator

import pytest

from sessions import protocol
from sessions.history_index import HistoryIndexProtocol, own_index

BACKENDS = ("sessions.files", "sessions.inmemory", "sessions.postgres")


def _named_types(hint: object) -> Iterator[type]:
    if isinstance(hint, type):
        yield hint
    for arg in typing.get_args(hint):
        yield from _named_types(arg)


def _hints(cls: type, method: str) -> dict[str, object]:
    from sessions.exports import RunExport  # under TYPE_CHECKING in the protocol module

    return typing.get_type_hints(getattr(cls, method), globalns={**vars(protocol), "RunExport": RunExport})


@pytest.mark.parametrize(
    ("cls", "method"),
    [
        (protocol.HistorySource, "open_history"),
        (protocol.HistorySource, "rebuild_history"),
        (protocol.HistorySource, "catch_up_history"),
        (protocol.HistorySource, "check_history"),
        (protocol.Maintenance, "purge"),
    ],
)
def test_history_capability_names_no_backend_type(cls: type, method: str) -> None:
    named = {t for hint in _hints(cls, method).values() for t in _named_types(hint)}
    leaked = sorted(f"{t.__module__}.{t.__qualname__}" for t in named if t.__module__.startswith(BACKENDS))
    assert leaked == [], f"{cls.__name__}.{method} names a backend's type"
    assert HistoryIndexProtocol in named


def test_a_backend_refuses_another_backends_index() -> None:
    class Theirs:
        pass

    class Ours:
        pass

    mine = Ours()
    assert own_index(typing.cast(HistoryIndexProtocol, mine), Ours) is mine
    with pytest.raises(TypeError, match="Theirs is not this backend's history index"):
        own_index(typing.cast(HistoryIndexProtocol, Theirs()), Ours)
