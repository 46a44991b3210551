"""The one way a connector hands a platform message on: the direct-chat gate, the post function
(which returns once the message is durable), and what is kept once it is stored. Every connector
calls :func:`hand_over`; what differs between platforms is only how the message was read and how
the platform is told (acknowledged, or left to deliver it again)."""

from __future__ import annotations

import logging

from channels.access import DirectAccess
from channels.protocol import AccountStatus, Inbound, PostFn
from channels.revisions import Revisions
from config.errors import NeotaskError

log = logging.getLogger(__name__)


async def hand_over(
    message: Inbound, post: PostFn, *, access: DirectAccess, revisions: Revisions, status: AccountStatus, what: str
) -> bool:
    """Admit, store and record ``message``; True once it needs no further delivery (stored, kept
    out by the gate, or refused for good), False when the platform should deliver it again (not
    stored now: shutting down, storage unavailable or full, busy). ``what`` names it in the log
    ("telegram account main: update 41")."""
    if message.chat_type == "direct" and not await access.admitted(message):
        return True
    try:
        await post(message)
    except NeotaskError as exc:
        status.last_error = exc.message
        if exc.transient:
            log.warning("%s not stored: %s", what, exc.message)
            return False
        log.warning("%s refused: %s", what, exc.message)  # a paused session, a bad id: dropped, said so
        return True
    await revisions.stored(message)
    status.messages_in += 1
    return True
