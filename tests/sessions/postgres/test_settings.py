"""``storage.backend: postgres`` and ``storage.postgres``: checked when the configuration loads,
the password taken from the environment, never from the file."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from config.errors import ConfigError
from config.loader import describe_error, load_config
from config.settings import PostgresSettings, Settings, StorageSettings
from gateway.validation import check_config
from sessions.postgres.store import connection_options, open_from_settings, redact
from tests.conftest import FakeClock
from tests.support.postgres import DATABASE, PgServer


def test_the_files_backend_is_the_default_and_postgres_needs_a_dsn() -> None:
    assert Settings().storage.backend == "files" and Settings().storage.postgres.dsn is None
    with pytest.raises(ValidationError, match=r"storage\.postgres\.dsn is not set"):
        StorageSettings(backend="postgres")
    storage = StorageSettings(backend="postgres", postgres=PostgresSettings(dsn="postgresql://neo@db:5432/neo"))
    assert storage.postgres.password_env == "NEOTASK_PG_PASSWORD" and storage.postgres.pool_size == 10


@pytest.mark.parametrize(
    ("dsn", "says"),
    [
        ("postgresql://neo:secret@db/neo", "holds a password"),
        ("mysql://neo@db/neo", "not a PostgreSQL DSN"),
    ],
)
def test_a_bad_dsn_is_refused_with_how_to_fix_it(dsn: str, says: str) -> None:
    with pytest.raises(ValidationError, match=says) as info:
        Settings.model_validate({"storage": {"postgres": {"dsn": dsn}}})
    described = describe_error(info.value)  # what the operator reads
    assert described.startswith("invalid configuration: storage.postgres.dsn:") and says in described
    assert "secret" not in described  # the password is never echoed


def test_the_password_comes_from_the_environment_variable() -> None:
    settings = PostgresSettings(dsn="postgresql://neo@db/neo", password_env="PG_PASS")
    assert connection_options(settings, {"PG_PASS": "s3cret"}) == ("postgresql://neo@db/neo", "s3cret")
    assert connection_options(settings, {}) == ("postgresql://neo@db/neo", None)
    with pytest.raises(ConfigError, match="dsn is not set"):
        connection_options(PostgresSettings(), {})
    assert redact("postgresql://neo:s3cret@db:5432/neo") == "postgresql://neo@db:5432/neo"


async def test_a_store_opens_from_the_settings(postgres_server: PgServer, tmp_path: Path, clock: FakeClock) -> None:
    dsn = await postgres_server.database(DATABASE)
    storage = {"backend": "postgres", "postgres": {"dsn": dsn, "pool_size": 2}}
    settings = Settings.model_validate({"storage": storage})
    store = await open_from_settings(settings, {"NEOTASK_PG_PASSWORD": "unused-by-trust"}, clock=clock)
    try:
        assert await store.writable() is None and store.pool.get_max_size() == 2
    finally:
        await store.close()


def test_the_gateway_refuses_the_postgres_backend_until_it_is_wired(tmp_path: Path) -> None:
    """Not silently the files backend: the daemon and the CLI stop at the configuration check."""
    overrides = {"storage": {"backend": "postgres", "postgres": {"dsn": "postgresql://neo@127.0.0.1/neo"}}}
    config = load_config(env={}, home=tmp_path, overrides=overrides)
    with pytest.raises(ConfigError, match=r"storage\.backend: postgres is not served by this gateway yet"):
        check_config(config, {})
    check_config(load_config(env={}, home=tmp_path), {})  # files: fine
