"""The docs site's generated pages cover what they document, and the README stays a user's guide.

The configuration reference has a row for every key of config/defaults.yaml and a table for every
model of a list or mapping entry; the CLI reference a section for every command of the parser; the
HTTP API reference a section for every route of the OpenAPI document. The generators refuse to
build a page that would miss something (checked here too), and ``make docs`` (mkdocs --strict)
fails on a broken link or anchor or a page missing from the navigation. All in-process: the pages
are built as the site's hook builds them (about a second)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from config import loader, reference
from config.loader import load_defaults, parse_yaml
from config.settings import Settings
from gateway import cli_reference, docs_site
from gateway.api_reference import api_markdown, gateway_document
from gateway.cli import build_parser

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def pages() -> dict[str, str]:
    return docs_site.pages()


def rows(page: str) -> set[str]:
    """The first cell of every table row: ``| `gateway.port` | ...`` gives ``gateway.port``."""
    return set(re.findall(r"^\| `([^`]+)` \|", page, re.MULTILINE))


def test_the_configuration_reference_has_a_row_for_every_key_of_defaults_yaml(pages: dict[str, str]) -> None:
    page = pages[docs_site.CONFIGURATION]
    keys = reference.yaml_keys(load_defaults())
    assert len(keys) > 150
    headings = set(re.findall(r"^## (\S+)$", page, re.MULTILINE))  # a top-level section: its own heading
    assert keys <= rows(page) | headings
    assert {"gateway", "memory", "channels"} <= headings
    # each row shows the default as defaults.yaml writes it, and the file's comment
    assert "| `gateway.port` | `8787` | int | ≥ 0, ≤ 65535 |" in page
    assert "| `memory.search.speaker_weight` | `0.2` | float | ≥ 0, ≤ 1 | a chat turn spoken by a person" in page


def test_every_entry_model_has_its_table(pages: dict[str, str]) -> None:
    page = pages[docs_site.CONFIGURATION]
    for model in ("TelegramAccount", "SlackAccount", "CommandAccess", "CronJob", "HookMapping", "Binding"):
        assert f"\n### {model}\n" in page
    from config.channels import TelegramAccount

    telegram = page.split("\n### TelegramAccount\n")[1].split("\n### ")[0]
    assert set(TelegramAccount.model_fields) <= rows(telegram)


def test_a_key_the_models_do_not_know_stops_the_page(monkeypatch: pytest.MonkeyPatch) -> None:
    text = loader.defaults_text() + "\nnewsection:\n  knob: 1            # documented, but not in the models\n"
    monkeypatch.setattr(reference, "defaults_text", lambda: text)
    monkeypatch.setattr(reference, "load_defaults", lambda: parse_yaml(text))
    with pytest.raises(ValueError, match=r"newsection"):
        reference.configuration_markdown()


def test_a_key_without_its_line_stops_the_page(monkeypatch: pytest.MonkeyPatch) -> None:
    """The line reader and YAML must agree: a key the reader missed would be a missing row."""
    scanned = reference.scan(loader.defaults_text())
    assert {e.path for e in scanned.entries} == reference.yaml_keys(load_defaults())
    monkeypatch.setattr(reference, "scan", lambda _: reference.Scan([], scanned.entries[1:]))
    with pytest.raises(ValueError, match=r"gateway"):
        reference.configuration_markdown()


def test_the_model_paths_are_the_defaults_keys() -> None:
    assert {path for path, _ in reference.model_fields(Settings)} == reference.yaml_keys(load_defaults())


def test_the_cli_reference_has_every_command(pages: dict[str, str]) -> None:
    page = pages[docs_site.CLI]
    commands = [" ".join(["neotask", *words]) for words, _, _ in cli_reference.commands(build_parser())]
    assert {"neotask init", "neotask service install", "neotask sessions list", "neotask channels approve",
            "neotask backup verify", "neotask storage copy"} <= set(commands)  # fmt: skip
    for name in commands:
        assert f"\n## {name}\n" in page, name
    assert "usage: neotask sessions list [-h]" in page


def test_the_api_reference_has_every_route(pages: dict[str, str]) -> None:
    page = pages[docs_site.HTTP_API]
    document = gateway_document()
    assert len(document["paths"]) > 40
    for path, item in document["paths"].items():
        for method in item:
            assert f"\n### {method.upper()} {path}\n" in page, (method, path)
    for name in document["components"]["schemas"]:
        assert f"\n### {name}\n" in page


def test_a_route_the_reference_cannot_show_stops_the_page() -> None:
    document = gateway_document()
    document["paths"]["/v1/new"] = {"query": {"summary": "OpenAPI 3.2's QUERY method"}}
    with pytest.raises(ValueError, match=r"/v1/new"):
        api_markdown(document)


def test_every_page_of_docs_is_in_the_site_navigation() -> None:
    """mkdocs --strict fails on it too; this says which page, without building the site."""
    nav = yaml.safe_load((REPO / "mkdocs.yml").read_text(encoding="utf-8"))["nav"]
    listed = set(re.findall(r"'([^']+\.md)'", repr(nav)))
    written = {str(p.relative_to(REPO / "docs")) for p in (REPO / "docs").rglob("*.md")}
    assert written | set(docs_site.pages()) == listed


def test_the_readme_is_a_users_guide_within_300_lines() -> None:
    lines = (REPO / "README.md").read_text(encoding="utf-8").splitlines()
    assert len(lines) <= 300
    assert any("make run" in line for line in lines[:6]) and any("make test" in line for line in lines[:6])
    for section in ("## Installing it", "## The first five minutes", "## The CLI at a glance",
                    "## The API at a glance", "## Where the docs are", "## Development"):  # fmt: skip
        assert section in lines, section
