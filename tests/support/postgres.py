"""A real PostgreSQL server for the tests: Debian's binaries, ``initdb`` into a temporary folder, a
free port, a unix socket in that folder, stopped and removed at the end.

``initdb`` and ``pg_ctl`` refuse to run as root, so as root they run as the ``postgres`` user
(``runuser``) in a folder that user owns. The binaries are looked for in ``NEOTASK_PG_BIN``, then
``/usr/lib/postgresql/<newest>/bin``, then on the PATH; ``make test`` installs them when missing.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import asyncpg
import pytest

DEBIAN_ROOT = Path("/usr/lib/postgresql")
DATABASE = "neotask"  # the one database the tests use (emptied by each test that opens a store)
OWNER = "postgres"


def find_binaries() -> Path | None:
    """The folder holding initdb, pg_ctl and postgres, or None."""
    candidates: list[Path] = []
    if os.environ.get("NEOTASK_PG_BIN"):
        candidates.append(Path(os.environ["NEOTASK_PG_BIN"]))
    if DEBIAN_ROOT.is_dir():
        versions = sorted((p for p in DEBIAN_ROOT.iterdir() if p.name.isdigit()), key=lambda p: int(p.name))
        candidates += [p / "bin" for p in reversed(versions)]
    on_path = shutil.which("pg_ctl")
    if on_path:
        candidates.append(Path(on_path).resolve().parent)
    for folder in candidates:
        if all((folder / name).is_file() for name in ("initdb", "pg_ctl", "postgres")):
            return folder
    return None


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class PgServer:
    """One running cluster; ``dsn(name)`` for a database on it (``postgres`` exists from the start)."""

    bindir: Path
    root: Path  # the temporary folder: data/ and the socket
    port: int
    started_s: float = 0.0  # how long initdb + start took
    databases: set[str] = field(default_factory=set)  # created by ``database``
    durable: bool = False  # fsync on (benchmarks); off for the tests

    @property
    def data(self) -> Path:
        return self.root / "data"

    @property
    def socket_dir(self) -> Path:
        return self.root

    def dsn(self, database: str = "postgres") -> str:
        return f"postgresql://{OWNER}@127.0.0.1:{self.port}/{database}"

    async def database(self, name: str) -> str:
        """The DSN of database ``name``, created on first use."""
        if name not in self.databases:
            admin = await asyncpg.connect(self.dsn())
            try:
                if not await admin.fetchval("SELECT 1 FROM pg_database WHERE datname = $1", name):
                    await admin.execute(f'CREATE DATABASE "{name}"')
            finally:
                await admin.close()
            self.databases.add(name)
        return self.dsn(name)

    def _run(self, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        command = [str(self.bindir / args[0]), *args[1:]]
        if os.geteuid() == 0:
            command = ["runuser", "-u", OWNER, "--", *command]
        return subprocess.run(command, capture_output=True, text=True, timeout=timeout, check=True)

    def init(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        if os.geteuid() == 0:
            user = pwd.getpwnam(OWNER)
            os.chown(self.root, user.pw_uid, user.pw_gid)
        os.chmod(self.root, 0o700)
        self._run(
            "initdb", "-D", str(self.data), "-U", OWNER, "-A", "trust", "-E", "UTF8", "--locale=C.UTF-8",
            "--no-sync", "--no-instructions",
        )  # fmt: skip

    def start(self) -> None:
        # fsync off for the tests: they kill processes, never the machine (a commit still waits for
        # its WAL write); a benchmark starts a durable server (``durable``: the server's defaults).
        options = f"-p {self.port} -k {self.socket_dir} -c listen_addresses=127.0.0.1 -c max_connections=200"
        if not self.durable:
            options += " -c fsync=off -c full_page_writes=off -c shared_buffers=32MB"
        self._run("pg_ctl", "-D", str(self.data), "-o", options, "-l", str(self.root / "server.log"), "-w", "start")

    def running(self) -> bool:
        command = [str(self.bindir / "pg_ctl"), "-D", str(self.data), "status"]
        if os.geteuid() == 0:
            command = ["runuser", "-u", OWNER, "--", *command]
        return subprocess.run(command, capture_output=True, timeout=30).returncode == 0

    def pids(self) -> list[int]:
        """The server's processes: the postmaster and its children (backends, writers)."""
        try:
            main = int((self.data / "postmaster.pid").read_text().split()[0])
        except (OSError, ValueError, IndexError):
            return []
        children = []
        for entry in Path("/proc").iterdir():
            if entry.name.isdigit():
                with contextlib.suppress(OSError, IndexError, ValueError):
                    if int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1]) == main:
                        children.append(int(entry.name))
        return [main, *children]

    def stop(self, mode: str = "fast") -> None:
        self._run("pg_ctl", "-D", str(self.data), "-m", mode, "-w", "stop")

    def log_tail(self, lines: int = 20) -> str:
        with contextlib.suppress(OSError):
            return "\n".join((self.root / "server.log").read_text().splitlines()[-lines:])
        return ""


