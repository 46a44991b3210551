"""A connector's run kept going.

A connector runs in one task (connect, then poll or listen). A run ends on purpose by returning:
the platform refused the token (the run has put that in the status) or the mode leaves nothing to
run (a webhook registered). Anything else that ends it (an exception of any kind) is logged with
its traceback, shown in the account's status (``connected: false``, ``last_error`` saying it
restarts, ``restarts`` counted) and the run starts again after a backoff: 1 s, doubled up to
``MAX_BACKOFF_S``, and back to 1 s after a run that lasted longer than that.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

from channels.protocol import AccountStatus

log = logging.getLogger(__name__)
MAX_BACKOFF_S = 30.0


async def supervise(run: Callable[[], Awaitable[None]], status: AccountStatus) -> None:
    """Run ``run`` until it returns; restart it, with a backoff, whenever it raises."""
    loop = asyncio.get_running_loop()
    backoff = 1.0
    while True:
        started = loop.time()
        try:
            await run()
            return
        except Exception as exc:  # whatever it was, the account must not stop quietly
            if loop.time() - started > MAX_BACKOFF_S:
                backoff = 1.0
            _stopped(status, exc, backoff)
        await asyncio.sleep(backoff)
        backoff = min(backoff * 2, MAX_BACKOFF_S)


def _stopped(status: AccountStatus, exc: Exception, backoff: float) -> None:
    status.restarts += 1
    status.connected = False
    status.last_error = f"the connector stopped ({type(exc).__name__}: {exc}); restarting in {backoff:.0f} s"
    log.error("%s account %s: %s", status.channel, status.account, status.last_error, exc_info=exc)
