"""The error hierarchy shared by every package: one class per error code.

Each class carries its HTTP ``status``, its snake_case ``code`` and ``doc`` (what the code means,
for ``/openapi.json`` and docs/errors.md); a code is written here once and nowhere else. The gateway
has one middleware that turns any ``NeotaskError`` into the JSON error body (the OpenAI shape on
the OpenAI-compatible routes). Domain code raises these and never imports ``aiohttp.web``.
A family class (``BadRequest``, ``NotFound``, ``Conflict``, ``Unavailable``) is itself the class
of its generic code, and ``except NotFound`` still catches every more precise not-found.
"""

from __future__ import annotations

from typing import Any, ClassVar


class NeotaskError(Exception):
    status: ClassVar[int] = 500
    code: ClassVar[str] = "internal_error"
    doc: ClassVar[str] = "the gateway failed on this request; see its log"
    http: ClassVar[bool] = True  # False: raised at start-up or by the CLI, never an HTTP answer
    # True: "not now" (nothing stored; the same message sent again later can be), so a chat
    # connector leaves it for the platform's redelivery instead of dropping it
    transient: ClassVar[bool] = False
    # True: the refusal means nothing was stored, and the body says so (``stored: false``) unless
    # the raise says otherwise
    unstored: ClassVar[bool] = False

    def __init__(self, message: str, **extra: Any) -> None:
        if "code" in extra:
            raise TypeError(f"no code= for {extra['code']!r}: raise the class of that code (config/errors.py)")
        super().__init__(message)
        self.message = message
        self.extra: dict[str, Any] = {"stored": False, **extra} if self.unstored else extra

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "code" not in cls.__dict__:  # a refinement for the code's own use (e.g. ProviderError): same code
            return
        other = _BY_CODE.get(cls.code)
        if other is not None and other.__qualname__ != cls.__qualname__:  # a module reloaded is the same class
            raise TypeError(f"error code {cls.code!r} is defined twice: {other.__name__} and {cls.__name__}")
        _BY_CODE[cls.code] = cls


_BY_CODE: dict[str, type[NeotaskError]] = {NeotaskError.code: NeotaskError}


def error_classes(*, http_only: bool = True) -> dict[str, type[NeotaskError]]:
    """Every error class by its code (those an HTTP answer can carry, unless ``http_only`` is
    false). The classes of this module are all here; others register when their module loads."""
    return {code: cls for code, cls in sorted(_BY_CODE.items()) if cls.http or not http_only}


# -- 400 ------------------------------------------------------------------------------------------


class BadRequest(NeotaskError):
    status = 400
    code = "invalid_field"
    doc = "a missing, unknown or wrong field or query parameter; `error.field` names it"


class InvalidBody(BadRequest):
    code = "invalid_body"
    doc = "invalid JSON, invalid UTF-8, a wrong content type, or not a JSON object"


class InvalidKey(BadRequest):
    code = "invalid_key"
    doc = "the session key breaks a rule of SPEC section 1; `error.rule` names it"


# -- 401, 403 -------------------------------------------------------------------------------------


class Unauthorized(NeotaskError):
    status = 401
    code = "unauthorized"
    doc = "missing or wrong bearer token (only when `gateway.tokens` is set)"


class InvalidSignature(Unauthorized):
    code = "invalid_signature"
    doc = (
        "a missing, wrong or stale webhook signature (`X-Hub-Signature-256`, or Standard"
        " Webhooks `webhook-signature` with `webhook-timestamp` outside the hook's tolerance_s)"
    )


class HostNotAllowed(NeotaskError):
    status = 403
    code = "host_not_allowed"
    doc = "the `Host` header is not a loopback name nor in `gateway.allowed_hosts` (no tokens)"


# -- 404, 405, 408, 410 ---------------------------------------------------------------------------


class NotFound(NeotaskError):
    status = 404
    code = "not_found"
    doc = "no such route"


class HookNotFound(NotFound):
    code = "hook_not_found"
    doc = "no webhook with this name under `hooks:`"


class PairingCodeNotFound(NotFound):
    code = "pairing_code_not_found"
    doc = "no such pairing code was given out, or it was revoked (`neotask channels pairings` lists them)"


class SessionNotFound(NotFound):
    code = "session_not_found"
    doc = "no session with this key"


class RunNotFound(NotFound):
    code = "run_not_found"
    doc = "no run with this uuid (or its folder is gone)"


class FinalSummaryNotFound(NotFound):
    code = "final_summary_not_found"
    doc = "the run has no final summary (yet)"


class UnknownAgent(NotFound):
    code = "unknown_agent"
    doc = "the agent is not configured"


class MemoryFileNotFound(NotFound):
    code = "memory_file_not_found"
    doc = "no such memory file"


class JobNotFound(NotFound):
    code = "job_not_found"
    doc = "no such scheduler job"


class ModelNotFound(NotFound):
    code = "model_not_found"
    doc = "OpenAI-compatible routes: `model` names no agent (GET /v1/models lists them)"


class ResponseNotFound(NotFound):
    code = "response_not_found"
    doc = "`previous_response_id` names no stored response (or one made with `store: false`)"


class MethodNotAllowed(NeotaskError):
    status = 405
    code = "method_not_allowed"
    doc = "the path exists but not with this method; `Allow` lists the methods it takes"


class RequestTimeout(NeotaskError):
    status = 408
    code = "request_timeout"
    doc = "the request body did not arrive within `gateway.body_timeout_s`"