PREFIX = "neotask-pg-"
OWNER_FILE = "owner.pid"  # the process that started the cluster (a killed one leaves it running)


def reap_orphans(bindir: Path) -> None:
    """Stop and remove the clusters of test processes that died without stopping them (a pytest
    killed by a timeout): a postmaster outlives the process that started it."""
    for root in Path(tempfile.gettempdir()).glob(f"{PREFIX}*"):
        try:
            owner = int((root / OWNER_FILE).read_text())
        except (OSError, ValueError):
            continue
        if Path(f"/proc/{owner}").exists():
            continue
        orphan = PgServer(bindir, root, 0)
        with contextlib.suppress(subprocess.SubprocessError, OSError):
            if (orphan.data / "postmaster.pid").exists():
                orphan.stop("immediate")
        shutil.rmtree(root, ignore_errors=True)


def start_server(*, durable: bool = False) -> PgServer:
    bindir = find_binaries()
    if bindir is None:
        raise FileNotFoundError("PostgreSQL binaries")
    reap_orphans(bindir)
    root = Path(tempfile.mkdtemp(prefix=PREFIX))
    (root / OWNER_FILE).write_text(str(os.getpid()))
    server = PgServer(bindir, root, free_port(), durable=durable)
    began = time.perf_counter()
    try:
        server.init()
        server.start()
    except subprocess.CalledProcessError as exc:
        shutil.rmtree(root, ignore_errors=True)
        raise RuntimeError(f"PostgreSQL did not start: {exc.stderr or exc.stdout}\n{server.log_tail()}") from exc
    server.started_s = time.perf_counter() - began
    return server


def stop_server(server: PgServer) -> None:
    with contextlib.suppress(subprocess.SubprocessError, OSError):
        server.stop("immediate")
    shutil.rmtree(server.root, ignore_errors=True)


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[PgServer]:
    """A PostgreSQL server for the whole test session (one per xdist worker)."""
    if find_binaries() is None:
        pytest.skip("PostgreSQL binaries not found (apt-get install postgresql, or `make postgres`)")
    server = start_server()
    print(f"\n[postgres] initdb + start took {server.started_s:.2f} s (port {server.port})", file=sys.stderr)
    try:
        yield server
    finally:
        stop_server(server)


async def empty_database(dsn: str) -> None:
    """Remove every row of every table but the schema version (a test starts on an empty store;
    far cheaper than a new database and its migrations)."""
    conn = await asyncpg.connect(dsn)
    try:
        tables = [
            r[0]
            for r in await conn.fetch(
                "SELECT tablename FROM pg_tables WHERE schemaname = 'public' AND tablename <> 'neotask_schema'"
            )
        ]
        async with conn.transaction():  # DELETE, not TRUNCATE: ten times cheaper on tables this small
            for table in sorted(tables, key=lambda t: t == "runs"):  # runs last (the others refer to it)
                await conn.execute(f"DELETE FROM {table}")
    finally:
        await conn.close()
