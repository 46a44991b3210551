"""First-run mistakes with ``storage.backend: postgres``, against a real server that checks
passwords (scram-sha-256 for one role): a wrong password, a missing role, a missing database, an
address nobody listens on and a server that refuses TLS. Each stopped every CLI command and the
gateway with a 70-line asyncpg traceback (or a 503 text saying "nothing was not stored"), and
``config check`` passed them all while warning about the documented ``NEOTASK_PG_PASSWORD``. Now:
exit 78 and one line naming the setting to fix; ``config check --connect`` tries the login."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import asyncpg
import pytest

from tests.gateway.daemons import child_env
from tests.gateway.helpers import Cli
from tests.support.postgres import PgServer, free_port

pytestmark = pytest.mark.realtime  # two tests start a daemon process

ROLE, DATABASE, PASSWORD = "neo_pw", "neo_pw_db", "right-one"
CASES = {  # name: (user, database, password, port (None: the server's), DSN options, what the line names)
    "wrong password": (ROLE, DATABASE, "wrong", None, "", "NEOTASK_PG_PASSWORD (storage.postgres.password_env)"),
    "missing role": ("nobody", DATABASE, PASSWORD, None, "", "fix the user in storage.postgres.dsn"),
    "missing database": (ROLE, "nowhere", PASSWORD, None, "", "createdb -O neo_pw nowhere"),
    "unreachable": (ROLE, DATABASE, PASSWORD, 0, "", "fix the host and port in storage.postgres.dsn"),
    "TLS refused": (ROLE, DATABASE, PASSWORD, None, "?sslmode=require", "sslmode=prefer"),
}


@pytest.fixture(scope="module")
def password_role(postgres_server: PgServer) -> PgServer:
    """A role that must give its password (scram-sha-256 over TCP), and its database."""

    async def create() -> None:
        admin = await asyncpg.connect(postgres_server.dsn())
        try:
            if not await admin.fetchval("SELECT 1 FROM pg_roles WHERE rolname = $1", ROLE):
                await admin.execute(f"CREATE ROLE {ROLE} LOGIN PASSWORD '{PASSWORD}'")
                await admin.execute(f"CREATE DATABASE {DATABASE} OWNER {ROLE}")
            hba = postgres_server.data / "pg_hba.conf"
            line = f"host all {ROLE} 127.0.0.1/32 scram-sha-256\n"
            if line not in hba.read_text():
                hba.write_text(line + hba.read_text())  # first match wins: before the suite's trust lines
            await admin.execute("SELECT pg_reload_conf()")
        finally:
            await admin.close()

    asyncio.run(create())
    return postgres_server


def _home(tmp_path: Path, server: PgServer, case: str) -> Path:
    user, database, _, port, options, _ = CASES[case]
    port = server.port if port is None else free_port()
    (tmp_path / "config.yaml").write_text(
        f"storage: {{backend: postgres, postgres: {{dsn: 'postgresql://{user}@127.0.0.1:{port}/{database}{options}'}}}}\n"
    )
    return tmp_path


@pytest.mark.parametrize("case", list(CASES))
async def test_a_first_run_mistake_is_one_line_naming_the_setting(
    case: str, password_role: PgServer, tmp_path: Path, capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    monkeypatch.setenv("NEOTASK_PG_PASSWORD", CASES[case][2])
    cli = Cli(capsys, _home(tmp_path, password_role, case))
    names = CASES[case][5]
    for command in (["sessions", "list"], ["history", "search", "anything"], ["config", "check", "--connect"]):
        code, out, err = await cli(*command)
        lines = err.strip().splitlines()
        assert code == 78 and len(lines) == 1, (command, code, err)
        assert lines[0].startswith("error: postgresql://") and names in lines[0], lines[0]
        assert "Traceback" not in err and "was not stored" not in err
    code, out, err = await cli("config", "check")  # without --connect: the file is fine
    assert code == 0 and "ignoring NEOTASK_PG_PASSWORD" not in out + err, out + err


async def test_the_right_login_connects_and_the_password_variable_is_known(
    password_role: PgServer, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("NEOTASK_PG_PASSWORD", PASSWORD)
    cli = Cli(capsys, _home(tmp_path, password_role, "wrong password"))
    code, out, err = await cli("config", "check", "--connect")
    assert code == 0 and f"connected to postgres postgresql://{ROLE}@127.0.0.1:{password_role.port}" in out, err
    assert "ignoring" not in out + err
    code, out, err = await cli("sessions", "list")
    assert code == 0 and out.strip() == "no sessions" and err == "", err


@pytest.mark.parametrize("workers", [[], ["--workers", "2"]])
async def test_the_gateway_refused_by_the_database_exits_78_with_one_line(
    workers: list[str], password_role: PgServer, tmp_path: Path
) -> None:
    home = _home(tmp_path, password_role, "wrong password")
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "gateway.cli", "gateway", "--home", str(home), "--port", str(free_port()), *workers,
        env=child_env(NEOTASK_PG_PASSWORD="wrong"), stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        cwd=Path(__file__).resolve().parents[2],
    )  # fmt: skip
    out, err = await asyncio.wait_for(proc.communicate(), 120)
    text = (out + err).decode()
    assert proc.returncode == 78, text
    assert "Traceback" not in text and "InvalidPasswordError" not in text, text
    refused = [line for line in text.splitlines() if "refused the password" in line]
    assert 1 <= len(refused) <= (2 if workers else 1) and "NEOTASK_PG_PASSWORD" in refused[0], text  # one per worker
