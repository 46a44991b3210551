"""A real Synapse homeserver for the Matrix tests: ``matrix-synapse`` from PyPI, in the venv of its
own that ``make synapse`` creates (``.synapse-venv``), on SQLite, on a free port, users
registered through the admin API with the shared secret.

Rate limits: the homeserver's message limit is low (``RATE``: a burst of ``BURST``) so one test
can see a real 429 ``M_LIMIT_EXCEEDED``; every user :meth:`Synapse.register` makes is exempt (the
admin API's ``override_ratelimit``) unless registered with ``limited=True``.

Everything here is synchronous (urllib, subprocess): the homeserver is started once per test
session, outside any event loop; the tests talk to it as users with :class:`User` (aiohttp).
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import secrets
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp

ROOT = Path(__file__).resolve().parents[2]
VENV = Path(os.environ.get("NEOTASK_SYNAPSE_VENV", ROOT / ".synapse-venv"))
PYTHON = VENV / "bin" / "python"
SERVER = "localhost"
RATE, BURST = 1.0, 2
SECRET = "neotask-test-shared-secret"


def available() -> str | None:
    """Why Synapse cannot run here, or None."""
    if not PYTHON.exists():
        return f"no Synapse venv at {VENV} (make synapse creates it)"
    return None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _config(folder: Path, port: int) -> dict[str, Any]:
    lots = {"per_second": 10_000, "burst_count": 10_000}
    return {
        "server_name": SERVER,
        "pid_file": str(folder / "homeserver.pid"),
        "listeners": [{"port": port, "bind_addresses": ["127.0.0.1"], "type": "http", "tls": False,
                       "x_forwarded": False, "resources": [{"names": ["client"], "compress": False}]}],
        "database": {"name": "sqlite3", "args": {"database": str(folder / "homeserver.db")}},
        "log_config": str(folder / "log.yaml"),
        "media_store_path": str(folder / "media"),
        "signing_key_path": str(folder / "signing.key"),
        "registration_shared_secret": SECRET,
        "macaroon_secret_key": secrets.token_hex(16),
        "form_secret": secrets.token_hex(16),
        "report_stats": False,
        "trusted_key_servers": [],
        "suppress_key_server_warning": True,
        "federation_domain_whitelist": [],
        "presence": {"enabled": False},
        "url_preview_enabled": False,
        "enable_metrics": False,
        "rc_message": {"per_second": RATE, "burst_count": BURST},
        "rc_registration": lots,
        "rc_login": {"address": lots, "account": lots, "failed_attempts": lots},
        "rc_joins": {"local": lots, "remote": lots},
        "rc_joins_per_room": lots,
        "rc_invites": {"per_room": lots, "per_user": lots, "per_issuer": lots},
        "rc_admin_redaction": lots,
        "rc_3pid_validation": lots,
    }  # fmt: skip


_LOG = """version: 1
formatters: {f: {format: '%(asctime)s %(name)s %(levelname)s %(message)s'}}
handlers: {file: {class: logging.FileHandler, filename: LOGFILE, formatter: f}}
root: {level: WARNING, handlers: [file]}
disable_existing_loggers: false
"""


def _call(url: str, method: str = "GET", body: Any = None, token: str | None = None) -> Any:
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(url, data=data, method=method)
    request.add_header("Content-Type", "application/json")
    if token:
        request.add_header("Authorization", f"Bearer {token}")
    with urllib.request.urlopen(request, timeout=30) as response:
        return json.loads(response.read() or b"{}")


class Synapse:
    """One running homeserver (:meth:`start` … :meth:`stop`)."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen[bytes] | None = None
        self.started_in_s = 0.0
        self._admin: str | None = None

    def start(self, timeout: float = 120.0) -> None:
        began = time.monotonic()
        self.folder.mkdir(parents=True, exist_ok=True)
        (self.folder / "log.yaml").write_text(_LOG.replace("LOGFILE", str(self.folder / "homeserver.log")))
        config = self.folder / "homeserver.yaml"
        config.write_text(json.dumps(_config(self.folder, self.port)))  # JSON is YAML
        subprocess.run(
            [str(PYTHON), "-m", "synapse.app.homeserver", "-c", str(config), "--generate-missing-configs"],
            check=True,
            capture_output=True,
            cwd=self.folder,
        )  # fmt: skip: the signing key
        with open(self.folder / "stdout.log", "wb") as out:  # the child has its own copy
            self.proc = subprocess.Popen([str(PYTHON), "-m", "synapse.app.homeserver", "-c", str(config)],
                                         stdout=out, stderr=subprocess.STDOUT, cwd=self.folder)  # fmt: skip
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"synapse exited {self.proc.returncode}: {(self.folder / 'stdout.log').read_text()}")
            try:
                _call(f"{self.url}/_matrix/client/versions")
                break
            except (urllib.error.URLError, OSError):
                if time.monotonic() - began > timeout:
                    raise
                time.sleep(0.1)
        self.started_in_s = time.monotonic() - began
        self._admin = self.register("admin", admin=True, limited=True).token

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def register(
        self, name: str, *, admin: bool = False, limited: bool = False, displayname: str | None = None
    ) -> User:
        """A new user (the admin API's shared-secret registration), exempt from rate limits unless ``limited``."""
        base = f"{self.url}/_synapse/admin/v1/register"
        nonce = _call(base)["nonce"]
        password = secrets.token_hex(8)
        mac = hmac.new(SECRET.encode(), digestmod=hashlib.sha1)
        mac.update(b"\x00".join([nonce.encode(), name.encode(), password.encode(), b"admin" if admin else b"notadmin"]))
        body = {"nonce": nonce, "username": name, "password": password, "admin": admin, "mac": mac.hexdigest()}
        if displayname:
            body["displayname"] = displayname
        made = _call(base, "POST", body)
        user = User(self.url, made["user_id"], made["access_token"])
        if not limited:
            assert self._admin is not None
            quoted = urllib.parse.quote(user.user_id)
            _call(f"{self.url}/_synapse/admin/v1/users/{quoted}/override_ratelimit", "POST",
                  {"messages_per_second": 0, "burst_count": 0}, token=self._admin)  # fmt: skip
        return user

    def user_token(self, user_id: str) -> str:
        """A second access token of ``user_id`` (the admin API's login as a user)."""
        quoted = urllib.parse.quote(user_id)
        made = _call(f"{self.url}/_synapse/admin/v1/users/{quoted}/login", "POST", {}, token=self._admin)
        return str(made["access_token"])


