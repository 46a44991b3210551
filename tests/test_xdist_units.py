"""The files tests/conftest.py hands out first or as one unit exist (a renamed file would silently lose
its place), and every file that takes a model fixture of tests/memory/conftest.py is in the model unit
(one outside it loads the models again on another worker)."""

from __future__ import annotations

import re
from pathlib import Path

from tests.conftest import MODEL_FILES, SLOW_FILES_FIRST

ROOT = Path(__file__).resolve().parents[1]
MODEL_FIXTURES = re.compile(r"\b(use_embedder|e5_embedder|default_embedder|minilm|routed_embedder)\b")


def test_the_named_files_exist() -> None:
    missing = [name for name in (*SLOW_FILES_FIRST, *MODEL_FILES) if not (ROOT / name).is_file()]
    assert not missing, missing


def test_every_file_taking_a_model_fixture_is_in_the_model_unit() -> None:
    takers = {
        path.relative_to(ROOT).as_posix()
        for path in (ROOT / "tests").rglob("test_*.py")
        if MODEL_FIXTURES.search(path.read_text("utf-8"))
    }
    assert takers - {Path(__file__).relative_to(ROOT).as_posix()} <= set(MODEL_FILES), takers - set(MODEL_FILES)
