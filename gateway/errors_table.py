"""``python -m gateway.errors_table > ...``: the error table of docs/errors.md, printed once every
route module and error class is loaded (through the app), which ``gateway/openapi.py`` itself
cannot import: the app serves the document it builds."""

from __future__ import annotations

import gateway.app  # noqa: F401  (every route module and error class loaded)
from gateway.openapi import errors_markdown

if __name__ == "__main__":
    print(errors_markdown(), end="")
