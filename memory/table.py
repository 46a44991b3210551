"""What the chunk table holds: the identity of an index (what makes its stored vectors and chunk
boundaries what they are), the table's columns, and a file's chunks with their vectors as rows."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import pyarrow as pa

from memory.chunking import Chunk
from memory.embedders import EmbedderIdentity, Vectors

# 2: chunks carry context (date, preceding turn) and long lines are cut between words; 3: a block of
# headings only joins the section right under it (alone, a few words near any question)
CHUNKER_VERSION = 3


@dataclass(frozen=True)
class IndexIdentity:
    """Everything that makes stored vectors and chunk boundaries what they are."""

    provider: str
    model: str
    dimensions: int
    chunk_tokens: int
    overlap_tokens: int
    max_input_tokens: int | None
    chunker: int = CHUNKER_VERSION

    @classmethod
    def of(
        cls, embedder: EmbedderIdentity, chunk_tokens: int, overlap_tokens: int, max_input: int | None
    ) -> IndexIdentity:
        return cls(embedder.provider, embedder.model, embedder.dimensions, chunk_tokens, overlap_tokens, max_input)

    @property
    def embedder(self) -> EmbedderIdentity:
        return EmbedderIdentity(self.provider, self.model, self.dimensions)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    @property
    def tag(self) -> str:
        """A short hash of the identity, part of the name of every table built for it (so the
        table a rebuild killed midway left behind is known for what it holds)."""
        import hashlib

        return hashlib.sha256(json.dumps(self.as_dict(), sort_keys=True).encode()).hexdigest()[:12]

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> IndexIdentity:
        return cls(**{k: data[k] for k in cls.__dataclass_fields__ if k in data})


def schema(dims: int) -> pa.Schema:
    return pa.schema(
        [
            ("chunk_id", pa.string()),
            ("agent", pa.string()),
            ("path", pa.string()),
            ("start_line", pa.int32()),
            ("end_line", pa.int32()),
            ("heading", pa.string()),
            ("text", pa.string()),
            ("content", pa.string()),  # heading + text: what was embedded and what full text searches
            ("content_hash", pa.string()),
            ("file_hash", pa.string()),
            ("vector", pa.list_(pa.float32(), dims)),
        ]
    )


def rows_table(agent: str, file_hash: str, chunks: Sequence[Chunk], vectors: Vectors, dims: int) -> pa.Table:
    import hashlib

    ids = [
        hashlib.sha256(f"{agent}\0{c.path}\0{c.start_line}\0{c.end_line}\0{c.content_hash}".encode()).hexdigest()[:24]
        for c in chunks
    ]
    flat = pa.array(np.ascontiguousarray(vectors, dtype=np.float32).reshape(-1), type=pa.float32())
    return pa.Table.from_arrays(
        [
            pa.array(ids),
            pa.array([agent] * len(chunks)),
            pa.array([c.path for c in chunks]),
            pa.array([c.start_line for c in chunks], pa.int32()),
            pa.array([c.end_line for c in chunks], pa.int32()),
            pa.array([c.heading for c in chunks]),
            pa.array([c.text for c in chunks]),
            pa.array([c.embed_text for c in chunks]),
            pa.array([c.content_hash for c in chunks]),
            pa.array([file_hash] * len(chunks)),
            pa.FixedSizeListArray.from_arrays(flat, dims),
        ],
        schema=schema(dims),
    )
