"""The error hierarchy shared by every package.

Each error carries its HTTP status and a snake_case code; the gateway has one middleware that
turns any ``NeotaskError`` into the JSON error body. Domain code raises these and never imports
``aiohttp.web``.
"""

from __future__ import annotations

from typing import Any, ClassVar


class NeotaskError(Exception):
    status: ClassVar[int] = 500
    default_code: ClassVar[str] = "internal_error"

    def __init__(self, message: str, *, code: str | None = None, **extra: Any) -> None:
        super().__init__(message)
        self.message = message
        self.code = code or self.default_code
        self.extra: dict[str, Any] = extra


class BadRequest(NeotaskError):
    status = 400
    default_code = "invalid_field"


class InvalidKey(BadRequest):
    default_code = "invalid_key"


class ConfigError(NeotaskError):
    """A configuration file, variable or flag is wrong; the message names the key."""

    default_code = "invalid_config"


class NotFound(NeotaskError):
    status = 404
    default_code = "not_found"


class Conflict(NeotaskError):
    status = 409
    default_code = "conflict"


class SessionPaused(Conflict):
    default_code = "session_paused"


class PayloadTooLarge(NeotaskError):
    status = 413
    default_code = "payload_too_large"


class Busy(NeotaskError):
    status = 429
    default_code = "session_busy"


class ProviderFailure(NeotaskError):
    status = 502
    default_code = "provider_error"


class TurnFailed(NeotaskError):
    """A turn failed for another reason than the model call (a tool, compaction, the store) after
    the message was stored: the body carries ``stored: true`` and ``message_seq``; do not resend."""

    status = 500
    default_code = "turn_failed"


class Unavailable(NeotaskError):
    status = 503
    default_code = "unavailable"


class InsufficientStorage(NeotaskError):
    """The disk is full: nothing was stored, nothing half written, no seq consumed."""

    status = 507
    default_code = "insufficient_storage"


class StorageUnavailable(Unavailable):
    """The store cannot write (read-only or refused): nothing was stored."""

    default_code = "storage_unavailable"
