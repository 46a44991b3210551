"""What a failed database call means for the client: a server that is gone, restarting or refusing
connections is 503 ``storage_unavailable`` (nothing stored, retry after a second); a full disk on
the server is 507 ``insufficient_storage``. Anything else is a bug and propagates."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator

import asyncpg

from config.errors import InsufficientStorage, NeotaskError, StorageUnavailable

RETRY_AFTER_S = 1

# Connection-level failures: the statement may not have run; it surely did not commit for us.
LOST: tuple[type[BaseException], ...] = (
    OSError,  # refused, reset, unreachable (ConnectionError is one)
    asyncio.TimeoutError,
    asyncpg.InterfaceError,  # the connection was closed under the call
    asyncpg.PostgresConnectionError,  # class 08
    asyncpg.CannotConnectNowError,  # the server is starting or stopping
    asyncpg.AdminShutdownError,  # 57P01: terminated by an administrator / shutdown
    asyncpg.CrashShutdownError,
    asyncpg.TooManyConnectionsError,
    asyncpg.ReadOnlySQLTransactionError,  # a standby
    # "cannot switch to state 12; another operation (2) is in progress": a pooled connection the
    # server shut down under another call (seen with two daemons under load, the database stopped);
    # the statement was never sent
    asyncpg.InternalClientError,
)


def database_error(exc: BaseException, what: str = "the message") -> NeotaskError | None:
    """The typed error for ``exc``, or None when it is not a storage fault."""
    if isinstance(exc, asyncpg.DiskFullError):
        return InsufficientStorage(
            f"the database server's disk is full ({exc}): {what} was not stored; free some space and send it again",
            stored=False,
        )
    if isinstance(exc, LOST):
        reason = str(exc) or type(exc).__name__
        return StorageUnavailable(
            f"the database cannot be reached ({reason}): {what} was not stored; send it again shortly",
            stored=False,
            retry_after_s=RETRY_AFTER_S,
        )
    return None


@contextlib.contextmanager
def unavailable(what: str = "the message") -> Iterator[None]:
    """Turn a storage fault raised inside into its typed error."""
    try:
        yield
    except NeotaskError:
        raise
    except Exception as exc:
        typed = database_error(exc, what)
        if typed is None:
            raise
        raise typed from exc
