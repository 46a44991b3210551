"""The records the memory service hands out (frozen dataclasses; ``as_dict`` gives the JSON)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass(frozen=True)
class SearchHit:
    """One search result; the first seven fields are the SPEC's response shape.

    ``score`` is the one fused score in [0, 1] that orders the results and that every caller shows
    (after any recency decay; with score fusion the weighted mean of the two below, absolute, so
    comparable across queries; with RRF the rank fusion's value); ``vector_score`` is the cosine
    similarity clamped to [0, 1] and ``text_score`` the text strength
    (``memory.fusion.text_strength``; with RRF: the share of the query's terms the chunk holds),
    both also in [0, 1].
    """

    path: str
    start_line: int
    end_line: int
    heading: str
    score: float
    snippet: str
    citation: str
    vector_score: float
    text_score: float
    chunk_id: str

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class MemoryFile:
    """A memory source file of an agent: ``path`` relative to the workspace (POSIX separators)."""

    path: str
    size: int
    mtime: float

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class IndexReport:
    """What one indexing run did."""

    files_scanned: int = 0
    files_changed: int = 0
    files_removed: int = 0
    chunks_embedded: int = 0
    chunks_reused: int = 0
    chunks_deleted: int = 0
    rebuilt: bool = False
    seconds: float = 0.0
    errors: tuple[str, ...] = field(default_factory=tuple)

    def as_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["errors"] = list(self.errors)
        return out


@dataclass(frozen=True)
class AppendResult:
    """What ``append_daily`` did: the file (relative path), and the lines added and skipped."""

    path: str
    appended: int
    skipped: int

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)