@dataclass
class User:
    """A Matrix user, as a client: rooms, messages, and what the bot said."""

    url: str
    user_id: str
    token: str

    async def call(self, method: str, path: str, body: Any = None) -> Any:
        headers = {"Authorization": f"Bearer {self.token}"}
        async with (
            aiohttp.ClientSession() as http,
            http.request(method, f"{self.url}/_matrix/client/v3{path}", json=body, headers=headers) as resp,
        ):
            data = await resp.json()
            if resp.status >= 400:
                raise AssertionError(f"{method} {path}: {resp.status} {data}")
            return data

    async def room(self, *invite: str, direct: bool = False, encrypted: bool = False) -> str:
        body: dict[str, Any] = {"invite": list(invite), "is_direct": direct,
                                "preset": "trusted_private_chat" if direct else "private_chat"}  # fmt: skip
        if encrypted:
            body["initial_state"] = [{"type": "m.room.encryption", "state_key": "",
                                      "content": {"algorithm": "m.megolm.v1.aes-sha2"}}]  # fmt: skip
        return str((await self.call("POST", "/createRoom", body))["room_id"])

    async def join(self, room: str) -> None:
        await self.call("POST", f"/join/{urllib.parse.quote(room)}", {})

    async def invite(self, room: str, user_id: str) -> None:
        await self.call("POST", f"/rooms/{urllib.parse.quote(room)}/invite", {"user_id": user_id})

    async def say(self, room: str, text: str, *, thread: str | None = None, mention: str | None = None) -> str:
        content: dict[str, Any] = {"msgtype": "m.text", "body": text}
        if thread:
            content["m.relates_to"] = {"rel_type": "m.thread", "event_id": thread}
        if mention:
            content["m.mentions"] = {"user_ids": [mention]}
        txn = secrets.token_hex(8)
        sent = await self.call("PUT", f"/rooms/{urllib.parse.quote(room)}/send/m.room.message/{txn}", content)
        return str(sent["event_id"])

    async def messages(self, room: str, sender: str | None = None) -> list[dict[str, Any]]:
        """The room's messages, oldest first (those of ``sender`` only, when given)."""
        query = urllib.parse.urlencode({"dir": "b", "limit": 500})
        found = await self.call("GET", f"/rooms/{urllib.parse.quote(room)}/messages?{query}")
        events = [e for e in reversed(found["chunk"]) if e.get("type") == "m.room.message"]
        return [e for e in events if sender is None or e["sender"] == sender]

    async def members(self, room: str) -> set[str]:
        found = await self.call("GET", f"/rooms/{urllib.parse.quote(room)}/joined_members")
        return set(found["joined"])


def main() -> None:
    """``python -m tests.support.synapse``: start one, print how long it took, stop it."""
    import tempfile

    with tempfile.TemporaryDirectory() as folder:
        server = Synapse(Path(folder))
        try:
            server.start()
            print(f"synapse started in {server.started_in_s:.1f} s at {server.url}")
        finally:
            server.stop()


if __name__ == "__main__":
    sys.exit(main())
