"""``neotask channels status``, ``pairings``, ``approve CODE`` and ``revoke CODE``: through the
running daemon's API when there is one, otherwise on ``<home>/channels.db`` under the home lock (a
code approved offline is honoured when the daemon starts, and the sender told then). A code that
cannot be one is refused before anything is opened, and a home without ``channels.db`` is not
given one."""

from __future__ import annotations

import argparse
import asyncio
from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

from channels.pairing import STATES, Pairing, normalized
from channels.registry import PLATFORMS, configured
from channels.store import ChannelStore
from config.clock import system_clock
from config.errors import PairingCodeNotFound
from gateway import offline
from gateway.tables import table

if TYPE_CHECKING:
    from gateway.cli_context import Context

T = TypeVar("T")


def add_commands(commands: Any, both: Sequence[argparse.ArgumentParser]) -> None:
    channels = commands.add_parser("channels", help=f"chat connectors ({', '.join(p.capitalize() for p in PLATFORMS)})")
    actions = channels.add_subparsers(dest="action", required=True, metavar="ACTION")
    status = actions.add_parser("status", parents=both, help="each account: connected, last update, errors, in/out")
    status.set_defaults(handler=cmd_status)
    pairings = actions.add_parser("pairings", parents=both, help="the pairing codes given: pending, approved, expired")
    pairings.add_argument("--state", choices=STATES, help="only the pairings in this state")
    pairings.set_defaults(handler=cmd_pairings)
    approve = actions.add_parser("approve", parents=both,
                                 help="approve a pairing code an unknown sender got (and tell them so)")
    approve.add_argument("code")
    approve.set_defaults(handler=cmd_approve)
    revoke = actions.add_parser("revoke", parents=both, help="forget the sender of a pairing code, approved or pending")
    revoke.add_argument("code")
    revoke.set_defaults(handler=cmd_revoke)


def cmd_status(ctx: Context) -> int:
    client = ctx.client()
    if client is not None:
        body = client.get("/v1/channels")
        running = True
    else:
        running = False
        body = {"accounts": [
            {"channel": platform.name, "account": name, "agent": a.agent, "mode": a.mode, "enabled": a.enabled,
             "connected": False, "username": None, "last_update_at": None,
             "last_error": "no gateway running", "messages_in": 0, "messages_out": 0}
            for platform, name, a in configured(ctx.config.settings.channels)
        ]}  # fmt: skip
    if ctx.as_json:
        ctx.print_json(body)
        return 0
    accounts = body["accounts"]
    if not accounts:
        ctx.print(f"no chat channel accounts configured (channels.<{'|'.join(PLATFORMS)}>.accounts)")
        return 0
    header = ("CHANNEL", "ACCOUNT", "AGENT", "STATE", "BOT", "LAST UPDATE", "IN", "OUT", "LAST ERROR")
    rows = [
        (a["channel"], a["account"], a["agent"], _state(a), f"@{a['username']}" if a.get("username") else "-",
         a.get("last_update_at") or "-", str(a["messages_in"]), str(a["messages_out"]), a.get("last_error") or "-")
        for a in accounts
    ]  # fmt: skip
    ctx.print(table(header, rows))
    if not running:
        ctx.print("(no gateway running: the accounts are not connected)")
    return 0


def _state(account: dict[str, Any]) -> str:
    if not account.get("enabled", True):
        return "disabled"
    return "connected" if account.get("connected") else "not connected"


def _on_store(ctx: Context, work: Callable[[ChannelStore], Awaitable[T]]) -> T:
    """``work`` on ``<home>/channels.db`` under the home lock (no daemon runs)."""
    store = ChannelStore.for_home(ctx.config.home)

    async def run() -> T:
        try:
            return await work(store)
        finally:
            await store.close()

    return offline.locked(ctx.config, lambda: asyncio.run(run()))


def _no_code(ctx: Context, code: str) -> PairingCodeNotFound | None:
    """Not found without opening (and so creating) ``channels.db`` when the home has none."""
    if ChannelStore.for_home(ctx.config.home).path.exists():
        return None
    return PairingCodeNotFound(f"no pairing code {code.strip()!r} was given out: this home has no channels.db yet")


def cmd_pairings(ctx: Context) -> int:
    client = ctx.client()
    if client is not None:
        query = f"?state={ctx.args.state}" if ctx.args.state else ""
        body = client.get(f"/v1/channels/pairings{query}")
    else:
        found: list[Pairing] = []
        if ChannelStore.for_home(ctx.config.home).path.exists():
            found = _on_store(ctx, lambda store: store.pairings())
        now = system_clock()
        listed = [p.as_json(now) for p in found]
        body = {"pairings": [p for p in listed if ctx.args.state in (None, p["state"])]}
    if ctx.as_json:
        ctx.print_json(body)
        return 0
    if not body["pairings"]:
        ctx.print("no pairing codes" + (f" {ctx.args.state}" if ctx.args.state else "") + " (dm_policy: pairing gives"
                  " one to each unknown sender)")  # fmt: skip
        return 0
    header = ("CODE", "STATE", "CHANNEL", "ACCOUNT", "SENDER", "NAME", "GIVEN", "EXPIRES")
    rows = [(p["code"], p["state"], p["channel"], p["account"], p["sender_id"], p.get("sender_name") or "-",
             p["created_at"], "-" if p["state"] == "approved" else p.get("expires_at") or "-")
            for p in body["pairings"]]  # fmt: skip
    ctx.print(table(header, rows))
    return 0


def _decide(ctx: Context, action: str, offline: Callable[[ChannelStore], Awaitable[dict[str, Any]]]) -> dict[str, Any]:
    """Approve or revoke ``ctx.args.code``: through the running daemon's API (``/v1/channels/<action>``),
    or, with none, ``offline`` on ``channels.db`` under the home lock. The pairing's body either way."""
    normalized(ctx.args.code)  # refused before anything is opened
    client = ctx.client()
    if client is not None:
        body: dict[str, Any] = client.post(f"/v1/channels/{action}", {"code": ctx.args.code})
        return body
    if (missing := _no_code(ctx, ctx.args.code)) is not None:
        raise missing
    return _on_store(ctx, offline)


def cmd_approve(ctx: Context) -> int:
    async def approve(store: ChannelStore) -> dict[str, Any]:
        pairing = await store.approve(ctx.args.code, system_clock())
        return {**pairing.as_json(system_clock()), "notified": pairing.welcomed_at is not None}

    body = _decide(ctx, "approve", approve)
    if ctx.as_json:
        ctx.print_json(body)
        return 0
    who = body["sender_id"] + (f" ({body['sender_name']})" if body.get("sender_name") else "")
    ctx.print(f"approved: {body['channel']} account {body['account']} now takes messages from {who}")
    if not body["notified"]:
        ctx.print("(they are told through the channel when the account next starts)")
    return 0


def cmd_revoke(ctx: Context) -> int:
    async def revoke(store: ChannelStore) -> dict[str, Any]:
        return {**(await store.revoke(ctx.args.code)).as_json(system_clock()), "revoked": True}

    body = _decide(ctx, "revoke", revoke)
    if ctx.as_json:
        ctx.print_json(body)
        return 0
    who = body["sender_id"] + (f" ({body['sender_name']})" if body.get("sender_name") else "")
    ctx.print(f"revoked: {body['channel']} account {body['account']} no longer takes direct messages from {who}"
              f" (code {body['code']}, was {body['state']})")  # fmt: skip
    return 0