class PairingCodeExpired(NeotaskError):
    status = 410
    code = "pairing_code_expired"
    doc = (
        "the pairing code outlived `pairing_code_lifetime_s` before it was approved: the sender gets a new code"
        " when they write again; approve that one"
    )


# -- 409 ------------------------------------------------------------------------------------------


class Conflict(NeotaskError):
    status = 409
    code = "conflict"
    doc = "the request conflicts with the session's state"


class RunActive(Conflict):
    code = "run_active"
    doc = "the session already has an active run"


class SessionPaused(Conflict):
    code = "session_paused"
    doc = "the session is paused; resume it first"


class NoActiveRun(Conflict):
    code = "no_active_run"
    doc = "the session has no active run"


class RunClosing(Conflict):
    code = "run_closing"
    doc = "the run is completing; retry on the next run"


class RunNotActive(Conflict):
    code = "run_not_active"
    doc = "tool calls and plans are recorded on active runs only"


class JobRunning(Conflict):
    code = "job_running"
    doc = "the job is already running"


class ResponseNotLatest(Conflict):
    code = "response_not_latest"
    doc = "`previous_response_id` is not the latest response of its session (no forks)"


# -- 413, 429 -------------------------------------------------------------------------------------


class PayloadTooLarge(NeotaskError):
    status = 413
    code = "payload_too_large"
    doc = "the body is larger than `gateway.max_body_bytes` (drained before the answer)"


class Busy(NeotaskError):
    status = 429
    unstored = True
    transient = True
    code = "session_busy"
    doc = (
        "more than `agents.<id>.max_queued_turns` calls would wait for a model turn on this key; the `Retry-After`"
        " header and `error.retry_after_s` say when to retry; nothing is stored"
    )


class TokenBudgetExhausted(NeotaskError):
    status = 429
    unstored = True
    code = "token_budget_exhausted"
    doc = (
        "the agent's daily token budget (`agents.<id>.limits.tokens_per_day`) or this key's"
        " (`tokens_per_key_per_day`) is spent for the UTC day: nothing is stored; `Retry-After` and"
        " `error.retry_after_s` say when the next day begins"
    )


class TooManyBodyReads(NeotaskError):
    status = 429
    unstored = True
    code = "too_many_body_reads"
    doc = (
        "this address already has `gateway.max_body_reads_per_peer` requests whose bodies are still arriving;"
        " send each body with its head, or retry (`Retry-After`) once they finish; nothing is read or stored"
    )


# -- 5xx ------------------------------------------------------------------------------------------


class TurnFailed(NeotaskError):
    """A turn failed for another reason than the model call (a tool, compaction, the store) after
    the message was stored: the body carries ``stored: true`` and ``message_seq``; do not resend."""

    status = 500
    code = "turn_failed"
    doc = (
        "the turn failed after the message was stored (a tool, compaction, the store): `error.stored` is true and"
        " `error.message_seq` its seq; do not send it again (a retry with the same `client_message_id` stores"
        " nothing new)"
    )


class ProviderFailure(NeotaskError):
    status = 502
    code = "provider_error"
    doc = "the model call failed; the message is stored (`error.message_seq`, `error.stored`)"


class Unavailable(NeotaskError):
    status = 503
    transient = True
    code = "unavailable"
    doc = "a resource the route needs is not ready"


class StorageUnavailable(Unavailable):
    """The store cannot write (read-only or refused): nothing was stored."""

    unstored = True
    code = "storage_unavailable"
    doc = "the store cannot write (read-only or refused): nothing was stored; send again later"


class DatabaseRefused(NeotaskError):
    """The database of ``storage.postgres`` refused the connection at open (a password, a role, a
    database, the address, TLS): a setting or the server must be fixed first (exit 78)."""

    status = 503
    code = "database_refused"
    doc = "the database of `storage.postgres` refused the connection at start; the message names the setting to fix"
    http = False


class ChannelNotReady(Unavailable):
    code = "channel_not_ready"
    doc = "the chat connector is not connected yet, or could not store the update now; the platform retries"


class HookSecretMissing(Unavailable):
    code = "hook_secret_missing"
    doc = "the hook's `secret_env` is not set, so no signature can be checked"


class MemoryNotReady(Unavailable):
    code = "memory_not_ready"
    doc = "the memory index or embedding model is not ready yet"


class EmbeddingError(Unavailable):
    code = "embedding_error"
    doc = "the embeddings endpoint failed"


class ShuttingDown(Unavailable):
    code = "shutting_down"
    doc = (
        "the gateway is shutting down: a new message is refused unstored; a waiting or running turn is stopped and"
        " its caller told `error.stored: true` with `error.message_seq`"
    )


class HistoryDisabled(Unavailable):
    code = "history_disabled"
    doc = "the history index is off (`history.enabled: false`)"


class InsufficientStorage(NeotaskError):
    """The disk is full: nothing was stored, nothing half written, no seq consumed."""

    status = 507
    transient = True
    unstored = True
    code = "insufficient_storage"
    doc = (
        "the disk is full, or its free space is below `storage.min_free`: nothing was stored, nothing half"
        " written, no seq consumed; send again once space frees"
    )


# -- not HTTP -------------------------------------------------------------------------------------


class ConfigError(NeotaskError):
    """A configuration file, variable or flag is wrong; the message names the key."""

    code = "invalid_config"
    doc = "a configuration file, variable or flag is wrong (start-up and CLI only)"
    http = False
