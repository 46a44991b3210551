"""The exit status of every ``neotask`` command, one per kind of failure (docs/cli.md, "Exit status").

The daemon (``neotask gateway``) and the other commands share them: a bad configuration exits
``CONFIG`` whether the daemon refuses it at start or ``config check`` finds it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from home.damage import EXIT_STATE
from home.lock import EXIT_LOCKED

OK = 0
FAILED = 1  # the work failed: an API error, an unreachable gateway, a cron job that failed, a port taken
USAGE = 2  # the command line is wrong (argparse's own status)
NOT_RUNNING = 3  # ``gateway status``: no gateway runs on the home
CONFIG = 4  # the configuration is invalid: a key, a value's shape, a webhook template, a public address without tokens
LOCKED = EXIT_LOCKED  # 73: another daemon (or CLI command) holds the home
STATE = EXIT_STATE  # 78: the home's state must be fixed first (damaged, read-only or full)
INTERRUPTED = 130  # Ctrl-C
BROKEN_PIPE = 141  # the reader went away (``neotask ... --json | head``)

EXIT_RECORD = "exit.json"  # in <home>/logs/: how the last daemon ended (``gateway.daemon.record_exit``)


def read_exit(home: Path, pid: int) -> dict[str, Any] | None:
    """The exit record the daemon ``pid`` left (its status and why), or None."""
    try:
        record = json.loads((home / "logs" / EXIT_RECORD).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return record if isinstance(record, dict) and record.get("pid") == pid else None
