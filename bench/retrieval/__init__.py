"""The retrieval evaluation's data: generated memories with planted facts and their questions."""
