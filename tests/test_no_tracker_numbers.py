"""No tracker numbers where users and readers of the code look: "issue 26" means nothing to them, so
the README, the docs, the defaults file, the benchmarks and the packages' code say what the thing
is instead. Read in-process (a few hundred files, well under a second)."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
TRACKER = re.compile(r"\bissues? #?\d+", re.IGNORECASE)
PACKAGES = ("gateway", "conversations", "sessions", "memory", "scheduler", "config", "channels", "backups")
TEXT = {".py", ".md", ".yaml", ".yml", ".toml", ".lua", ".html", ".js", ".css", ".sql", ".txt"}
# A GitHub issue in the webhook example (what the hook renders from the payload), not this tracker.
ALLOWED = {("docs/webhooks.md", "octocat opened issue #42: Crash on start")}


def checked_files() -> Iterator[Path]:
    yield REPO / "README.md"
    yield REPO / "mkdocs.yml"
    yield REPO / "config" / "defaults.yaml"
    for folder in ("docs", "bench", *PACKAGES):
        for path in sorted((REPO / folder).rglob("*")):
            if path.is_file() and path.suffix in TEXT and "__pycache__" not in path.parts:
                yield path


def tracker_numbers(path: Path) -> list[str]:
    """``file:line: text`` of each tracker number in the file, the allowed ones aside."""
    rel = str(path.relative_to(REPO))
    found = []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if TRACKER.search(line) and (rel, line.strip()) not in ALLOWED:
            found.append(f"{rel}:{number}: {line.strip()}")
    return found


def test_no_tracker_number_in_readme_docs_defaults_bench_or_package_code() -> None:
    files = list(checked_files())
    assert len(files) > 100  # the packages, the docs and the benchmarks are all read
    found = [hit for path in files for hit in tracker_numbers(path)]
    assert not found, "say what the thing is instead of its tracker number:\n" + "\n".join(found)


@pytest.mark.parametrize(
    ("line", "hit"),
    [("since issue 26: on REALTALK", True), ("(issues 3 and 14)", True), ("Issue 26, third round", True),
     ("see #28 or issue #28", True), ("hook:github:owner/repo:issue:123", False), ("the issue's target", False)],
)  # fmt: skip
def test_the_pattern(line: str, hit: bool) -> None:
    assert bool(TRACKER.search(line)) is hit
