"""The generated pages of the docs site: the configuration, CLI and HTTP API references, built from
the code each time the site is built, so they cannot drift from it. Nothing generated is committed.

``mkdocs.yml`` loads this file as a hook: ``on_files`` adds the pages to the site (``make docs``:
``mkdocs build --strict``, where a page missing from the navigation, a broken link or anchor fails
the build). ``python -m gateway.docs_site DIR`` writes them into a folder to read them as files.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

CONFIGURATION = "reference/configuration.md"
CLI = "reference/cli.md"
HTTP_API = "reference/http-api.md"


def pages() -> dict[str, str]:
    """Each generated page's path in the site and its Markdown."""
    from config.reference import configuration_markdown
    from gateway.api_reference import api_markdown, gateway_document
    from gateway.cli import build_parser
    from gateway.cli_reference import cli_markdown

    return {
        CONFIGURATION: configuration_markdown(),
        CLI: cli_markdown(build_parser()),
        HTTP_API: api_markdown(gateway_document()),
    }


def on_files(files: Any, config: Any) -> Any:
    """The mkdocs hook: the generated pages join the site's files."""
    from mkdocs.structure.files import File

    for path, text in pages().items():
        files.append(File.generated(config, path, content=text))
    return files


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m gateway.docs_site", description=__doc__)
    parser.add_argument("folder", type=Path, help="where to write the generated pages")
    args = parser.parse_args(argv)
    for path, text in pages().items():
        target = args.folder / path
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text, encoding="utf-8")
        print(target)
    return 0


if __name__ == "__main__":
    sys.exit(main())
