"""The pairing table of ``<home>/channels.db``: one row per sender who wrote to an account with
``dm_policy: pairing`` (the functions here run on the store's connection, on its thread).

- A code is given on first contact and is good until ``expires_at`` (the account's
  ``pairing_code_lifetime_s`` later). While it is good, the sender is sent nothing more: one notice
  per sender per code. Once it has expired, the sender's next message gets a new code.
- ``approve`` lets the sender in (an expired code is refused with ``pairing_code_expired``);
  ``welcomed_at`` records that the sender was told, which the connector does at once when it runs,
  else at its next start. ``revoke`` deletes the row: the sender is a stranger again (a pending
  code is cancelled).
- Homes made before codes expired are brought up to date at open: their pending codes count as
  expired, and their approved senders as already told.
"""

from __future__ import annotations

import secrets
import sqlite3
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal

from config.clock import iso, parse_iso
from config.errors import BadRequest, PairingCodeExpired, PairingCodeNotFound

CODE_ALPHABET = "ABCDEFGHJKLMNPQRSTUVWXYZ23456789"  # no 0/O, 1/I
CODE_LENGTH = 8
State = Literal["pending", "approved", "expired"]
STATES: tuple[State, ...] = ("pending", "approved", "expired")

SCHEMA = """
CREATE TABLE IF NOT EXISTS pairing (
    code TEXT PRIMARY KEY,
    channel TEXT NOT NULL,
    account TEXT NOT NULL,
    sender_id TEXT NOT NULL,
    sender_name TEXT,
    created_at TEXT NOT NULL,
    approved_at TEXT,
    chat_id TEXT,
    expires_at TEXT,
    welcomed_at TEXT
);
CREATE UNIQUE INDEX IF NOT EXISTS pairing_sender ON pairing(channel, account, sender_id);
"""
_COLUMNS = "code, channel, account, sender_id, sender_name, created_at, expires_at, approved_at, chat_id, welcomed_at"
_ADDED = {  # columns newer than the table, and what an older row gets
    "chat_id": None,
    "expires_at": "UPDATE pairing SET expires_at = created_at",
    "welcomed_at": "UPDATE pairing SET welcomed_at = approved_at",
}


@dataclass(frozen=True)
class Pairing:
    code: str
    channel: str
    account: str
    sender_id: str
    sender_name: str | None
    created_at: str
    expires_at: str | None
    approved_at: str | None = None
    chat_id: str | None = None
    welcomed_at: str | None = None

    @property
    def approved(self) -> bool:
        return self.approved_at is not None

    def state(self, now: datetime) -> State:
        if self.approved:
            return "approved"
        return "expired" if self.expires_at is None or parse_iso(self.expires_at) <= now else "pending"

    def as_json(self, now: datetime) -> dict[str, Any]:
        """As the API and the CLI show it (the chat's id stays in ``channels.db``)."""
        return {"code": self.code, "channel": self.channel, "account": self.account, "sender_id": self.sender_id,
                "sender_name": self.sender_name, "state": self.state(now), "approved": self.approved,
                "created_at": self.created_at, "expires_at": self.expires_at,
                "approved_at": self.approved_at}  # fmt: skip


def normalized(code: str) -> str:
    """The code as given out (``" k7qx2m9d "`` is ``K7QX2M9D``); refused when it cannot be one."""
    text = code.strip().upper()
    if len(text) != CODE_LENGTH or any(c not in CODE_ALPHABET for c in text):
        raise BadRequest(
            f"{code[:40]!r} is not a pairing code: a code is {CODE_LENGTH} letters and digits as the bot sent it"
            f" (e.g. K7QX2M9D; no 0, O, 1 or I); `neotask channels pairings` lists them",
            field="code",
        )
    return text


def migrate(db: sqlite3.Connection) -> None:
    """Add the columns an older ``channels.db`` lacks (see the module)."""
    have = {str(row[1]) for row in db.execute("PRAGMA table_info(pairing)")}
    missing = [name for name in _ADDED if name not in have]
    if not missing:
        return
    db.execute("BEGIN IMMEDIATE")
    try:
        for name in missing:
            db.execute(f"ALTER TABLE pairing ADD COLUMN {name} TEXT")
            if _ADDED[name] is not None:
                db.execute(str(_ADDED[name]))
        db.execute("COMMIT")
    except BaseException:
        db.execute("ROLLBACK")
        raise


