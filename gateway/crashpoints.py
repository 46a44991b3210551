"""A test-only crash hook: ``_NEOTASK_CRASH_AT=<step>[@<n>]`` in the daemon's environment (read
once at start) makes the process SIGKILL itself the ``n``-th time (default: the first) it reaches
that step, so crash tests kill a real daemon exactly there. Steps: those of archiving
(``sessions.protocol.ARCHIVE_STEPS``) and those of an OpenAI-compatible chat completion (``OPENAI_STEPS``).
Unset, it does nothing; it is not a configuration key and not for production use."""

from __future__ import annotations

import logging
import os
import signal
from collections.abc import Mapping

from sessions.protocol import ARCHIVE_STEPS as STEPS
from sessions.protocol import ArchiveStep as Step

log = logging.getLogger(__name__)
CRASH_ENV = "_NEOTASK_CRASH_AT"
# a chat completion: a new message durable (before the next one or the turn), its answer durable
# (before the conversation record), the record committed (before the HTTP answer)
OPENAI_STEPS = ("openai:message-stored", "openai:answer-stored", "openai:record-saved")


def crash_step(env: Mapping[str, str]) -> Step | None:
    """The hook for the archiving steps."""
    return _hook(env, STEPS)


def openai_crash_step(env: Mapping[str, str]) -> Step | None:
    """The hook for the OpenAI-compatible routes' steps."""
    return _hook(env, OPENAI_STEPS)


def _hook(env: Mapping[str, str], steps: tuple[str, ...]) -> Step | None:
    wanted = env.get(CRASH_ENV)
    if not wanted:
        return None
    name, _, nth = wanted.partition("@")
    if name not in (*STEPS, *OPENAI_STEPS) or not (nth or "1").isdigit() or int(nth or "1") < 1:
        if steps is STEPS:  # said once, not by every family
            log.warning("%s=%s is not a step[@n] (%s): ignored", CRASH_ENV, wanted, ", ".join((*STEPS, *OPENAI_STEPS)))
        return None
    if name not in steps:
        return None
    log.warning("test hook: this process kills itself at step %r (time %s)", name, nth or "1")
    left = [int(nth or "1")]

    def step(reached: str) -> None:
        if reached == name:
            left[0] -= 1
            if left[0] == 0:
                os.kill(os.getpid(), signal.SIGKILL)

    return step
