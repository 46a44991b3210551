"""A test-only crash hook: ``_NEOTASK_CRASH_AT=<step>`` in the daemon's environment (read once at
start) makes the process SIGKILL itself when it reaches that step of archiving
(``sessions.archive.STEPS``), so crash tests kill a real daemon exactly there. Unset, it does
nothing; it is not a configuration key and not for production use."""

from __future__ import annotations

import logging
import os
import signal
from collections.abc import Mapping

from sessions.archive import STEPS, Step

log = logging.getLogger(__name__)
CRASH_ENV = "_NEOTASK_CRASH_AT"


def crash_step(env: Mapping[str, str]) -> Step | None:
    wanted = env.get(CRASH_ENV)
    if not wanted:
        return None
    if wanted not in STEPS:
        log.warning("%s=%s is not a step (%s): ignored", CRASH_ENV, wanted, ", ".join(STEPS))
        return None
    log.warning("test hook: this process kills itself at archive step %r", wanted)

    def step(name: str) -> None:
        if name == wanted:
            os.kill(os.getpid(), signal.SIGKILL)

    return step
