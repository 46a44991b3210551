"""The exit status of every ``neotask`` command, one per kind of failure (README, "Exit status").

The daemon (``neotask gateway``) and the other commands share them: a bad configuration exits
``CONFIG`` whether the daemon refuses it at start or ``config check`` finds it.
"""

from __future__ import annotations

from sessions.damage import EXIT_STATE
from sessions.lock import EXIT_LOCKED

OK = 0
FAILED = 1  # the work failed: an API error, an unreachable gateway, a cron job that failed, a port taken
USAGE = 2  # the command line is wrong (argparse's own status)
NOT_RUNNING = 3  # ``gateway status``: no gateway runs on the home
CONFIG = 4  # the configuration is invalid: a key, a value's shape, a webhook template, a public address without tokens
LOCKED = EXIT_LOCKED  # 73: another daemon (or CLI command) holds the home
STATE = EXIT_STATE  # 78: the home's state must be fixed first (damaged, read-only or full)
INTERRUPTED = 130  # Ctrl-C
BROKEN_PIPE = 141  # the reader went away (``neotask ... --json | head``)