def _one(db: sqlite3.Connection, where: str, values: tuple[Any, ...]) -> Pairing | None:
    row = db.execute(f"SELECT {_COLUMNS} FROM pairing WHERE {where}", values).fetchone()
    return Pairing(*row) if row is not None else None


def give(
    db: sqlite3.Connection, channel: str, account: str, sender_id: str, sender_name: str | None, chat_id: str, *,
    now: datetime, expires_at: str,
) -> tuple[Pairing, bool]:  # fmt: skip
    """The sender's row, and whether its code is new (to be sent): a pending code still good is
    kept (and not sent again); a first contact, or one after the code expired, gets a new code."""
    found = _one(db, "channel = ? AND account = ? AND sender_id = ?", (channel, account, sender_id))
    if found is not None and found.state(now) != "expired":
        return found, False
    code = _fresh_code(db)
    created = iso(now)
    if found is None:
        db.execute(
            "INSERT INTO pairing (code, channel, account, sender_id, sender_name, created_at, expires_at, chat_id)"
            " VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
            (code, channel, account, sender_id, sender_name, created, expires_at, chat_id),
        )
    else:
        db.execute(
            "UPDATE pairing SET code = ?, sender_name = ?, created_at = ?, expires_at = ?, chat_id = ? WHERE code = ?",
            (code, sender_name, created, expires_at, chat_id, found.code),
        )
    given = _one(db, "code = ?", (code,))
    assert given is not None
    return given, True


def _fresh_code(db: sqlite3.Connection) -> str:
    while True:
        code = "".join(secrets.choice(CODE_ALPHABET) for _ in range(CODE_LENGTH))
        if db.execute("SELECT 1 FROM pairing WHERE code = ?", (code,)).fetchone() is None:
            return code


def _given(db: sqlite3.Connection, code: str) -> Pairing:
    found = _one(db, "code = ?", (normalized(code),))
    if found is None:
        raise PairingCodeNotFound(
            f"no pairing code {code.strip()!r} was given out, or it was revoked: `neotask channels pairings` lists"
            " the codes (a code is in the bot's answer to the unknown sender, and in the gateway log)"
        )
    return found


def approve(db: sqlite3.Connection, code: str, now: datetime) -> Pairing:
    found = _given(db, code)
    if found.state(now) == "expired":
        raise PairingCodeExpired(
            f"pairing code {found.code} ({found.channel} account {found.account}, sender {found.sender_id}) expired at"
            f" {found.expires_at}, before it was approved: when the sender writes again they get a new code;"
            " approve that one (`neotask channels pairings` lists the codes pending)"
        )
    db.execute("UPDATE pairing SET approved_at = COALESCE(approved_at, ?) WHERE code = ?", (iso(now), found.code))
    approved = _one(db, "code = ?", (found.code,))
    assert approved is not None
    return approved


def revoke(db: sqlite3.Connection, code: str) -> Pairing:
    found = _given(db, code)
    db.execute("DELETE FROM pairing WHERE code = ?", (found.code,))
    return found


def approved(db: sqlite3.Connection, channel: str, account: str) -> set[str]:
    rows = db.execute(
        "SELECT sender_id FROM pairing WHERE channel = ? AND account = ? AND approved_at IS NOT NULL",
        (channel, account),
    ).fetchall()
    return {str(r[0]) for r in rows}


def listed(db: sqlite3.Connection) -> list[Pairing]:
    return [Pairing(*row) for row in db.execute(f"SELECT {_COLUMNS} FROM pairing ORDER BY created_at, code")]


def unwelcomed(db: sqlite3.Connection, channel: str, account: str) -> list[Pairing]:
    """The approved senders of the account not yet told (whose chat is known)."""
    rows = db.execute(
        f"SELECT {_COLUMNS} FROM pairing WHERE channel = ? AND account = ? AND approved_at IS NOT NULL"
        " AND welcomed_at IS NULL AND chat_id IS NOT NULL ORDER BY approved_at",
        (channel, account),
    ).fetchall()
    return [Pairing(*row) for row in rows]


def welcomed(db: sqlite3.Connection, code: str, now: datetime) -> None:
    db.execute("UPDATE pairing SET welcomed_at = ? WHERE code = ?", (iso(now), code))
