"""Run ``neotask`` (``gateway.cli.main``) in this process and, at its exit, write the top-level
packages it had imported to a file, one per line: what a real daemon or CLI command loaded.

    python -m tests.support.modules_at_exit OUT gateway --home H --port 0
"""

from __future__ import annotations

import atexit
import sys
from pathlib import Path


def _write(out: Path) -> None:
    out.write_text("\n".join(sorted({name.partition(".")[0] for name in list(sys.modules)})) + "\n")


def main() -> int:
    out, argv = Path(sys.argv[1]), sys.argv[2:]
    atexit.register(_write, out)
    from gateway.cli import main as neotask

    return neotask(argv)


if __name__ == "__main__":
    sys.exit(main())
