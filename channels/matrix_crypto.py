"""The end-to-end encryption of one Matrix account: matrix-nio's olm machine (vodozemac, from the
``matrix-nio[e2e]`` extra), on a crypto store of its own under the home
(``<home>/matrix/<account>/``, the folder 0700, its SQLite files 0600), so the bot's device keys
and the room keys it was given outlive a restart.

The connector reads ``/sync`` as JSON (channels/matrix.py); this hands nio the parts its olm machine
needs (to-device events, device-list changes, one-time key counts, and the state and membership of
the encrypted rooms) and decrypts the timeline's ``m.room.encrypted`` events itself, so a sync taken
again after a crash decrypts again. Between syncs it uploads keys, queries the devices of the
encrypted rooms' members, claims one-time keys and sends the to-device messages nio queued (what
``sync_forever`` does).

Trust: trust on first use. The bot sends a room's key to every device of the room's members,
verified or not (nio's ``ignore_unverified_devices``), and decrypts a message from any of them; a
device whose signing key changes after it was first seen is not believed (nio keeps the first key).
docs/channels-matrix.md says what that risks.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from nio import AsyncClient, EncryptionError, Event, MegolmEvent, SyncResponse
from nio.rooms import MatrixRoom

log = logging.getLogger(__name__)
PICKLE_KEY = "neotask"  # the store is guarded by its permissions (0600 in a 0700 folder), not this key
ENCRYPTION_EVENT = "m.room.encryption"
_STATE_FOR_NIO = frozenset({ENCRYPTION_EVENT, "m.room.member"})


def available() -> str | None:
    """Why end-to-end encryption cannot run here, or None."""
    from nio.crypto import ENCRYPTION_ENABLED

    if not ENCRYPTION_ENABLED:
        return "the matrix-nio[e2e] extra (vodozemac, peewee) is not installed"
    return None


@dataclass(frozen=True)
class Undecryptable:
    """An encrypted event the bot has no key for (or that does not decrypt)."""

    room_id: str
    event_id: str
    sender: str
    session_id: str
    reason: str


def _private(path: Path, mode: int) -> None:
    if path.exists() and path.stat().st_mode & 0o777 != mode:
        os.chmod(path, mode)


class Crypto:
    """The olm machine of one account on nio's ``client``."""

    def __init__(self, client: AsyncClient, folder: Path, account: str) -> None:
        self.client = client
        self.folder = folder
        self.account = account

    def open(self) -> None:
        """Load (or create) the store of the client's device; the device id must be known (whoami)."""
        from nio.store import SqliteStore

        self.folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        _private(self.folder, 0o700)
        client = self.client
        client.config = replace(client.config, encryption_enabled=True, store=SqliteStore, pickle_key=PICKLE_KEY)
        client.store_path = str(self.folder)
        client.load_store()
        self.protect()
        log.info("matrix account %s: end-to-end encryption on, device %s, keys in %s", self.account,
                 client.device_id, self.folder)  # fmt: skip

    def protect(self) -> None:
        for path in self.folder.iterdir():
            _private(path, 0o600)

    @property
    def identity(self) -> dict[str, str]:
        assert self.client.olm is not None
        return dict(self.client.olm.account.identity_keys)

    def encrypted(self, room_id: str) -> bool:
        return room_id in self.client.encrypted_rooms

    async def take_sync(self, response: dict[str, Any]) -> None:
        """The sync's to-device events (room keys), device lists, key counts, and the state and
        membership of its encrypted rooms, into the olm machine; the timeline's encrypted events
        are left for :meth:`decrypt`."""
        join: dict[str, Any] = {}
        for room_id, joined in ((response.get("rooms") or {}).get("join") or {}).items():
            state = [e for e in (joined.get("state") or {}).get("events") or [] if e.get("type") in _STATE_FOR_NIO]
            timeline = [e for e in (joined.get("timeline") or {}).get("events") or []
                        if e.get("type") in _STATE_FOR_NIO and "state_key" in e]  # fmt: skip
            if self.encrypted(room_id) or any(e.get("type") == ENCRYPTION_EVENT for e in state + timeline):
                join[room_id] = {"state": {"events": state}, "timeline": {"events": timeline}}
        part = {
            "next_batch": response.get("next_batch") or "",
            "to_device": response.get("to_device") or {"events": []},
            "device_lists": response.get("device_lists") or {},
            "device_one_time_keys_count": response.get("device_one_time_keys_count") or {},
            "rooms": {"join": join, "invite": {}, "leave": {}},
        }
        parsed = SyncResponse.from_dict(part)
        if isinstance(parsed, SyncResponse):
            await self.client.receive_response(parsed)
        else:
            log.warning("matrix account %s: the sync's keys could not be read: %s", self.account, parsed)
        self.protect()

    async def keep_up(self) -> None:
        """Upload keys, query devices, claim one-time keys, send queued to-device messages, as needed."""
        client = self.client
        if client.should_upload_keys:
            uploaded = await client.keys_upload()
            if not hasattr(uploaded, "signed_curve25519_count"):
                log.warning("matrix account %s: keys not uploaded: %s", self.account, uploaded)
        if client.should_query_keys:
            await client.keys_query()
        if client.should_claim_keys:
            await client.keys_claim(client.get_users_for_key_claiming())
        if client.outgoing_to_device_messages:
            await client.send_to_device_messages()

    def has_key(self, room_id: str, event: dict[str, Any]) -> bool:
        """Whether the room key of an encrypted event is here now (it may come a sync after the event)."""
        content = event.get("content") or {}
        olm = self.client.olm
        sender_key, session_id = content.get("sender_key"), content.get("session_id")
        if olm is None or not isinstance(sender_key, str) or not isinstance(session_id, str):
            return False
        return olm.inbound_group_store.get(room_id, sender_key, session_id) is not None

    def decrypt(self, room_id: str, event: dict[str, Any]) -> dict[str, Any] | Undecryptable:
        """The clear event (the JSON a clear one would be) of an ``m.room.encrypted`` timeline event."""
        content = event.get("content") or {}
        what = Undecryptable(room_id, str(event.get("event_id") or ""), str(event.get("sender") or ""),
                             str(content.get("session_id") or ""), "")  # fmt: skip
        parsed = Event.parse_encrypted_event(event)
        if not isinstance(parsed, MegolmEvent):
            return replace(what, reason=f"not a megolm event ({content.get('algorithm')})")
        parsed.room_id = room_id
        try:
            clear = self.client.decrypt_event(parsed)
        except EncryptionError as exc:
            return replace(what, reason=str(exc))
        except (KeyError, TypeError, ValueError) as exc:  # a decrypted payload nio cannot model
            return replace(what, reason=f"{type(exc).__name__}: {exc}")
        source = getattr(clear, "source", None)
        if not isinstance(source, dict) or "content" not in source or getattr(clear, "decrypted", False) is not True:
            return replace(what, reason=f"the clear event is not readable ({type(clear).__name__})")
        return {**source, "event_id": what.event_id, "sender": what.sender}

    async def room_ready(self, room_id: str) -> None:
        """Make sure nio knows the room before a send (after a restart it may have synced nothing of
        it): encrypted as its store or the room's state says, its members fetched on the first send."""
        client = self.client
        if room_id in client.rooms:
            return
        encrypted = self.encrypted(room_id)
        if not encrypted:
            state = await client.room_get_state_event(room_id, ENCRYPTION_EVENT)
            encrypted = isinstance(getattr(state, "content", None), dict) and bool(state.content.get("algorithm"))
            if encrypted:
                client.encrypted_rooms.add(room_id)
                if client.store is not None:
                    client.store.save_encrypted_rooms({room_id})
        client.rooms[room_id] = MatrixRoom(room_id, client.user_id, encrypted)
