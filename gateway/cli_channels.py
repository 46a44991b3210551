"""``neotask channels status`` and ``neotask channels approve CODE``: through the running daemon's
API when there is one, otherwise on ``<home>/channels.db`` under the home lock (a code approved
offline is honoured when the daemon starts)."""

from __future__ import annotations

import argparse
import asyncio
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from channels.registry import PLATFORMS, configured
from channels.store import ChannelStore
from config.clock import iso, system_clock
from config.errors import PairingCodeNotFound
from gateway import offline
from gateway.tables import table

if TYPE_CHECKING:
    from gateway.cli_context import Context


def add_commands(commands: Any, both: Sequence[argparse.ArgumentParser]) -> None:
    channels = commands.add_parser("channels", help="chat connectors (Telegram, Slack)")
    actions = channels.add_subparsers(dest="action", required=True, metavar="ACTION")
    status = actions.add_parser("status", parents=both, help="each account: connected, last update, errors, in/out")
    status.set_defaults(handler=cmd_status)
    approve = actions.add_parser("approve", parents=both, help="approve a pairing code an unknown sender got")
    approve.add_argument("code")
    approve.set_defaults(handler=cmd_approve)


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


def cmd_approve(ctx: Context) -> int:
    client = ctx.client()
    if client is not None:
        body = client.post("/v1/channels/approve", {"code": ctx.args.code})
    else:
        store = ChannelStore.for_home(ctx.config.home)

        async def work() -> dict[str, Any]:
            try:
                pairing = await store.approve(ctx.args.code, iso(system_clock()))
            finally:
                await store.close()
            if pairing is None:
                raise PairingCodeNotFound(f"no pairing code {ctx.args.code!r} was given out")
            return {"code": pairing.code, "channel": pairing.channel, "account": pairing.account,
                    "sender_id": pairing.sender_id, "sender_name": pairing.sender_name, "approved": True}  # fmt: skip

        body = offline.locked(ctx.config, lambda: asyncio.run(work()))
    if ctx.as_json:
        ctx.print_json(body)
    else:
        who = body["sender_id"] + (f" ({body['sender_name']})" if body.get("sender_name") else "")
        ctx.print(f"approved: {body['channel']} account {body['account']} now takes messages from {who}")
    return 0
