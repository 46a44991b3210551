"""Every file the packages read that is not Python is in the wheel: pyproject.toml's package-data
covers each one (checked here in-process; ``test_wheel.py`` builds and installs the wheel)."""

from __future__ import annotations

import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SKIPPED = ("__pycache__", ".pyc", ".mypy_cache")


def packages_and_data() -> tuple[list[str], dict[str, list[str]]]:
    setuptools = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["tool"]["setuptools"]
    roots = [pattern.rstrip("*") for pattern in setuptools["packages"]["find"]["include"]]
    return roots, setuptools["package-data"]


def data_files() -> list[Path]:
    roots, _ = packages_and_data()
    return sorted(
        path
        for root in roots
        for path in (REPO / root).rglob("*")
        if path.is_file() and path.suffix != ".py" and not any(part.endswith(SKIPPED) for part in path.parts)
    )


def test_every_data_file_of_the_packages_is_package_data() -> None:
    _, package_data = packages_and_data()
    covered = {  # what setuptools takes: each pattern globbed from its package's folder
        path for package, patterns in package_data.items() for pattern in patterns
        for path in (REPO / Path(*package.split("."))).glob(pattern) if path.is_file()
    }  # fmt: skip
    missing = [str(path.relative_to(REPO)) for path in data_files() if path not in covered]
    assert missing == [], "add them to [tool.setuptools.package-data] in pyproject.toml"
    assert {str(p.relative_to(REPO)) for p in data_files()} >= {"config/defaults.yaml", "gateway/static/index.html"}
