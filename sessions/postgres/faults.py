"""What a failed database call means for the client: a server that is gone, restarting or refusing
connections is 503 ``storage_unavailable`` (nothing stored, retry after a second); a full disk on
the server is 507 ``insufficient_storage``. Anything else is a bug and propagates."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Iterator

import asyncpg

from config.errors import ConfigError, DatabaseRefused, InsufficientStorage, NeotaskError, StorageUnavailable

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


class OneLine(logging.Filter):
    """asyncpg's pool logs each failed attempt to reconnect (the database away) with its traceback
    at WARNING: a line a minute per process while the server is down. The exception goes on the
    line instead (``...; retrying (ConnectionRefusedError: ...)``)."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        if exc is not None:
            record.msg, record.args = f"{record.getMessage()} ({type(exc).__name__}: {exc})", None
            record.exc_info, record.exc_text = None, None
        return True


ONE_LINE = OneLine()


def quiet_pool_log() -> None:
    """Put :class:`OneLine` on asyncpg's pool logger (once per process)."""
    logger = logging.getLogger("asyncpg.pool")
    if ONE_LINE not in logger.filters:
        logger.addFilter(ONE_LINE)


def database_error(exc: BaseException, outcome: str = "the message was not stored") -> NeotaskError | None:
    """The typed error for ``exc``, or None when it is not a storage fault; ``outcome`` says in
    plain words what did not happen ("the message was not stored", "nothing was read")."""
    if isinstance(exc, asyncpg.DiskFullError):
        return InsufficientStorage(
            f"the database server's disk is full ({exc}): {outcome}; free some space and try again",
            stored=False,
        )
    if isinstance(exc, LOST):
        reason = str(exc) or type(exc).__name__
        return StorageUnavailable(
            f"the database cannot be reached ({reason}): {outcome}; try again shortly",
            stored=False,
            retry_after_s=RETRY_AFTER_S,
        )
    return None


def refused_at_open(exc: BaseException, where: str, password_env: str) -> NeotaskError | None:
    """What a first connection's failure asks the operator to fix, in one line naming the setting
    (``where``: the DSN without its password), or None when it is not a connection failure."""
    user, _, rest = where.partition("://")[2].rpartition("@")
    database = rest.partition("/")[2].partition("?")[0] or user
    if isinstance(exc, asyncpg.InvalidPasswordError):
        return DatabaseRefused(
            f"{where}: the database refused the password of user {user!r}: put the right one in the environment"
            f" variable {password_env} (storage.postgres.password_env)"
        )
    if isinstance(exc, asyncpg.InvalidAuthorizationSpecificationError):
        return DatabaseRefused(
            f"{where}: the database refused the login ({exc}): fix the user in storage.postgres.dsn, or create the"
            f" role (CREATE ROLE {user} LOGIN PASSWORD '...') and let it in through pg_hba.conf"
        )
    if isinstance(exc, asyncpg.InvalidCatalogNameError):
        return DatabaseRefused(
            f"{where}: database {database!r} does not exist: create it (createdb -O {user} {database}) or fix the"
            " database name in storage.postgres.dsn"
        )
    if isinstance(exc, asyncpg.ClientConfigurationError):
        return ConfigError(f"storage.postgres.dsn is not a usable DSN ({exc}): fix it, e.g. postgresql://neotask@127.0.0.1:5432/neotask")
    if isinstance(exc, OSError) and "SSL" in str(exc):
        return DatabaseRefused(
            f"{where}: the server does not speak TLS ({exc}): turn ssl on in the server, or set sslmode=prefer"
            " (or disable) in storage.postgres.dsn"
        )
    if isinstance(exc, LOST):
        reason = str(exc) or type(exc).__name__
        return DatabaseRefused(
            f"{where}: the database cannot be reached ({reason}): start the server, or fix the host and port in"
            " storage.postgres.dsn"
        )
    return None


@contextlib.contextmanager
def unavailable(outcome: str = "the message was not stored") -> Iterator[None]:
    """Turn a storage fault raised inside into its typed error."""
    try:
        yield
    except NeotaskError:
        raise
    except Exception as exc:
        typed = database_error(exc, outcome)
        if typed is None:
            raise
        raise typed from exc
